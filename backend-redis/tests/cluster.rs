//! The whole conformance suite against a three-master Redis Cluster, nodes
//! on loopback ports with host networking, joined by `redis-cli --cluster
//! create`.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use limiter_core::Store;
use limiter_redis::RedisStore;
use limiter_test_support::redis as fixture;

fn cluster_url() -> &'static str {
    static URL: LazyLock<String> = LazyLock::new(|| {
        if let Ok(url) = std::env::var("LIMITER_REDIS_CLUSTER_URL") {
            return url;
        }
        fixture::start_shared("the Redis Cluster", fixture::start_cluster)
    });
    &URL
}

async fn store() -> Arc<dyn Store> {
    let store = RedisStore::builder(cluster_url())
        .key_prefix(fixture::unique_prefix("cluster"))
        // The suite tests semantics, not latency: a loaded CI machine must
        // not turn a slow answer into a failed scenario.
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a valid cluster URL");
    Arc::new(store)
}

limiter_conformance::conformance_tests!(store);
