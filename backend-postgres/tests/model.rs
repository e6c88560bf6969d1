//! The Postgres store against the reference model
//! (`limiter_conformance::model`) on random scripts of requests, keys, costs
//! and clock moves (backwards included): identical decisions. Fewer cases
//! than the memory store, since each request is a statement; one schema per
//! test, and every case has its own keys in it. Refunds, which the model
//! does not replay, are checked against `limiter_core::algorithm::refund`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use limiter_conformance::limiter_core::{Algorithm, ManualClock, Policy};
use limiter_conformance::model::{Step, replay};
use proptest::prelude::*;

fn policy(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    (1u32..=6, 1_000u64..=20_000).prop_map(move |(limit, window_us)| {
        Policy::new(algorithm, limit, Duration::from_micros(window_us))
            .expect("small policies are valid")
    })
}

fn policies() -> impl Strategy<Value = [Policy; 4]> {
    (
        policy(Algorithm::SlidingLog),
        policy(Algorithm::FixedWindow),
        policy(Algorithm::SlidingWindow),
        policy(Algorithm::Gcra),
    )
        .prop_map(|(a, b, c, d)| [a, b, c, d])
}

fn advance() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        4 => 0i64..=3_000,
        2 => 0i64..=45_000,
        1 => -25_000i64..=0,
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u8..4, 0usize..4, 0u32..6, advance()).prop_map(|(key, policy, cost, advance_us)| Step {
            key,
            policy,
            cost,
            advance_us,
        }),
        1..100,
    )
}

#[test]
fn postgres_store_agrees_with_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(common::fresh_store("model"));
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(policies in policies(), steps in steps())| {
        // A fresh namespace per case (shrinking included) in the one schema.
        let n = case.fetch_add(1, Ordering::Relaxed);
        let result = rt.block_on(replay(
            &store,
            &policies,
            &steps,
            |k| format!("case{n}:client:{k}").into_bytes(),
            ManualClock::DEFAULT_START,
        ));
        if let Err(failure) = result {
            return Err(TestCaseError::fail(failure.0));
        }
    });
}

/// A small deterministic generator, so a failure reproduces.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

/// Refunds against `limiter_core::algorithm::refund` (the model replays
/// decisions only): decisions interleaved with refunds of earlier
/// admissions, each at most once, in any order, some long after the fact.
/// The store and the core must leave every key in the same state, as the
/// decisions that follow show.
#[test]
fn postgres_refunds_agree_with_the_core() {
    use limiter_conformance::limiter_core::algorithm::{apply, refund};
    use limiter_conformance::limiter_core::{Decision, Store, Timestamp};

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = rt.block_on(common::fresh_store("refund_model"));
    let t0 = ManualClock::DEFAULT_START.as_micros();
    let shapes: [(u32, Duration); 4] = [
        (1, Duration::from_millis(1)),
        (3, Duration::from_millis(7)),
        (10, Duration::from_secs(1)),
        (7, Duration::from_micros(1_000_003)),
    ];
    let mut rng = Lcg(7);
    let (mut decisions, mut refunds) = (0, 0);
    rt.block_on(async {
        for algorithm in Algorithm::ALL {
            for (i, (limit, window)) in shapes.iter().enumerate() {
                let p = Policy::new(algorithm, *limit, *window).unwrap();
                let key = format!("{algorithm}-{i}");
                let mut state = None;
                let mut admitted: Vec<(u64, u32, Decision)> = Vec::new();
                let w = p.window_micros();
                let mut now = t0 + rng.next(w);
                for step in 0..150 {
                    if !admitted.is_empty() && rng.next(3) == 0 {
                        let pick = rng.next(admitted.len() as u64) as usize;
                        let (at, cost, d) = admitted.swap_remove(pick);
                        let reset_after = d.reset_after.as_micros() as u64;
                        refund(&mut state, &p, cost, at, reset_after);
                        store
                            .refund(key.as_bytes(), &p, cost, Timestamp::from_micros(at), &d)
                            .await
                            .unwrap();
                        refunds += 1;
                        continue;
                    }
                    now = match rng.next(20) {
                        0 => now.saturating_sub(rng.next(w)),
                        1 => now + w + rng.next(2 * w),
                        _ => now + rng.next(w / 4 + 1),
                    };
                    let cost = 1 + rng.next(u64::from(*limit).min(4)) as u32;
                    let expected =
                        Decision::from_verdict(apply(&mut state, &p, cost, now), &p, "postgres");
                    let got = store
                        .decide(key.as_bytes(), &p, cost, Timestamp::from_micros(now))
                        .await
                        .unwrap();
                    assert_eq!(got, expected, "{p}, step {step}, cost {cost}, now {now}");
                    if got.allowed {
                        admitted.push((now, cost, got));
                    }
                    decisions += 1;
                }
            }
        }
    });
    assert!(refunds > 200, "{refunds} refunds");
    assert!(decisions > 800, "{decisions} decisions");
}
