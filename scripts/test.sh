#!/usr/bin/env bash
# The whole test suite, containers included: the command the README gives
# and the one CI runs.
#
#   scripts/test.sh            build missing test images, then run every test
#   scripts/test.sh -E 'package(ratewarden-memory)'   extra arguments go to nextest
#
# Redis and Postgres tests start their own containers with testcontainers
# from the official images, or from local ones built from Debian packages
# where no registry is reachable (scripts/build-test-images.sh). Point them elsewhere
# with RATEWARDEN_REDIS_URL / RATEWARDEN_POSTGRES_URL (an existing server) or
# RATEWARDEN_REDIS_IMAGE / RATEWARDEN_POSTGRES_IMAGE (another image).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1; then
    echo "error: the Docker engine is not reachable; the Redis and Postgres suites need it." >&2
    echo "       Start Docker (e.g. 'systemctl start docker' or 'dockerd &') and run this again." >&2
    exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "error: cargo-nextest is missing: install it with 'cargo install cargo-nextest --locked'." >&2
    exit 1
fi

scripts/build-test-images.sh

# Every fixture container is removed when its test process exits; this
# sweeps what a killed run may leave, and only this run's containers (the
# fixtures label them with RATEWARDEN_TEST_RUN), never another run's on the
# same machine.
export RATEWARDEN_TEST_RUN="${RATEWARDEN_TEST_RUN:-$$-$(date +%s)}"
cleanup() {
    local ids
    ids=$(docker ps -aq --filter "label=ratewarden.test.run=$RATEWARDEN_TEST_RUN" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -n "${ids// /}" ] && docker rm -f $ids >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "== tests: the whole workspace, every feature"
cargo nextest run --workspace --all-features --no-fail-fast "$@"
cargo test --workspace --all-features --doc

# Arguments select tests of the run above; the feature sets below are the
# whole suite's, run when no selection is given.
[ $# -eq 0 ] || exit 0

# Every feature set the README advertises, each its own build: a test
# written for a build without a feature (a URL scheme refused for want of
# it, TLS modes without `tls`, the HTTP tests on a map store without
# `memory`) exists only there, and each build lists what it compiled out
# as skipped tests (tests/compiled_out.rs).
for features in "" "--no-default-features --features memory" \
    "--no-default-features --features redis" "--no-default-features --features postgres" \
    "--no-default-features"; do
    echo "== tests: ratewarden ${features:-(default features)}"
    # shellcheck disable=SC2086
    cargo nextest run -p ratewarden $features --no-fail-fast
done
echo "== tests: ratewarden-core, ratewarden-redis, ratewarden-postgres (default features: no metrics, serde or tls)"
cargo nextest run -p ratewarden-core -p ratewarden-redis -p ratewarden-postgres --no-fail-fast

# The chaos soak, short: the demo binary tiered on Redis and on Postgres
# under steady load while its store is paused, restarted and delayed; it
# fails on a 5xx, a hang, an admission over the limit, a recovery that is
# not exact or memory that grows (benches/chaos.rs; BENCHMARKS.md has a
# longer run).
echo "== chaos soak: the demo while its Redis and then its Postgres are paused, restarted and delayed"
cargo test -p ratewarden-demo --features redis,postgres --bench chaos -- --phase-seconds 14
