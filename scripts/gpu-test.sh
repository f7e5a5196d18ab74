#!/usr/bin/env bash
# The GPU suite: the CUDA backend against the HF reference fixtures, the CPU backend and the
# op-level references (tests/cuda, tests/backend), the CPU vs CUDA agreement table on the
# trained model per weight format (scripts/gpu-agreement.sh), plus a decode/prefill figure
# (integer path and DS4_CUDA_F32_ACTIVATIONS=1).
#
#   scripts/gpu-test.sh                 build with CUDA (scripts/setup.sh -DDS4_CUDA=ON, which
#                                       installs the Debian packages it needs) and run the suite
#   scripts/gpu-test.sh --pack DIR      build here (nvcc, no GPU needed) and copy the GPU test
#                                       binaries into DIR, for a GPU machine without the build
#                                       packages
#   scripts/gpu-test.sh --prebuilt DIR  run binaries packed by --pack (the checkout must be at the
#                                       same path as where they were packed: the tests read the
#                                       fixtures and find the tools there), or by scripts/gpu-pack.sh
#                                       and unpacked with scripts/gpu-unpack.sh (DIR build-cuda/bin)
#
# Exits non-zero when a test fails or when no usable GPU is present (the tests themselves
# skip without one; this script exists to run them on one).
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=(cuda_backend_tests backend_ops_tests ds4-convert ds4-make-model ds4-bench ds4-logits ds4-eval-loss ds4-requant)

build() {
    DS4_BUILD_DIR=${DS4_BUILD_DIR:-build-cuda} scripts/setup.sh -DDS4_CUDA=ON >/dev/null
}

case "${1:-}" in
--pack)
    dir=${2:?usage: scripts/gpu-test.sh --pack DIR}
    build
    mkdir -p "$dir"
    for b in "${BINS[@]}"; do cp "${DS4_BUILD_DIR:-build-cuda}/bin/$b" "$dir/"; done
    echo "packed ${BINS[*]} into $dir (built for $(pwd))"
    exit 0 ;;
--prebuilt)
    # The tests find ds4-convert and ds4-make-model at the path they were built at.
    bin=${DS4_BUILD_DIR:-build-cuda}/bin
    src=${2:?usage: scripts/gpu-test.sh --prebuilt DIR}
    mkdir -p "$bin"
    # DIR may be bin itself (scripts/gpu-unpack.sh puts the binaries there).
    if [ "$(cd "$src" && pwd)" != "$(cd "$bin" && pwd)" ]; then
        for b in "${BINS[@]}"; do cp "$src/$b" "$bin/"; done
    fi ;;
"")
    build
    bin=${DS4_BUILD_DIR:-build-cuda}/bin ;;
*)
    sed -n '2,18p' "$0" >&2
    exit 2 ;;
esac

if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; then
    echo "gpu-test: no usable GPU here (nvidia-smi found none); the suite would only skip" >&2
    exit 1
fi
fail=0
"$bin/cuda_backend_tests" --gtest_brief=1 || fail=1
"$bin/backend_ops_tests" --gtest_brief=1 --gtest_filter='*cuda*' || fail=1
scripts/gpu-agreement.sh "$bin" || fail=1
"$bin/ds4-bench" -m models/ds4-pystd-q8_0.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 || fail=1
DS4_CUDA_F32_ACTIVATIONS=1 "$bin/ds4-bench" -m models/ds4-pystd-q8_0.gguf --backend cuda --prompt-tokens 512 --gen-tokens 128 || fail=1
exit $fail
