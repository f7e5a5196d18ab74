#!/usr/bin/env bash
# Packs everything one call on a GPU machine without the build packages needs into one file:
# the CUDA build's GPU tests, tools, ds4d and libds4 (stripped), the runtime libraries of
# libuv / LMDB / liburing / libedit taken from Debian's packages (apt-get download), and
# optionally a ds4-bench built from another revision for same-call A/B figures.
#
#   scripts/gpu-pack.sh [--base REV] [OUT]   (OUT: default gpu-carry/ds4-gpu.tar.xz)
#
# Builds build-cuda/ here with -DDS4_CUDA=ON (nvcc compiles sm_90 without a GPU). --base REV
# builds REV's ds4-bench in a temporary worktree (build-base/); it goes in as gpu-base/ds4-bench.
# On the GPU machine, from the same checkout: scripts/gpu-unpack.sh OUT, then the scripts it
# names. The archive records this checkout's path: the tests find fixtures and tools there.
set -euo pipefail
cd "$(dirname "$0")/.."
base=""
out=gpu-carry/ds4-gpu.tar.xz
while [ $# -gt 0 ]; do
    case "$1" in
    --base) base=${2:?--base needs a revision}; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "gpu-pack: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
    esac
done
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { echo "gpu-pack: no nvcc here" >&2; exit 1; }
TARGETS=(cuda_backend_tests backend_ops_tests cuda_drafter_share_tests ds4d ds4 ds4-drafter-importer ds4-convert
         ds4-make-model ds4-bench ds4-logits ds4-eval-loss ds4-requant ds4-bench-batch)
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DDS4_CUDA=ON >/dev/null
cmake --build build-cuda -j "${DS4_JOBS:-$(nproc)}" --target "${TARGETS[@]}" >&2

stage=$(mktemp -d /tmp/ds4-gpu-pack-XXXXXX)
trap 'rm -rf "$stage"; [ -n "$base" ] && git worktree remove --force build-base/src 2>/dev/null || true' EXIT
mkdir -p "$stage/build-cuda/bin" "$stage/build-cuda/lib" "$stage/gpu-lib"
for t in "${TARGETS[@]}"; do cp "build-cuda/bin/$t" "$stage/build-cuda/bin/"; done
cp -P build-cuda/lib/libds4.so* "$stage/build-cuda/lib/"
strip "$stage"/build-cuda/bin/* "$stage"/build-cuda/lib/libds4.so.*.*.* 2>/dev/null || true

# Runtime libraries the GPU machine lacks, from this Debian's packages.
(cd "$stage" && apt-get download libuv1 liblmdb0 liburing2 libedit2 libbsd0 libmd0 >/dev/null 2>&1) ||
    { echo "gpu-pack: apt-get download of the runtime libraries failed" >&2; exit 1; }
for d in "$stage"/*.deb; do dpkg -x "$d" "$stage/x"; done
cp -P "$stage"/x/usr/lib/x86_64-linux-gnu/*.so* "$stage/gpu-lib/"
rm -rf "$stage"/x "$stage"/*.deb

if [ -n "$base" ]; then
    mkdir -p build-base
    git worktree add --force --detach build-base/src "$base" >/dev/null
    cmake -S build-base/src -B build-base/build -DCMAKE_BUILD_TYPE=Release -DDS4_CUDA=ON >/dev/null
    cmake --build build-base/build -j "${DS4_JOBS:-$(nproc)}" --target ds4-bench >&2
    mkdir -p "$stage/gpu-base"
    cp build-base/build/bin/ds4-bench "$stage/gpu-base/"
    strip "$stage/gpu-base/ds4-bench"
    git rev-parse --short "$base" >"$stage/gpu-base/REVISION"
fi
{ pwd; git describe --always --dirty; } >"$stage/PACKED_AT"
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" .
echo "packed $(git describe --always --dirty)${base:+ and the ds4-bench of $base} into $out ($(du -h "$out" | cut -f1));" \
     "carry $(dirname "$out") and run scripts/gpu-unpack.sh $out there"
