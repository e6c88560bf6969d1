//! The whole `ratewarden-conformance` suite against the memory store.

use std::sync::Arc;

use ratewarden_core::Store;
use ratewarden_memory::MemoryStore;

async fn store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(1_000))
}
ratewarden_conformance::conformance_tests!(store);
