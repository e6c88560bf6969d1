//! The whole `limiter-conformance` suite against the memory store.

use std::sync::Arc;

use limiter_core::Store;
use limiter_memory::MemoryStore;

async fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(1_000))
}
limiter_conformance::conformance_tests!(store);

/// The composition scenarios with a memory store as the shared tier.
mod composition {
    use super::*;

    limiter_conformance::composition_tests!(store);
}
