//! The reference store through the macro, exactly as a third-party backend
//! would run the suite.

use std::sync::Arc;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::ratewarden_core::Store;

async fn store() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(1_000))
}

ratewarden_conformance::conformance_tests!(store);

/// The macro accepts a closure too, and can be used in several modules.
mod two_algorithms {
    use super::*;
    use ratewarden_conformance::ratewarden_core::Algorithm;

    ratewarden_conformance::conformance_tests!(|| async {
        Arc::new(ReferenceStore::with_algorithms(
            &[Algorithm::FixedWindow, Algorithm::Gcra],
            64,
        )) as Arc<dyn Store>
    });
}
