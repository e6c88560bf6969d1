//! The store both conformance suites (one server, a cluster) run against.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::Store;
use ratewarden_redis::RedisStore;
use ratewarden_test_support::redis as fixture;

/// A store on `url` whose keys are under a prefix of its own, made from
/// `what`, so that scenarios sharing a server never see each other's keys.
pub fn suite_store(url: &str, what: &str) -> Arc<dyn Store> {
    let store = RedisStore::builder(url)
        .key_prefix(fixture::unique_prefix(what))
        // The suite tests semantics, not latency: a loaded CI machine must
        // not turn a slow answer into a failed scenario.
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a valid Redis URL");
    Arc::new(store)
}
