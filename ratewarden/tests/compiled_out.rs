//! What a build without some of this crate's features leaves out of its
//! tests, said in the test run itself.
//!
//! Tests that need a feature are compiled only with it, so a plain `cargo
//! test` (the default features) would otherwise report success without a
//! word about the fault, fleet and scorecard tests it never built. Each
//! test below exists only in a build that lacks what it names, never runs,
//! and carries the reason: `cargo test` prints it beside the name, nextest
//! counts it as skipped. `scripts/test.sh` runs every feature set.

#[cfg(not(all(feature = "memory", feature = "redis")))]
#[test]
#[ignore = "tests/faults.rs on Redis needs the memory and redis features: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn faults_on_redis_compiled_out() {}

#[cfg(not(all(feature = "memory", feature = "postgres")))]
#[test]
#[ignore = "tests/faults.rs on PostgreSQL needs the memory and postgres features: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn faults_on_postgres_compiled_out() {}

#[cfg(not(all(feature = "memory", feature = "redis", feature = "postgres")))]
#[test]
#[ignore = "tests/fleet_bound.rs needs the memory, redis and postgres features: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn fleet_bound_compiled_out() {}

#[cfg(not(feature = "redis"))]
#[test]
#[ignore = "the Redis URL cases of tests/fuzz_regressions.rs need the redis feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn redis_fuzz_regressions_compiled_out() {}

#[cfg(not(feature = "memory"))]
#[test]
#[ignore = "the memory-store refund case of tests/http_builder.rs needs the memory feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn memory_refund_case_compiled_out() {}

#[cfg(not(feature = "redis"))]
#[test]
#[ignore = "the Redis cases of tests/count_only.rs and tests/plans.rs need the redis feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn redis_count_only_and_plans_compiled_out() {}

#[cfg(not(feature = "postgres"))]
#[test]
#[ignore = "the PostgreSQL case of tests/plans.rs needs the postgres feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn postgres_plans_compiled_out() {}

#[cfg(not(feature = "redis"))]
#[test]
#[ignore = "tests/fleet_outbound.rs needs the redis feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn fleet_outbound_compiled_out() {}

#[cfg(not(feature = "grpc"))]
#[test]
#[ignore = "tests/grpc.rs needs the grpc feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn grpc_compiled_out() {}

#[cfg(not(feature = "reqwest"))]
#[test]
#[ignore = "tests/outbound_reqwest.rs needs the reqwest feature: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn outbound_reqwest_compiled_out() {}

#[cfg(not(all(feature = "config", feature = "memory", feature = "axum")))]
#[test]
#[ignore = "tests/config.rs needs the config, memory and axum features: \
            cargo test -p ratewarden --all-features, or scripts/test.sh"]
fn config_compiled_out() {}
