#!/usr/bin/env bash
# Issue 16's side-by-side GPU figures in one device command: our ds4-bench and the peer
# (antirez's ds4, built from PEER_DIR by its bench-ds4.sh) on the same full-size V4-Flash file
# in ds4's Q2 layout (written sparse by PEER_DIR/ds4_sparse_gguf.py: 80.8 GiB apparent, ~4 MB
# on disk), at 2K and 4K context; then a 12-layer flash-shape ds4-q2 file with random weights
# (~25 GB), where zero-weight routing cannot flatter the figure. BASE_BENCH (optional) is a
# ds4-bench of another revision (scripts/gpu-pack.sh --base REV puts one at gpu-base/ds4-bench),
# run on the same files at 4K for before/after figures. The peer's CSV is copied to OUT.
#
#   scripts/gpu-vs-peer.sh BIN_DIR PEER_DIR [BASE_BENCH] [OUT]
#
# PEER_DIR holds bench-ds4.sh, ds4_sparse_gguf.py and ds4/ (copy them into an ignored folder
# of the checkout that travels to the GPU machine). About 3 minutes of GPU time.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/gpu-vs-peer.sh BIN_DIR PEER_DIR [BASE_BENCH] [OUT]}
peer=${2:?usage: scripts/gpu-vs-peer.sh BIN_DIR PEER_DIR [BASE_BENCH] [OUT]}
base=${3:-}
out=${4:-${TMPDIR:-/tmp}/ds4-vs-peer}
tmp=${TMPDIR:-/tmp}
mkdir -p "$out"
[ -x "$bin/ds4-bench" ] && [ -x "$bin/ds4-make-model" ] || { echo "gpu-vs-peer: no ds4-bench / ds4-make-model in $bin" >&2; exit 1; }
[ -f "$peer/bench-ds4.sh" ] && [ -f "$peer/ds4_sparse_gguf.py" ] || { echo "gpu-vs-peer: $peer lacks bench-ds4.sh / ds4_sparse_gguf.py" >&2; exit 1; }
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
bench() {   # label bench-binary model prompt-tokens
    echo "-- $1, $4-token prompt"
    timeout 200 "$2" -m "$3" --backend cuda --prompt-tokens "$4" --gen-tokens 128 2>&1 | tr '\r' '\n' |
        grep -E "^(prefill|decode|weights/token|achieved|device)"
}
step "full-size V4-Flash file (sparse, ds4's Q2 layout)"
v4=$tmp/ds4-v4-flash-sparse.gguf
python3 "$peer/ds4_sparse_gguf.py" --out "$v4" >/dev/null || { echo "gpu-vs-peer: writing $v4 failed" >&2; exit 1; }
for p in 2048 4096; do bench ours "$bin/ds4-bench" "$v4" $p; done
[ -n "$base" ] && bench base "$base" "$v4" 4096
step "the peer on the same file"
timeout 300 bash "$peer/bench-ds4.sh" "$v4" "$out" > "$out/peer.log" 2>&1
echo "peer exit $?"
tail -3 "$out/peer.log"
rm -f "$v4"
step "12-layer flash-shape ds4-q2, random weights"
f12=$tmp/ds4-flash12-q2.gguf
"$bin/ds4-make-model" --preset flash-shape --expert-type ds4-q2 --layers 12 --quiet "$f12" || exit 1
bench ours "$bin/ds4-bench" "$f12" 4096
[ -n "$base" ] && bench base "$base" "$f12" 4096
rm -f "$f12"
step done
