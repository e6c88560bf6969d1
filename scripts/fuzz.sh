#!/usr/bin/env bash
# A short fuzz run of every target in fuzz/ (cargo-fuzz, libFuzzer): a fixed
# number of iterations each, starting from the seed corpus in
# fuzz/corpus/<target>/. Any crash fails the run; libFuzzer leaves the input
# in fuzz/artifacts/<target>/ and prints it.
#
#   scripts/fuzz.sh                    every target, FUZZ_RUNS iterations each
#   scripts/fuzz.sh memory_keys        one target
#   FUZZ_RUNS=1000000 scripts/fuzz.sh  a longer run
#
# cargo-fuzz wants nightly-only rustc flags; RUSTC_BOOTSTRAP=1 lets the
# stable toolchain accept them. Without a sanitizer (-s none): AddressSanitizer
# would need a nightly standard library, and the code under test has no
# unsafe. Debug assertions (overflow checks included) stay on.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${FUZZ_RUNS:-50000}
# A backstop only: the iteration count is what the run is defined by.
MAX_SECONDS=${FUZZ_MAX_SECONDS:-120}
TARGET_DIR=${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-target}/fuzz}
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
if ! command -v c++ >/dev/null 2>&1; then
    echo "== installing a C++ compiler (libFuzzer is built from source)"
    apt-get update -qq && apt-get install -y -qq g++ >/dev/null
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi

echo "== building fuzz targets: ${targets[*]}"
start=$(date +%s)
cargo fuzz build -s none --target-dir "$TARGET_DIR"
echo "build took $(( $(date +%s) - start )) s"

for t in "${targets[@]}"; do
    work=$(mktemp -d /tmp/ratewarden-fuzz-"$t".XXXXXX)
    mkdir -p "fuzz/corpus/$t"
    echo "== $t: $RUNS runs"
    t0=$(date +%s)
    # New inputs go to the scratch directory first named; the seed corpus is
    # only read, so the run leaves the tree unchanged.
    log="$work.log"
    status=0
    cargo fuzz run -s none --target-dir "$TARGET_DIR" "$t" "$work" "fuzz/corpus/$t" -- \
        -runs="$RUNS" -max_total_time="$MAX_SECONDS" -max_len=4096 -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "^(#[0-9]+ +DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -60 "$log" >&2
    fi
    rm -f "$log"
    rm -rf "$work"
    if [ "$status" -ne 0 ]; then
        echo "FUZZ FAILURE in $t (exit $status): see fuzz/artifacts/$t/" >&2
        exit "$status"
    fi
    echo "$t: ok in $(( $(date +%s) - t0 )) s"
done
