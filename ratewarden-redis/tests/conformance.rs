//! The whole conformance suite against one Redis server in a container
//! (or `RATEWARDEN_REDIS_URL`), each scenario's stores isolated by a unique key
//! prefix.

mod common;

use std::sync::Arc;

use ratewarden_core::Store;
use ratewarden_test_support::redis as fixture;

async fn store() -> Arc<dyn Store> {
    common::suite_store(fixture::shared_url(), "conformance")
}

ratewarden_conformance::conformance_tests!(store);
