#!/usr/bin/env bash
# The restart figure of SSD expert streaming: how soon a start with the use counts persisted
# by an earlier run reaches its steady hit rate, against a cold start. Each repetition makes a
# fresh expert store, fills it with one run (prompt seed 10r+1: its records and use counts),
# copies it, then decodes another prompt (seed 10r+2) twice with the same cache budget: on the
# store as it is (the hot set prewarmed before the first token) and on the copy with --cold
# (both read the records the first run stored, so only the prewarm differs). Prints, per run,
# the steady misses/token, the decoded tokens before it is reached, and the demand misses of
# the prefill and of the first 16 decoded tokens (ds4-bench --hit-curve; logs kept in OUT_DIR).
#
#   scripts/stream-restart.sh MODEL.gguf CACHE_EXPERTS [BIN_DIR] [TOKENS] [REPS] [-- ds4-bench options...]
#
# BIN_DIR (default build/bin) holds ds4-bench. TOKENS: decoded tokens per run (default 64).
# REPS: repetitions (default 3). The prompt is one token, so the decode shows the warm-up (a
# long prompt's prefill fills the cache either way). OUT_DIR (default a temporary folder,
# removed) keeps the logs; the stores (cache-sized, from the model's disk) are made in it.
set -euo pipefail
usage="usage: scripts/stream-restart.sh MODEL.gguf CACHE_EXPERTS [BIN_DIR] [TOKENS] [REPS] [-- ds4-bench options...]"
model=${1:?$usage}
cap=${2:?$usage}
shift 2
pos=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do pos+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
bin=${pos[0]:-build/bin}
tokens=${pos[1]:-64}
reps=${pos[2]:-3}
threads=${THREADS:-2}
if [ -n "${OUT_DIR:-}" ]; then
    work=$OUT_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi

bench() {   # log, ds4-bench options...
    local log=$1
    shift
    "$bin/ds4-bench" -m "$model" --threads "$threads" --prompt-tokens 1 --gen-tokens "$tokens" --ssd-streaming \
        --expert-cache-experts "$cap" --hit-curve --raw-bytes 0 "$@" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
}

printf '%-4s %-5s %14s %15s %16s %18s\n' rep run "steady miss/tok" "tokens to steady" "prefill misses" "misses, 16 tokens"
for r in $(seq 1 "$reps"); do
    store=$work/store-$r
    rm -rf "$store" "$store-cold"
    bench "$work/$r-fill.log" --expert-store "$store" --prompt-seed $((r * 10 + 1)) "$@"
    cp -r "$store" "$store-cold"
    bench "$work/$r-warm.log" --expert-store "$store" --prompt-seed $((r * 10 + 2)) "$@"
    bench "$work/$r-cold.log" --expert-store "$store-cold" --prompt-seed $((r * 10 + 2)) --cold "$@"
    rm -rf "$store" "$store-cold"
    for k in fill warm cold; do
        log=$work/$r-$k.log
        steady=$(awk '/^steady/ {print $2, $(NF-2)}' "$log")
        first=$(awk '/^first tokens/ {print $3, $8}' "$log")
        printf '%-4s %-5s %14s %15s %16s %18s\n' "$r" "$k" ${steady% *} ${steady#* } ${first% *} ${first#* }
        grep '^prewarm ' "$log" | sed 's/^/          /' || true
    done
done
