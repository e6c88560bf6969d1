//! The Redis store against the reference model (`ratewarden_conformance::model`)
//! on random scripts of requests, keys, costs and clock moves (backwards
//! included): identical decisions. Fewer cases than the memory store, since
//! each request is a round trip; every case has its own key prefix on the
//! shared server.

use std::time::Duration;

use proptest::prelude::*;
use ratewarden_redis::RedisStore;
use ratewarden_test_support::redis as fixture;
use ratewarden_test_support::strategy::{policies, replay_case, steps};

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn redis_store_agrees_with_model(policies in policies(), steps in steps(4, 100)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // Keys expire in real time (garbage collection only); the longest
        // margin keeps a manual-clock script's keys alive for its whole run.
        let store = RedisStore::builder(fixture::shared_url())
            .key_prefix(fixture::unique_prefix("model"))
            .expiry_margin(Duration::from_secs(3600))
            // Semantics, not latency: not the quarter-second default.
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a valid Redis URL");
        replay_case(&rt, &store, &policies, &steps, |k| format!("client:{k}").into_bytes())?;
    }
}
