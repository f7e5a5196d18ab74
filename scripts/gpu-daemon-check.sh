#!/usr/bin/env bash
# ds4d on the GPU beside ds4d on the CPU, same model, same requests:
#  - 8 concurrent clients on each: greedy outputs compared token for token (the first
#    divergence is reported where rounding flips a token);
#  - a named session saved by the GPU daemon resumes on a CPU daemon and on a GPU daemon
#    over the same state, against uninterrupted conversations on each.
#
#   scripts/gpu-daemon-check.sh [BIN_DIR] [MODEL]     (defaults: build-cuda/bin, the default model)
#
# DS4_CHECK_BACKEND=cpu runs the "GPU" side on the CPU (to check this script without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build-cuda/bin}
MODEL=${2:-models/ds4-pystd-q8_0.gguf}
GPU=${DS4_CHECK_BACKEND:-cuda}
W=$(mktemp -d /tmp/ds4-gpu-check-XXXXXX)
trap 'for p in "$W"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done; rm -rf "$W"' EXIT
ds4() { "$BIN/ds4" --socket "$W/$1.sock" "${@:2}"; }

start() {   # NAME BACKEND STATE_DIR
    "$BIN/ds4d" --model "$MODEL" --socket "$W/$1.sock" --backend "$2" --state-dir "$3" >"$W/$1.log" 2>&1 &
    echo $! >"$W/$1.pid"
    for _ in $(seq 1200); do
        ds4 "$1" stats >/dev/null 2>&1 && return 0
        kill -0 "$(cat "$W/$1.pid")" 2>/dev/null || break
        sleep 0.1
    done
    echo "ds4d ($1, $2) did not start:"; cat "$W/$1.log"; exit 1
}
stop() { kill "$(cat "$W/$1.pid")"; while kill -0 "$(cat "$W/$1.pid")" 2>/dev/null; do sleep 0.1; done; rm "$W/$1.pid"; }

# First differing token between two id lists (space-separated), or "equal".
first_diff() {
    python3 - "$1" "$2" <<'PY'
import sys
a, b = open(sys.argv[1]).read().split(), open(sys.argv[2]).read().split()
for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
        print(f"first divergence at generated token {i}: {x} vs {y} (of {len(a)} / {len(b)})"); sys.exit(1)
print("equal" if len(a) == len(b) else f"prefix-equal, lengths {len(a)} / {len(b)}")
sys.exit(0 if len(a) == len(b) else 1)
PY
}

prompts=("def parse_args(argv):" "import os" "class Stack:" "for i in range(" "with open(path) as f:"
         "def __init__(self, name):" "try:" "return sorted(")
start gpu "$GPU" "$W/gpu-state"
start cpu cpu "$W/cpu-state"
echo "--- GPU daemon"; ds4 gpu stats | grep -E 'model|memory' || true
clients=()
for side in gpu cpu; do
    for i in "${!prompts[@]}"; do
        ds4 $side run --raw --ids --max-tokens 48 "${prompts[$i]}" >"$W/$side.$i" &
        clients+=($!)
    done
done
wait "${clients[@]}"
same=0
for i in "${!prompts[@]}"; do
    if r=$(first_diff "$W/gpu.$i" "$W/cpu.$i"); then same=$((same + 1)); fi
    echo "client $i: $r"
done
echo "8 concurrent clients: $same of ${#prompts[@]} greedy outputs equal GPU vs CPU"

# Named sessions: 'u' runs both turns uninterrupted on each daemon; 's' takes turn 1 on the GPU,
# then the GPU daemon stops and turn 2 runs on a CPU daemon and on a GPU daemon over its state.
t1="def fib(n):" t2="print(fib(10))"
for side in gpu cpu; do
    ds4 $side run --session u --ids --max-tokens 24 "$t1" >/dev/null
    ds4 $side run --session u --ids --max-tokens 24 "$t2" >"$W/ref.$side"
done
ds4 gpu run --session s --ids --max-tokens 24 "$t1" >/dev/null
stop gpu
stop cpu
cp -a "$W/gpu-state" "$W/gpu-state-2"
start cpu2 cpu "$W/gpu-state"
ds4 cpu2 run --session s --ids --max-tokens 24 "$t2" >"$W/resumed.cpu"
stop cpu2
start gpu2 "$GPU" "$W/gpu-state-2"
ds4 gpu2 run --session s --ids --max-tokens 24 "$t2" >"$W/resumed.gpu"
stop gpu2
fail=0
echo "GPU-saved session resumed on the GPU vs uninterrupted GPU: $(first_diff "$W/resumed.gpu" "$W/ref.gpu" || { fail=1; true; })"
echo "GPU-saved session resumed on the CPU vs uninterrupted CPU: $(first_diff "$W/resumed.cpu" "$W/ref.cpu" || true)"
grep -h -i 'restored\|loaded\|resum' "$W"/cpu2.log "$W"/gpu2.log | head -4 || true
exit $fail
