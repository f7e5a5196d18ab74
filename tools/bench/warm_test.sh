#!/bin/sh
# ds4-bench --warm: the untimed prefill runs on the timed session's executor (its CPU profile
# then counts two prefill steps, not one), the run reports a prefill figure, and --warm with
# --ssd-streaming is refused as a usage error. A Q8_0 model on the CPU also gets its prefill's
# share of the int8 peak (text and --json).
# Usage: warm_test.sh DS4_BENCH DS4_MAKE_MODEL
. "$(dirname "$0")/test_prologue.sh"
steps() {   # the prefill steps the executor's profile counted
    DS4_CPU_PROFILE=1 "$bench" -m "$dir/m.gguf" --backend cpu --threads 1 --prompt-tokens 64 --gen-tokens 2 "$@" \
        >"$dir/out" 2>"$dir/err" || { cat "$dir/err"; exit 1; }
    grep -q '^prefill  *64 tokens in' "$dir/out" || { echo "no prefill line"; cat "$dir/out"; exit 1; }
    grep -q '^prefill int8  *[0-9.]* M Q8_0 multiply-adds a token: .* of the int8 peak' "$dir/out" ||
        { echo "no int8 share line"; cat "$dir/out"; exit 1; }
    sed -n 's/^ds4 cpu profile, steps of 16+ rows: \([0-9]*\) steps.*/\1/p' "$dir/err"
}
cold=$(steps)
warm=$(steps --warm)
[ "$cold" = 1 ] || { echo "without --warm: $cold prefill steps, want 1"; exit 1; }
[ "$warm" = 2 ] || { echo "with --warm: $warm prefill steps, want 2"; exit 1; }
"$bench" -m "$dir/m.gguf" --backend cpu --threads 1 --prompt-tokens 64 --gen-tokens 2 --json >"$dir/json"
grep -q '"q8_0_macs_per_token":[1-9][0-9]*,"int8_peak_g_s":[0-9]*[1-9][0-9.]*,"prefill_int8_share":0\.[0-9]*[1-9]' "$dir/json" ||
    { echo "--json lacks the int8 share"; cat "$dir/json"; exit 1; }
rc=0
"$bench" -m "$dir/m.gguf" --warm --ssd-streaming >/dev/null 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] || { echo "--warm --ssd-streaming: exit $rc, want 2"; exit 1; }
grep -q -- '--warm' "$dir/err" || { echo "the refusal does not name --warm"; cat "$dir/err"; exit 1; }
echo ok
