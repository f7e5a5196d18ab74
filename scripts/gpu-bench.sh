#!/usr/bin/env bash
# CUDA decode / prefill figures on flash-shape models (the real V4-Flash widths, 4 layers):
# the ds4-q2 layout (~9.5 GB) and all-q8_0 (~29 GB), each with the integer path and with
# DS4_CUDA_F32_ACTIVATIONS=1 (the f32-activation kernels), plus the trained model. The models
# are generated into TMP (default /tmp) and deleted after use.
#
#   scripts/gpu-bench.sh BIN_DIR [TMP]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/gpu-bench.sh BIN_DIR [TMP]}
tmp=${2:-/tmp}

bench() {   # label model
    for mode in int f32act; do
        if [ $mode = f32act ]; then export DS4_CUDA_F32_ACTIVATIONS=1; else unset DS4_CUDA_F32_ACTIVATIONS; fi
        "$bin/ds4-bench" -m "$2" --backend cuda --prompt-tokens 512 --gen-tokens 64 --json | sed "s/^/$1 $mode: /"
    done
    unset DS4_CUDA_F32_ACTIVATIONS
}

bench pystd-q8_0 models/ds4-pystd-q8_0.gguf
for layout in ds4-q2 q8_0; do
    m=$tmp/ds4-flash4-$layout.gguf
    if [ $layout = q8_0 ]; then extra=(); else extra=(--expert-type "$layout"); fi
    "$bin/ds4-make-model" --preset flash-shape --layers 4 "${extra[@]}" --quiet "$m"
    bench "flash4-$layout" "$m"
    rm -f "$m"
done
