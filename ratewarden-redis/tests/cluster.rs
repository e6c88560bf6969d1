//! The whole conformance suite against a three-master Redis Cluster, nodes
//! on loopback ports with host networking, joined by `redis-cli --cluster
//! create`.

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

/// The composition scenarios that attack local state in front of a shared
/// store (refusal caches, leases) after a give-back or a reset, with the
/// cluster as the shared tier; the whole composition suite runs on one
/// server in `conformance.rs`.
mod composition {
    use super::*;

    #[test]
    fn give_back_reaches_local_state() {
        ratewarden_conformance::__private::run_composition_test(
            "give_back_reaches_local_state",
            store,
        );
    }

    #[test]
    fn reset_reaches_local_state() {
        ratewarden_conformance::__private::run_composition_test("reset_reaches_local_state", store);
    }

    #[test]
    fn refusal_racing_a_give_back_not_cached() {
        ratewarden_conformance::__private::run_composition_test(
            "refusal_racing_a_give_back_not_cached",
            store,
        );
    }
}
