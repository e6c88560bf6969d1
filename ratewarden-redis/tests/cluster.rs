//! The whole conformance suite, store and composition scenarios, against a
//! three-master Redis Cluster, nodes on loopback ports with host networking,
//! joined by `redis-cli --cluster create`.

mod common;

use std::sync::{Arc, LazyLock};

use ratewarden_core::Store;
use ratewarden_test_support::redis as fixture;

fn cluster_url() -> &'static str {
    static URL: LazyLock<String> = LazyLock::new(|| {
        if let Ok(url) = std::env::var("RATEWARDEN_REDIS_CLUSTER_URL") {
            return url;
        }
        fixture::start_shared("the Redis Cluster", fixture::start_cluster)
    });
    &URL
}

async fn store() -> Arc<dyn Store> {
    common::suite_store(cluster_url(), "cluster")
}

ratewarden_conformance::conformance_tests!(store);
