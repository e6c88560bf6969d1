//! The whole conformance suite against one Redis server in a container
//! (or `LIMITER_REDIS_URL`), each scenario's stores isolated by a unique key
//! prefix.

use std::sync::Arc;
use std::time::Duration;

use limiter_core::Store;
use limiter_redis::RedisStore;
use limiter_test_support::redis as fixture;

async fn store() -> Arc<dyn Store> {
    let store = RedisStore::builder(fixture::shared_url())
        .key_prefix(fixture::unique_prefix("conformance"))
        // The suite tests semantics, not latency: a loaded CI machine must
        // not turn a slow answer into a failed scenario.
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a valid Redis URL");
    Arc::new(store)
}

limiter_conformance::conformance_tests!(store);

/// The composition scenarios with this store as the shared tier.
mod composition {
    use super::*;

    limiter_conformance::composition_tests!(store);
}
