#!/usr/bin/env bash
# Instructions per decision of the composition bench's one-rule `Limiter`
# (b), the bare store's inline decision it wraps (a2) and `governor` (g),
# counted by callgrind on each single-thread workload.
#
# A count, not a time: the same binary and inputs give the same figure on a
# busy or noisy machine, where the bench's nanoseconds can move by a third
# from one run to the next. It does not see what costs time without costing
# instructions (cache misses, a locked instruction's wait), so it stands
# beside the timed bench, not in its place.
#
#   scripts/instructions.sh            # the four workloads, about four minutes
#   scripts/instructions.sh "=one hot key"
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind callgrind_annotate; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool not found; install valgrind (apt-get install valgrind)" >&2
        exit 1
    }
done

bin=$(cargo bench -p ratewarden --no-default-features --features memory --bench composition \
    --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*composition[^"]*"' | tail -1 | cut -d'"' -f4)
[ -x "$bin" ] || { echo "error: the composition bench did not build" >&2; exit 1; }

if [ $# -gt 0 ]; then
    workloads=("$@")
else
    workloads=("=one hot key" "=1,000 keys round-robin" "=admit path, one hot key" "=admit path, 1,000 keys")
fi
# The bench's contender numbers (--profile=N).
contenders=(1 2 6)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Instructions per decision of contender $2 on workload $1: the inclusive
# count of the bench's call into the contender, over the decisions made.
count() {
    local out="$work/$2.$RANDOM"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" --profile="$2" \
        >/dev/null 2>"$out.err"
    local made inclusive
    # awk reads every line: a reader that stops early (grep -m1) would
    # end the pipeline with SIGPIPE, an error under pipefail.
    made=$(awk '/^decisions made: / && !n { n = $NF } END { print n }' "$out.err")
    inclusive=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
        awk '/Contender::decide::\{\{closure\}\} \[/ && !n { gsub(",", "", $1); n = $1 }
             END { print n }')
    if [ -z "$made" ] || [ -z "$inclusive" ]; then
        echo "error: no count for contender $2 on $1 (see $out.err)" >&2
        exit 1
    fi
    awk -v i="$inclusive" -v m="$made" 'BEGIN { printf "%.0f", i / m }'
}

echo "| workload | (a2) bare inline | (b) one-rule Limiter | (g) governor | (b) ÷ (a2) | (b) ÷ (g) |"
echo "|---|---:|---:|---:|---:|---:|"
for w in "${workloads[@]}"; do
    for c in "${contenders[@]}"; do
        count "$w" "$c" >"$work/result.$c" &
    done
    wait
    for c in "${contenders[@]}"; do
        [ -s "$work/result.$c" ] || exit 1
    done
    a2=$(cat "$work/result.1") b=$(cat "$work/result.2") g=$(cat "$work/result.6")
    awk -v w="${w#=}" -v a2="$a2" -v b="$b" -v g="$g" \
        'BEGIN { printf "| %s | %d | %d | %d | %.2f | %.2f |\n", w, a2, b, g, b / a2, b / g }'
done
