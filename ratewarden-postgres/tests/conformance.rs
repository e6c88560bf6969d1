//! The whole conformance suite against PostgreSQL in a container, each
//! scenario in a schema of its own.

use std::sync::Arc;

use ratewarden_core::Store;
use ratewarden_test_support::postgres as fixture;

async fn store() -> Arc<dyn Store> {
    Arc::new(fixture::fresh_store("conformance").await)
}

ratewarden_conformance::conformance_tests!(store);
