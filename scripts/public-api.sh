#!/usr/bin/env bash
# The public API of every published crate, as checked-in listings in api/.
#
#   scripts/public-api.sh           regenerate api/*.txt (commit the change)
#   scripts/public-api.sh --check   fail, showing the diff, if they differ
#
# A change to the public API (a `Store` method, a builder option, a field)
# then shows in review as a diff of api/<crate>.txt. The listing comes from
# rustdoc's JSON output, which is unstable: RUSTC_BOOTSTRAP=1 enables it on
# the stable toolchain (as scripts/fuzz.sh does for cargo-fuzz), with no
# extra tool to install; scripts/public_api.py turns it into sorted lines.
# It costs one rustdoc run per crate (seconds each).
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
[ "${1:-}" = "--check" ] && check=true

target="${CARGO_TARGET_DIR:-target}"
out=api
$check && out=$(mktemp -d)
mkdir -p "$out"

status=0
for pair in ratewarden-core:ratewarden_core ratewarden-memory:ratewarden_memory \
    ratewarden-redis:ratewarden_redis ratewarden-postgres:ratewarden_postgres \
    ratewarden-conformance:ratewarden_conformance ratewarden:ratewarden \
    ratewarden-actix:ratewarden_actix ratewarden-server:ratewarden_server; do
    package=${pair%%:*}
    lib=${pair##*:}
    RUSTC_BOOTSTRAP=1 cargo rustdoc -q -p "$package" --all-features --lib -- \
        -Z unstable-options --output-format json
    python3 scripts/public_api.py "$target/doc/$lib.json" > "$out/$lib.txt"
    if $check && ! diff -u "api/$lib.txt" "$out/$lib.txt"; then
        echo "error: the public API of $package changed; run scripts/public-api.sh and commit api/$lib.txt" >&2
        status=1
    fi
done
$check && rm -rf "$out"
exit $status
