#!/usr/bin/env bash
# The drafter's GPU weights shared across processes (ARCHITECTURE.md §5, "Shared drafter"), on
# a machine with a GPU:
#  1. the GPU tests (cuda_drafter_share_tests): drafter_shared = 1 with the device weights
#     imported, speculative output token-identical to a private drafter on the GPU, the GPU's
#     used memory (cudaMemGetInfo) holding the drafter once, a foreign descriptor falling back;
#  2. the figure with nvidia-smi: ds4d (drafter on the GPU) and an importer decoding
#     speculatively at the same time, against ds4d and a private loader.
#
#   scripts/gpu-drafter-share-check.sh [BUILD_DIR] [LIB_DIR]
#
# BUILD_DIR (default build-cuda) is a DS4_CUDA=ON build with bin/ds4d, bin/ds4,
# bin/ds4-drafter-importer, bin/ds4-make-model, lib/libds4.so.3 and
# bin/cuda_drafter_share_tests; LIB_DIR (optional) holds shared libraries the machine
# lacks (libuv, liblmdb, liburing, libedit and what they need), put on LD_LIBRARY_PATH.
# DS4_CHECK_BACKEND=cpu runs part 2 on the CPU without figures (to check this script without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build-cuda}" && pwd)
LIBS=${2:-}
BIN=$BUILD/bin
export LD_LIBRARY_PATH="$BUILD/lib${LIBS:+:$(cd "$LIBS" && pwd)}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in "$BIN/ds4d" "$BIN/ds4" "$BIN/ds4-drafter-importer" "$BIN/ds4-make-model" "$BIN/cuda_drafter_share_tests"; do
    [ -x "$f" ] || { echo "missing $f (build it with DS4_CUDA=ON)"; exit 1; }
done
missing=$(ldd "$BIN/ds4d" "$BIN/ds4" "$BIN/ds4-drafter-importer" "$BUILD/lib/libds4.so.3" | grep 'not found' || true)
[ -z "$missing" ] || { echo "shared libraries not found (pass LIB_DIR):"; echo "$missing"; exit 1; }

GPU=${DS4_CHECK_BACKEND:-cuda}
if [ "$GPU" = cuda ] && ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
    echo "no usable GPU here (nvidia-smi found none)"; exit 1
fi

echo "=== 1. GPU tests"
DS4_SOURCE_DIR=$PWD DS4D_PATH=$BIN/ds4d DS4_IMPORTER_PATH=$BIN/ds4-drafter-importer \
    DS4_MAKE_MODEL_BIN=$BIN/ds4-make-model "$BIN/cuda_drafter_share_tests"

echo "=== 2. nvidia-smi: two processes decoding speculatively"
W=$(mktemp -d /tmp/ds4-drafter-share-XXXXXX)
trap 'for p in "$W"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done; rm -rf "$W"' EXIT
used() {   # MiB
    [ "$GPU" = cuda ] || { echo 0; return; }
    sleep 1
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1
}
"$BIN/ds4-make-model" --preset tiny --quiet "$W/target.gguf"
"$BIN/ds4-make-model" --preset tiny --embd 256 --experts 128 --expert-ff 1024 --expert-type q8_0 --fast --seed 7 \
    --quiet "$W/drafter.gguf"
echo "drafter file: $(du -m "$W/drafter.gguf" | cut -f1) MiB"
base=$(used)
"$BIN/ds4d" --model "$W/target.gguf" --drafter "$W/drafter.gguf" --backend "$GPU" --socket "$W/d.sock" --no-store \
    >"$W/ds4d.log" 2>&1 &
echo $! >"$W/ds4d.pid"
for _ in $(seq 600); do "$BIN/ds4" --socket "$W/d.sock" stats >/dev/null 2>&1 && break; sleep 0.1; done
grep -E 'drafter .* shared|not exportable' "$W/ds4d.log" || true
daemon=$(used)

# Each importer decodes (speculatively) and then holds the model while ds4d decodes too.
hold() {   # NAME ARGS...: runs the importer with a pipe on stdin, waits for "ready"
    local name=$1
    shift
    mkfifo "$W/$name.in"
    "$BIN/ds4-drafter-importer" "$W/target.gguf" "$@" 64 "abc" "$GPU" <"$W/$name.in" >"$W/$name.out" 2>"$W/$name.err" &
    echo $! >"$W/$name.pid"
    exec {fd}>"$W/$name.in"
    eval "${name}_fd=$fd"
    for _ in $(seq 1200); do grep -q '^ready' "$W/$name.out" 2>/dev/null && return 0; sleep 0.1; done
    echo "importer $name did not get ready:"; cat "$W/$name.err"; exit 1
}
release() {   # NAME: lets the importer free its model and exit
    local v="${1}_fd"
    local fd=${!v}
    echo >&"$fd"
    eval "exec $fd>&-"
    wait "$(cat "$W/$1.pid")"
    rm "$W/$1.pid"
}
hold imp --import "$W/d.sock"
"$BIN/ds4" --socket "$W/d.sock" run --raw --ids --max-tokens 64 "abc" >"$W/ds4d.tokens"
with_import=$(used)
release imp
hold priv --private "$W/drafter.gguf"
"$BIN/ds4" --socket "$W/d.sock" run --raw --ids --max-tokens 64 "abc" >/dev/null
with_private=$(used)
release priv

grep -E '^(shared|device)' "$W/imp.out" | sed 's/^/importer: /'
grep -E '^(shared|device)' "$W/priv.out" | sed 's/^/private:  /'
same=no
[ "$(grep '^tokens' "$W/imp.out")" = "$(grep '^tokens' "$W/priv.out")" ] && same=yes
dev_mib=$(awk '/^device/ {printf "%.0f", $5 / 1048576}' "$W/imp.out")
echo "GPU memory used (MiB): before $base, ds4d $daemon, ds4d + importer $with_import, ds4d + private loader $with_private"
echo "the importer saves $((with_private - with_import)) MiB against a private loader; drafter device bytes: $dev_mib MiB"
echo "importer tokens equal the private loader's: $same"
[ "$same" = yes ] || exit 1
grep -q '^shared 1' "$W/imp.out" || { echo "FAIL: the importer did not import the drafter"; exit 1; }
if [ "$GPU" = cuda ]; then
    grep -q '^device 1 1 ' "$W/imp.out" || { echo "FAIL: the importer uploaded the drafter's GPU weights itself:"; cat "$W/imp.err"; exit 1; }
    [ $((with_private - with_import)) -ge $((dev_mib * 9 / 10)) ] || { echo "FAIL: the drafter's device memory is held twice"; exit 1; }
fi
echo "OK"
