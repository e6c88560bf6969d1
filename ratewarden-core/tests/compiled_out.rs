//! What a build without some of this crate's features leaves out of its
//! tests, said in the test run itself.
//!
//! Tests that need a feature are compiled only with it, so a plain `cargo
//! test` would otherwise report success without a word about them. Each
//! test below exists only in a build that lacks what it names, never runs,
//! and carries the reason: `cargo test` prints it beside the name, nextest
//! counts it as skipped. `scripts/test.sh` runs every feature set.

#[cfg(not(feature = "metrics"))]
#[test]
#[ignore = "tests/metrics.rs needs the metrics feature: \
            cargo test -p ratewarden-core --all-features, or scripts/test.sh"]
fn metrics_compiled_out() {}

#[cfg(not(feature = "serde"))]
#[test]
#[ignore = "the serde cases of src/policy/parse.rs need the serde feature: \
            cargo test -p ratewarden-core --all-features, or scripts/test.sh"]
fn serde_policy_cases_compiled_out() {}
