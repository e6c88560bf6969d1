//! The conformance suite against the pooled (deadpool-redis) variant, kept
//! behind the `deadpool` feature for the benchmark that compares it with the
//! multiplexed connection.
#![cfg(feature = "deadpool")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use limiter_core::Store;
use limiter_redis::RedisStore;

async fn store() -> Arc<dyn Store> {
    let store = RedisStore::builder(common::shared_url())
        .key_prefix(common::unique_prefix("pooled"))
        // The suite tests semantics, not latency: a loaded CI machine must
        // not turn a slow answer into a failed scenario.
        .timeout(Duration::from_secs(10))
        .pooled(16)
        .build()
        .expect("a valid Redis URL");
    Arc::new(store)
}

limiter_conformance::conformance_tests!(store);
