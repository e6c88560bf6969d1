//! The `Store` docs' example store, `ratewarden_core::example::MapStore`,
//! which implements only the trait's required methods, against the whole
//! conformance suite: what the compiler requires of a store is what the
//! contract requires.

use std::sync::Arc;

use ratewarden_core::Store;
use ratewarden_core::example::MapStore;

async fn store() -> Arc<dyn Store> {
    Arc::new(MapStore::default())
}
ratewarden_conformance::conformance_tests!(store);
