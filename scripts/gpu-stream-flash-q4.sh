#!/usr/bin/env bash
# Larger than the GPU: V4-Flash in ds4's Q4 layout (43 layers, q4_k experts) written sparse
# (~165 GB that reads as zeros, ~90 MB on disk), refused by the resident CUDA path and
# decoded with VRAM expert budgets (SSD streaming). Prints ds4-bench's figures per budget.
#
#   scripts/gpu-stream-flash-q4.sh BIN_DIR [TMP] [BUDGETS_GIB...]   (default budgets: 64 16 4 2)
#
# Zero weights route statically (the same experts every token): budgets that hold one token's
# experts (258) hit 100% after the prefill; smaller ones evict on every layer.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/gpu-stream-flash-q4.sh BIN_DIR [TMP] [BUDGETS_GIB...]}
tmp=${2:-/tmp}
shift $(( $# >= 2 ? 2 : 1 ))
budgets=("$@")
[ ${#budgets[@]} -gt 0 ] || budgets=(64 16 4 2)
m=$tmp/ds4-flash43-q4-sparse.gguf
trap 'rm -f "$m"' EXIT
"$bin/ds4-make-model" --preset flash-shape --layers 43 --expert-type ds4-q4 --sparse --quiet "$m" || exit 1
echo "model: $(stat -c %s "$m") bytes apparent, $(du -h "$m" | cut -f1) on disk"
echo "=== resident (expected: refused, the weights exceed VRAM)"
"$bin/ds4-bench" -m "$m" --backend cuda --prompt-tokens 64 --gen-tokens 8 2>&1 | tr '\r' '\n' | grep -v "copying weights" | tail -3
for gb in "${budgets[@]}"; do
    echo "=== VRAM expert budget $gb GiB"
    "$bin/ds4-bench" -m "$m" --backend cuda --ssd-streaming --expert-cache-bytes $((gb << 30)) --raw-bytes $((1 << 30)) \
        --prompt-tokens 512 --gen-tokens 64 2>&1 | tr '\r' '\n' | grep -v "copying weights\|^$"
done
