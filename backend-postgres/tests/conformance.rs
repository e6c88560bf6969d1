//! The whole conformance suite against PostgreSQL in a container, each
//! scenario in a schema of its own.

mod common;

use std::sync::Arc;

use limiter_core::Store;

async fn store() -> Arc<dyn Store> {
    Arc::new(common::fresh_store("conformance").await)
}

limiter_conformance::conformance_tests!(store);

/// The composition scenarios with this store as the shared tier.
mod composition {
    use super::*;

    limiter_conformance::composition_tests!(store);
}
