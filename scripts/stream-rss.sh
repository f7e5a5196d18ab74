#!/usr/bin/env bash
# ds4d's memory and decode speed on one model, SSD expert streaming vs the mapped path, in
# one run: starts ds4d each way on a private socket, has ds4-bench-batch (one client, token
# ids, so any tokenizer does) generate TOKENS tokens after an 8-token prompt, and prints the
# daemon's peak RSS (VmHWM), its RSS split (anonymous / file pages) at the end, the client's
# decode tok/s and what `ds4 stats` reports.
#
#   scripts/stream-rss.sh MODEL.gguf [BIN_DIR] [TOKENS] [CACHE_BYTES]
#
# BIN_DIR (default build/bin) holds ds4d, ds4 and ds4-bench-batch. TOKENS: tokens to generate (default 8).
# CACHE_BYTES: the streaming expert cache (default 2 GiB). Set MODES="stream" (or "mmap") to
# run one of the two.
set -euo pipefail
model=${1:?usage: scripts/stream-rss.sh MODEL.gguf [BIN_DIR] [TOKENS] [CACHE_BYTES]}
bin=${2:-build/bin}
tokens=${3:-8}
cache=${4:-$((2 << 30))}
threads=${THREADS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_one() {   # label, ds4d options...
    local label=$1
    shift
    local sock=$work/ds4.sock state=$work/state-$label
    "$bin/ds4d" --model "$model" --socket "$sock" --state-dir "$state" --backend cpu --threads "$threads" "$@" \
        2>"$work/ds4d-$label.log" &
    local pid=$! t0 t1
    t0=$(date +%s.%N)
    for _ in $(seq 1 3600); do
        [ -S "$sock" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$work/ds4d-$label.log" >&2; return 1; }
        sleep 0.5
    done
    t1=$(date +%s.%N)
    local rss_open
    rss_open=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status)
    local gen st
    gen=$("$bin/ds4-bench-batch" --socket "$sock" --clients 1 --tokens "$tokens" --prompt-tokens 8 --ttft-busy 1 \
        --ttft-prompt 4 2>&1)
    st=$("$bin/ds4" --socket "$sock" stats)
    echo "== $label (ds4d $*)"
    echo "$gen" | grep -E 'clients:' | head -2
    echo "open + prewarm    $(echo "$t1 - $t0" | bc) s; RSS after it ${rss_open} kB"
    awk '/^(VmHWM|VmRSS|RssAnon|RssFile)/ {printf "%-17s %s %s\n", $1, $2, $3}' /proc/$pid/status
    echo "$st" | grep -iE 'tok/s|expert|hit|read' | head -12
    kill -TERM "$pid"
    wait "$pid" || true
    rm -f "$sock"
}

for m in ${MODES:-stream mmap}; do
    case $m in
    stream) run_one stream --ssd-streaming --expert-cache-bytes "$cache" ;;
    mmap) run_one mmap ;;
    esac
done
