//! The Redis store against the reference model (`limiter_conformance::model`)
//! on random scripts of requests, keys, costs and clock moves (backwards
//! included): identical decisions. Fewer cases than the memory store, since
//! each request is a round trip; every case has its own key prefix on the
//! shared server.

mod common;

use std::time::Duration;

use limiter_conformance::limiter_core::{Algorithm, ManualClock, Policy};
use limiter_conformance::model::{Step, replay};
use limiter_redis::RedisStore;
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn redis_store_agrees_with_model(policies in policies(), steps in steps()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Keys expire in real time (garbage collection only); the longest
        // margin keeps a manual-clock script's keys alive for its whole run.
        let store = RedisStore::builder(common::shared_url())
            .key_prefix(common::unique_prefix("model"))
            .expiry_margin(Duration::from_secs(3600))
            .build()
            .expect("a valid Redis URL");
        let result = rt.block_on(replay(
            &store,
            &policies,
            &steps,
            |k| format!("client:{k}").into_bytes(),
            ManualClock::DEFAULT_START,
        ));
        if let Err(failure) = result {
            return Err(TestCaseError::fail(failure.0));
        }
    }
}
