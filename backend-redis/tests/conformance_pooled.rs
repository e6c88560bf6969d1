//! The conformance suite against the pooled (deadpool-redis) variant, kept
//! behind the `deadpool` feature for the benchmark that compares it with the
//! multiplexed connection.
#![cfg(feature = "deadpool")]

use std::sync::Arc;
use std::time::Duration;

use limiter_core::Store;
use limiter_redis::RedisStore;
use limiter_test_support::redis as fixture;

async fn store() -> Arc<dyn Store> {
    let store = RedisStore::builder(fixture::shared_url())
        .key_prefix(fixture::unique_prefix("pooled"))
        // The suite tests semantics, not latency: a loaded CI machine must
        // not turn a slow answer into a failed scenario.
        .timeout(Duration::from_secs(10))
        .pooled(16)
        .build()
        .expect("a valid Redis URL");
    Arc::new(store)
}

limiter_conformance::conformance_tests!(store);
