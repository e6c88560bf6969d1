//! `distinct_key_flood`: pushing harder must never earn an offender a fresh
//! quota.

use ratewarden_core::Algorithm;

use crate::support::{MS, Probe, S, T0, dur, evidence, fail, micros, num, policy, rel};
use crate::{ScenarioResult, StoreFactory};

/// Attacker keys for a store with no key capacity.
const UNBOUNDED_FLOOD: usize = 2_000;
/// The offender retries every this many attacker keys on such a store.
const UNBOUNDED_PROBE_EVERY: usize = 100;
/// The largest key capacity the scenario floods (three times over): a store
/// that declares more is refused with a message rather than flooded for
/// hours, or with an overflow.
const LARGEST_CHECKED_CAPACITY: usize = 1_000_000;

pub(crate) async fn distinct_key_flood(factory: &dyn StoreFactory) -> ScenarioResult {
    const WINDOW: u64 = 3_600 * S;
    let first = Probe::new(factory).await?;
    let (algorithms, skipped) = first.supported(&Algorithm::ALL);
    let capacity = first.store.capabilities().key_capacity;
    if let Some(cap) = capacity.filter(|&cap| cap > LARGEST_CHECKED_CAPACITY) {
        return fail(format!(
            "the {} store declares a key capacity of {} keys (Capabilities::key_capacity); the \
             scenario floods three times the capacity and checks at most {}: declare the real \
             bound, or none for a store whose keys expire on their own",
            first.store.name(),
            num(cap as u64),
            num(LARGEST_CHECKED_CAPACITY as u64)
        ));
    }
    let (flood, every) = match capacity {
        Some(cap) => (cap.saturating_mul(3).max(3), (cap / 8).max(1)),
        None => (UNBOUNDED_FLOOD, UNBOUNDED_PROBE_EVERY),
    };
    let requests = (flood + flood / every + 1) as u64;
    // Nothing may expire naturally: the whole flood fits in 10 minutes, well
    // inside the hour and inside GCRA's 12-minute emission interval
    // (1 hour / 5), with at most 1 ms per request.
    let step = (600 * S / requests).clamp(1, MS);
    let mut parts = Vec::new();
    let mut first = Some(first);
    for algorithm in algorithms {
        // Each algorithm gets a store of its own, so that its flood alone
        // fills the capacity.
        let probe = match first.take() {
            Some(p) => p,
            None => Probe::new(factory).await?,
        };
        let p = policy(algorithm, 5, WINDOW)?;
        let offender = b"flood/offender";
        probe.at(0);
        for i in 0..5 {
            let d = probe.hit(offender, &p, 1).await?;
            if !d.allowed {
                return fail(format!(
                    "{algorithm}: the offender's request {} of 5 on a fresh key was refused",
                    i + 1
                ));
            }
        }
        let mut at = 0;
        let mut probes = 0u64;
        for i in 0..=flood {
            if i % every == 0 || i == flood {
                at += step;
                probe.at(at);
                let d = probe.hit(offender, &p, 1).await?;
                probes += 1;
                if d.allowed {
                    return fail(format!(
                        "{algorithm}: the offender (5 admitted at t0, limit 5 per hour) was \
                         admitted at {} after {} fresh attacker keys{}: the flood evicted or \
                         reset its state",
                        rel(T0 + at),
                        num(i as u64),
                        capacity
                            .map(|c| format!(" (store capacity {})", num(c as u64)))
                            .unwrap_or_default()
                    ));
                }
                // The log and the fixed window say exactly when: an hour
                // after t0.
                let exact = matches!(algorithm, Algorithm::SlidingLog | Algorithm::FixedWindow);
                if exact && micros(d.retry_after) != WINDOW - at {
                    return fail(format!(
                        "{algorithm}: the offender at {} after {} attacker keys was told \
                         retry_after {}; it must be {} (t0 + 1 hour)",
                        rel(T0 + at),
                        num(i as u64),
                        dur(micros(d.retry_after)),
                        dur(WINDOW - at)
                    ));
                }
            }
            if i == flood {
                break;
            }
            at += step;
            probe.at(at);
            let attacker = format!("flood/attacker-{i}");
            let d = probe.hit(attacker.as_bytes(), &p, 1).await?;
            if !d.allowed {
                return fail(format!(
                    "{algorithm}: attacker key #{i}, never seen before, was refused: \
                     keys share state"
                ));
            }
        }
        parts.push(format!(
            "{algorithm}: offender refused {probes}/{probes} times during a flood of {} fresh keys \
             ({}, offender retrying every {} keys)",
            num(flood as u64),
            capacity
                .map(|c| format!("store capacity {}", num(c as u64)))
                .unwrap_or_else(|| "unbounded store".to_string()),
            num(every as u64)
        ));
    }
    parts.extend(skipped);
    if capacity.is_some() {
        parts.push(
            "the key count is not visible through Store: the backend's own tests must check it \
             never exceeds the capacity"
                .to_string(),
        );
    }
    evidence(parts)
}
