//! Policy construction with arbitrary numbers, then a few requests at
//! realistic times: construction either refuses with an error or yields a
//! policy whose every request is decided without panicking, within its
//! limit, and exactly as the reference model decides.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ratewarden_conformance::model::Model;
use ratewarden_core::{Algorithm, Policy, Timestamp, algorithm};

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, slot) in b.iter_mut().enumerate() {
        *slot = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 21 {
        return;
    }
    let algorithm = Algorithm::ALL[usize::from(data[0] % 4)];
    let limit = u32::try_from(u64_at(data, 1) & 0xFFFF_FFFF).unwrap_or(u32::MAX);
    let secs = u64_at(data, 5);
    let nanos = u32::try_from(u64_at(data, 13) & 0xFFFF_FFFF).unwrap_or(0) % 1_000_000_000;
    // Small numbers are the interesting ones; let the fuzzer reach them.
    let (limit, secs) = if data[0] & 0x80 != 0 {
        (limit % 20_000, secs % 40_000_000)
    } else {
        (limit, secs)
    };
    let policy = match Policy::new(algorithm, limit, Duration::new(secs, nanos)) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert_eq!(policy.limit(), limit);
    assert!(policy.emission_interval_micros() >= 1 || algorithm != Algorithm::Gcra);
    let _ = policy.to_string();

    // Requests at realistic times (2026 ± a few windows), costs from the
    // rest of the input, including invalid ones.
    let mut state = None;
    let mut model = Model::new();
    let mut now: u64 = 1_767_225_600_000_000;
    let w = policy.window_micros();
    for chunk in data[21..].chunks(5) {
        let cost = u32::from(chunk[0]) | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8);
        let step = u64::from(*chunk.get(2).unwrap_or(&0)) * w / 64;
        match chunk.get(3).copied().unwrap_or(0) % 4 {
            0 => now = now.saturating_sub(step),
            _ => now = now.saturating_add(step),
        }
        let verdict = algorithm::apply(&mut state, &policy, cost, now);
        match model.decide(b"k", &policy, cost, Timestamp::from_micros(now)) {
            Err(_) => {
                assert!(policy.validate_cost(cost).is_err());
                assert!(!verdict.allowed);
            }
            Ok(expected) => {
                assert!(verdict.remaining <= limit);
                assert_eq!(
                    expected.allowed, verdict.allowed,
                    "{policy} cost {cost} at {now}"
                );
                assert_eq!(expected.remaining, verdict.remaining);
                assert_eq!(
                    expected.retry_after.as_micros(),
                    u128::from(verdict.retry_after_us)
                );
                assert_eq!(
                    expected.reset_after.as_micros(),
                    u128::from(verdict.reset_after_us)
                );
            }
        }
    }
});
