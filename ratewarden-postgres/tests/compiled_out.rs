//! What a build without the `tls` feature leaves out of this crate's
//! tests, said in the test run itself.
//!
//! The TLS tests are compiled only with the feature, so a plain `cargo
//! test` would otherwise report success without a word about them. The
//! test below exists only in a build without it, never runs, and carries
//! the reason: `cargo test` prints it beside the name, nextest counts it as
//! skipped. `scripts/test.sh` runs both builds.

#[cfg(not(feature = "tls"))]
#[test]
#[ignore = "tests/tls.rs needs the tls feature: \
            cargo test -p ratewarden-postgres --features tls, or scripts/test.sh"]
fn tls_compiled_out() {}
