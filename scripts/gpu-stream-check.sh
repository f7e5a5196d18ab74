#!/usr/bin/env bash
# SSD expert streaming on the GPU: the CUDA streaming tests (bit-identical logits against the
# resident CUDA path, counters) and ds4-bench on a full-size file, resident vs streamed with a
# VRAM expert budget that holds a token's experts (steady: hits) and one that holds a single
# layer's (every layer evicts: bound by the uploads). Prints decode tok/s, the hit rate, the
# host->device GB/s while uploading and the RAM tier's disk reads.
#
#   scripts/gpu-stream-check.sh MODEL.gguf [BIN_DIR]
#
# BIN_DIR (default build-cuda/bin) must hold cuda_backend_tests, ds4-make-model and
# ds4-bench of a -DDS4_CUDA=ON build of this checkout (the tests find ds4-make-model at the
# path it was built at and the trained model under models/). MODEL: a V4-Flash-shape file,
# e.g. the sparse all-zero one (its router always picks the same experts, so its hit rate
# after the first token says nothing about real routing; the one-layer budget forces misses).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: scripts/gpu-stream-check.sh MODEL.gguf [BIN_DIR]}
bin=${2:-build-cuda/bin}
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; then
    echo "gpu-stream-check: no usable GPU here" >&2
    exit 1
fi
fail=0
"$bin/cuda_backend_tests" --gtest_brief=1 --gtest_filter='CudaStreaming.*' || fail=1

bench() {   # label, extra args
    local label=$1
    shift
    echo "== $label: ds4-bench -m $model --backend cuda --prompt-tokens 64 --gen-tokens 32 $*"
    "$bin/ds4-bench" -m "$model" --backend cuda --prompt-tokens 64 --gen-tokens 32 "$@" \
        | grep -E '^(backend|open|prefill|decode|expert cache|decode hit|prefetch|expert reads|RAM tier|disk raw)' || fail=1
}
bench "resident (every expert in VRAM)"
bench "streamed, VRAM budget 8 GiB" --ssd-streaming --expert-cache-bytes $((8 << 30)) --raw-bytes $((1 << 30))
bench "streamed, VRAM budget of one layer's experts (6)" --ssd-streaming --expert-cache-experts 6 --raw-bytes 0
bench "streamed, 6 experts, no prefetch" --ssd-streaming --expert-cache-experts 6 --raw-bytes 0 --no-prefetch
echo "(\"expert reads ... GB/s while reading\" is host->device upload GB/s with the CUDA backend; the RAM tier line is disk)"
exit $fail
