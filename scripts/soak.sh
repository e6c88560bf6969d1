#!/usr/bin/env bash
# Soak: the demo server under wrk on loopback, serving mostly refusals.
#
#   scripts/soak.sh                 120 s of load (SOAK_SECONDS), 2 threads, 64 connections
#   SOAK_SECONDS=60 SOAK_CONNECTIONS=128 scripts/soak.sh
#
# Builds the demo in release, starts it on 127.0.0.1 (memory store, peer
# address: every wrk connection is the same client, so after its first 60
# requests per minute everything is a 429), runs wrk against
# GET /api/search, samples the server's VmRSS every 5 s, and prints wrk's
# figures and the RSS of the first and the last minute. Bounded in time;
# binds 127.0.0.1 only. Installs wrk with apt-get if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_TOTAL=${SOAK_SECONDS:-120}
THREADS=${SOAK_THREADS:-2}
CONNECTIONS=${SOAK_CONNECTIONS:-64}
PORT=${SOAK_PORT:-38571}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT=${SOAK_OUT:-$(mktemp -d /tmp/ratewarden-soak.XXXXXX)}
mkdir -p "$OUT"

if ! command -v wrk >/dev/null 2>&1; then
    echo "== installing wrk"
    apt-get update -qq && apt-get install -y -qq wrk >/dev/null
fi

echo "== building the demo (release)"
cargo build --release -p ratewarden-demo
BIN="$TARGET_DIR/release/ratewarden-demo"

echo "== starting $BIN on 127.0.0.1:$PORT"
"$BIN" --listen "127.0.0.1:$PORT" --store memory:// --secret "soak-secret-soak-secret-soak-secret!" \
    >"$OUT/demo.log" 2>&1 &
DEMO=$!
cleanup() { kill "$DEMO" 2>/dev/null || true; wait "$DEMO" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$DEMO/status"; }
echo "rss at start: $(rss) KiB"
(
    t=0
    while kill -0 "$DEMO" 2>/dev/null && [ "$t" -le "$SECONDS_TOTAL" ]; do
        echo "$t $(rss)"
        sleep 5
        t=$((t + 5))
    done
) >"$OUT/rss.txt" &
SAMPLER=$!

echo "== wrk -t$THREADS -c$CONNECTIONS -d${SECONDS_TOTAL}s --latency GET /api/search?q=rust"
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${SECONDS_TOTAL}s" --latency \
    "http://127.0.0.1:$PORT/api/search?q=rust" | tee "$OUT/wrk.txt"
wait "$SAMPLER" || true

# One request after the run: what a client sees now.
status=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/search?q=rust")
echo "status of a request right after the run: $status"

first=$(awk '$1 <= 60 {print $2}' "$OUT/rss.txt" | sort -n | tail -1)
last=$(awk -v end="$SECONDS_TOTAL" '$1 >= end - 60 {print $2}' "$OUT/rss.txt" | sort -n | tail -1)
echo "== demo VmRSS (KiB) every 5 s: $(awk '{printf "%s ", $2}' "$OUT/rss.txt")"
echo "max RSS in the first minute: $first KiB; in the last minute: $last KiB"
echo "files: $OUT"
