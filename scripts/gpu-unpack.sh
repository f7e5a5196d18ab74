#!/usr/bin/env bash
# On the GPU machine: unpacks what scripts/gpu-pack.sh packed, into this checkout
# (build-cuda/bin, build-cuda/lib, gpu-lib/, gpu-base/), and makes the path the binaries were
# built at point here when it differs (they find fixtures and tools by that path).
#
#   scripts/gpu-unpack.sh [ARCHIVE]     (default gpu-carry/ds4-gpu.tar.xz)
#   eval "$(scripts/gpu-unpack.sh ARCHIVE)"   also sets LD_LIBRARY_PATH in this shell
#
# Prints the export line for LD_LIBRARY_PATH on stdout; progress on stderr. Then:
# scripts/gpu-test.sh --prebuilt build-cuda/bin, scripts/gpu-drafter-share-check.sh build-cuda
# gpu-lib, scripts/gpu-stream-check.sh MODEL build-cuda/bin, gpu-base/ds4-bench for A/B figures.
set -euo pipefail
cd "$(dirname "$0")/.."
archive=${1:-gpu-carry/ds4-gpu.tar.xz}
[ -f "$archive" ] || { echo "gpu-unpack: no $archive (scripts/gpu-pack.sh makes it)" >&2; exit 1; }
root=$(mktemp -d /tmp/ds4-gpu-unpack-XXXXXX)
tar -C "$root" -xJf "$archive"
mkdir -p build-cuda gpu-lib
rm -rf build-cuda/bin build-cuda/lib
mv "$root/build-cuda/bin" "$root/build-cuda/lib" build-cuda/
cp -P "$root"/gpu-lib/* gpu-lib/
[ -d "$root/gpu-base" ] && { rm -rf gpu-base; mv "$root/gpu-base" gpu-base; }
built_at=$(sed -n 1p "$root/PACKED_AT")
echo "gpu-unpack: binaries of $(sed -n 2p "$root/PACKED_AT")${built_at:+, built at $built_at}" >&2
rm -rf "$root"
if [ -n "$built_at" ] && [ "$built_at" != "$PWD" ] && [ ! -e "$built_at" ]; then
    mkdir -p "$(dirname "$built_at")"
    ln -s "$PWD" "$built_at"
    echo "gpu-unpack: $built_at -> $PWD" >&2
fi
missing=$(LD_LIBRARY_PATH="$PWD/gpu-lib:$PWD/build-cuda/lib" ldd build-cuda/bin/ds4d build-cuda/bin/cuda_backend_tests |
          grep 'not found' || true)
[ -z "$missing" ] || { echo "gpu-unpack: still missing:" >&2; echo "$missing" >&2; exit 1; }
echo "export LD_LIBRARY_PATH=$PWD/gpu-lib:$PWD/build-cuda/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
