#!/usr/bin/env bash
# Instructions per decision, counted by callgrind:
#
# - the composition bench's one-rule `Limiter` (b), the bare store's inline
#   decision it wraps (a2), `governor` (g) and two memory tiers (c), on
#   each single-thread workload;
# - with `files WORKLOAD`, the same three on one workload, by the source
#   file each instruction was compiled from (inlined code counts where it
#   was written): what the limiter adds and what `governor` does not do;
# - with `http`, the HTTP bench's rows for distinct clients: instructions
#   per request of no limiter, the layer at its default headers and with
#   none, and `tower_governor` keyed by the same HMAC.
#
# A count, not a time: the same binary and inputs give the same figure on a
# busy or noisy machine, where the bench's nanoseconds can move by a third
# from one run to the next. It does not see what costs time without costing
# instructions (cache misses, a locked instruction's wait), so it stands
# beside the timed bench, not in its place.
#
#   scripts/instructions.sh            # the four workloads, about a minute
#   scripts/instructions.sh "=one hot key"
#   scripts/instructions.sh http       # about 20 seconds
#   scripts/instructions.sh files "=one hot key"   # where they go, by source file
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind callgrind_annotate; do
    command -v "$tool" >/dev/null || {
        echo "error: $tool not found; install valgrind (apt-get install valgrind)" >&2
        exit 1
    }
done

# The executable of bench $1 of the package and features in the rest.
bench_bin() {
    local name=$1 bin
    shift
    bin=$(cargo bench "$@" --bench "$name" --no-run --message-format=json 2>/dev/null |
        grep -o "\"executable\":\"[^\"]*/$name-[^\"]*\"" | tail -1 | cut -d'"' -f4)
    [ -x "$bin" ] || { echo "error: the $name bench did not build" >&2; exit 1; }
    echo "$bin"
}

# The decisions a composition run made, from its stderr ($1). awk reads
# every line: a reader that stops early (grep -m1) would end the pipeline
# with SIGPIPE, an error under pipefail.
made_in() {
    awk '/^decisions made: / && !n { n = $NF } END { print n }' "$1"
}

# Instructions per request of each HTTP row for distinct clients. Each row
# runs twice beside the `no limiter` baseline, with 10,240 and then 30,720
# requests a row (multiples of the bench's 64 tasks, so that each row
# makes exactly that many): the difference between the two runs' totals is
# what 20,480 more requests cost, without the start-up both runs share, and
# the baseline's own difference, measured alone, is taken off.
http_rows() {
    local bin small=10240 large=30720
    bin=$(bench_bin http -p ratewarden --features memory,axum)
    local rows=("no limiter" "limiter, GCRA" "limiter, GCRA, no hdrs" "tower_governor, HMAC")
    local sizes=("$small" "$large")
    local i j pids
    for i in "${!rows[@]}"; do
        pids=()
        for n in "${sizes[@]}"; do
            valgrind --tool=callgrind --callgrind-out-file="$work/http.$i.$n" "$bin" \
                --only "=${rows[$i]}" --traffic clients --rounds 1 --requests "$n" --workers 1 \
                >/dev/null 2>"$work/http.$i.$n.err" &
            pids+=($!)
        done
        for j in 0 1; do
            wait "${pids[j]}" || {
                echo "error: the http bench failed on the row ${rows[$i]}:" >&2
                tail -5 "$work/http.$i.${sizes[j]}.err" >&2
                exit 1
            }
        done
    done
    local extra=()
    for i in "${!rows[@]}"; do
        local totals=()
        for n in "${sizes[@]}"; do
            # The file's `totals:` line: every instruction of the run.
            totals+=("$(awk '/^totals: / { print $2 }' "$work/http.$i.$n")")
            if [ -z "${totals[-1]}" ]; then
                echo "error: callgrind gave no total for the row ${rows[$i]}" >&2
                exit 1
            fi
        done
        extra[i]=$((totals[1] - totals[0]))
    done
    echo "| row | instructions per request | added to no limiter | ÷ \`tower_governor\`, HMAC |"
    echo "|---|---:|---:|---:|"
    awk -v n="$((large - small))" -v e0="${extra[0]}" -v e1="${extra[1]}" -v e2="${extra[2]}" \
        -v e3="${extra[3]}" -v r1="${rows[1]}" -v r2="${rows[2]}" -v r3="${rows[3]}" 'BEGIN {
            base = e0 / n
            printf "| no limiter | %.0f | | |\n", base
            tg = (e3 - e0) / n - base
            split(e1 " " e2 " " e3, e, " ")
            for (i = 1; i <= 3; i++) {
                own = (e[i] - e0) / n
                name = (i == 1) ? r1 : (i == 2) ? r2 : r3
                printf "| %s | %.0f | %.0f | %.2f |\n", name, own, own - base, (own - base) / tg
            }
        }'
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "${1:-}" = http ]; then
    http_rows
    exit 0
fi

bin=$(bench_bin composition -p ratewarden --no-default-features --features memory)

if [ $# -gt 0 ]; then
    workloads=("$@")
else
    workloads=("=one hot key" "=1,000 keys round-robin" "=admit path, one hot key" "=admit path, 1,000 keys")
fi
# The bench's contender numbers (--profile=N).
contenders=(1 2 6)

# Instructions per decision of contender $2 on workload $1: the inclusive
# count of the bench's call into the contender, over the decisions made.
count() {
    local out="$work/$2.$RANDOM"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" --profile="$2" \
        >/dev/null 2>"$out.err"
    local made inclusive
    made=$(made_in "$out.err")
    inclusive=$(callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
        awk '/Contender::decide::\{\{closure\}\} \[/ && !n { gsub(",", "", $1); n = $1 }
             END { print n }')
    if [ -z "$made" ] || [ -z "$inclusive" ]; then
        echo "error: no count for contender $2 on $1:" >&2
        tail -5 "$out.err" >&2
        exit 1
    fi
    awk -v i="$inclusive" -v m="$made" 'BEGIN { printf "%.0f", i / m }'
}

# Instructions per decision of each contender on one workload, by source
# file: every instruction of the run (the bench's own loop included), the
# file's path shortened to its crate or library part.
files() {
    local w=$1 c out
    for c in "${contenders[@]}"; do
        out="$work/files.$c"
        valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$w" --profile="$c" \
            >/dev/null 2>"$out.err" &
    done
    wait
    for c in "${contenders[@]}"; do
        out="$work/files.$c"
        local made
        made=$(made_in "$out.err")
        if [ -z "$made" ]; then
            echo "error: no decisions made by contender $c on $w:" >&2
            tail -5 "$out.err" >&2
            exit 1
        fi
        # The self cost of each file:function line, summed by file. The
        # first awk reads to the end (see `made_in`) and passes on only the
        # list of functions, the lines up to the first blank one.
        callgrind_annotate --show-percs=no --threshold=100 "$out" 2>/dev/null |
            awk '/file:function/ { on = 1; next } on && /^-+$/ { next } on && NF == 0 { on = 0; done = 1 } on && !done' |
            awk -v made="$made" '$1 ~ /^[0-9,]+$/ {
                    n = $1; gsub(",", "", n); f = $2; sub(/:.*/, "", f)
                    sub(/.*\/(library|index\.crates\.io-[0-9a-f]*)\//, "", f)
                    sum[f] += n
                }
                END { for (f in sum) printf "%s\t%.1f\n", f, sum[f] / made }' >"$work/files.$c.tsv"
    done
    echo "| source file | (a2) bare inline | (b) one-rule Limiter | (g) governor |"
    echo "|---|---:|---:|---:|"
    awk -F'\t' '
        FILENAME ~ /files\.1\.tsv$/ { a2[$1] = $2; seen[$1] = 1 }
        FILENAME ~ /files\.2\.tsv$/ { b[$1] = $2; seen[$1] = 1 }
        FILENAME ~ /files\.6\.tsv$/ { g[$1] = $2; seen[$1] = 1 }
        END {
            for (f in seen) {
                ta += a2[f]; tb += b[f]; tg += g[f]
                if (a2[f] < 2 && b[f] < 2 && g[f] < 2) continue
                printf "%s\t| %s | %.0f | %.0f | %.0f |\n", b[f] + a2[f] + g[f], f, a2[f], b[f], g[f]
            }
            printf "-1\t| every file (those under 2 too) | %.0f | %.0f | %.0f |\n", ta, tb, tg
        }' "$work/files.1.tsv" "$work/files.2.tsv" "$work/files.6.tsv" |
        sort -t$'\t' -k1,1 -g -r | cut -f2-
}

if [ "${1:-}" = files ]; then
    [ $# -eq 2 ] || { echo "usage: scripts/instructions.sh files WORKLOAD" >&2; exit 1; }
    files "$2"
    exit 0
fi

# The table's contenders: those above and (c), two memory tiers.
counted=("${contenders[@]}" 3)
echo "| workload | (a2) bare inline | (b) one-rule Limiter | (g) governor | (b) ÷ (a2) | (b) ÷ (g) | (c) two tiers | (c) ÷ (b) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for w in "${workloads[@]}"; do
    for c in "${counted[@]}"; do
        count "$w" "$c" >"$work/result.$c" &
    done
    wait
    for c in "${counted[@]}"; do
        [ -s "$work/result.$c" ] || exit 1
    done
    a2=$(cat "$work/result.1") b=$(cat "$work/result.2") g=$(cat "$work/result.6") c=$(cat "$work/result.3")
    awk -v w="${w#=}" -v a2="$a2" -v b="$b" -v g="$g" -v c="$c" \
        'BEGIN { printf "| %s | %d | %d | %d | %.2f | %.2f | %d | %.2f |\n", w, a2, b, g, b / a2, b / g, c, c / b }'
done
