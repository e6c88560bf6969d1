//! The `Store` docs' example store (`src/store/example.rs`), which
//! implements only the trait's required methods, against the whole
//! conformance suite: what the compiler requires of a store is what the
//! contract requires.

use std::sync::Arc;

use ratewarden_core::Store;

#[path = "../src/store/example.rs"]
mod example;
use example::MapStore;

async fn store() -> Arc<dyn Store> {
    Arc::new(MapStore::default())
}
ratewarden_conformance::conformance_tests!(store);
