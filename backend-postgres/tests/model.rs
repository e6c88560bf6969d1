//! The Postgres store against the reference model
//! (`limiter_conformance::model`) on random scripts of requests, keys, costs
//! and clock moves (backwards included): identical decisions. Fewer cases
//! than the memory store, since each request is a statement; one schema per
//! test, and every case has its own keys in it.

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
