#!/bin/sh
# ds4-bench-daemon end to end on a tiny model with its own ds4d: --json carries the per-token
# figures and the machine floors, the CPU-outside-the-step figures only with --threads 1
# (where a step's wall time stands for its CPU time), and a bad count is refused.
# Usage: daemon_bench_test.sh DS4_BENCH_DAEMON DS4D DS4_MAKE_MODEL
set -eu
bench=$1
ds4d=$2
make_model=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$make_model" --preset tiny --type q8_0 --quiet "$dir/m.gguf"
run() {
    "$bench" --model "$dir/m.gguf" --ds4d "$ds4d" --tokens 8 --reps 1 --rtt-iters 20 --prompt-tokens 8 --json "$@" \
        >"$dir/json" 2>"$dir/err" || { echo "ds4-bench-daemon $* failed"; cat "$dir/err"; exit 1; }
}
has() { grep -q "\"$1\":[-0-9]" "$dir/json" || { echo "no $1 in: $(cat "$dir/json")"; exit 1; }; }
run --threads 1
for f in token_outside_step_socket_us token_outside_step_inprocess_us thread_ping_pong_us send_wake_us \
         cpu_outside_step_socket_us cpu_outside_step_inprocess_us cpu_outside_step_overhead_us; do
    has "$f"
done
grep -q '"send_wake_us":0\.00' "$dir/json" && { echo "the send-wake floor came out 0"; exit 1; }
grep -q '"threads":1,"tokens":8' "$dir/json" || { echo "wrong shape: $(cat "$dir/json")"; exit 1; }
run --threads 2
has send_wake_us
grep -q cpu_outside_step "$dir/json" && { echo "CPU outside the step reported with 2 threads"; exit 1; }
rc=0
"$bench" --model "$dir/m.gguf" --ds4d "$ds4d" --tokens 0 >/dev/null 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] || { echo "--tokens 0: exit $rc, want 2"; exit 1; }
grep -q -- '--tokens' "$dir/err" || { echo "the refusal does not name --tokens"; cat "$dir/err"; exit 1; }
echo ok
