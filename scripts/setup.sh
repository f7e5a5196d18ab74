#!/usr/bin/env bash
# Installs the Debian packages ds4 needs (when missing) and builds into build/.
# Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config git libuv1-dev libflatbuffers-dev flatbuffers-compiler
      liblmdb-dev liburing-dev libgtest-dev libsimde-dev nlohmann-json3-dev clang-14 libclang-rt-14-dev unicode-data
      libmicrohttpd-dev curl libedit-dev python3 help2man)
# The Rust bindings' tests (bindings/rust, ctest rust_cargo_test) need cargo; Debian's
# (rustc 1.63) is enough. A cargo already on PATH (rustup) is used as it is.
command -v cargo >/dev/null 2>&1 || PKGS+=(cargo rustc)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ds4 setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

BUILD_DIR=${DS4_BUILD_DIR:-build}
JOBS=${DS4_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" >&2
