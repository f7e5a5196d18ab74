#!/bin/sh
# ds4-bench refuses bad options before it opens a model: each case exits 2 with a message that
# names the option (a number it cannot read, an option that needs --ssd-streaming, options
# that exclude each other); a good command line on a real model runs.
# Usage: cli_test.sh DS4_BENCH DS4_MAKE_MODEL
. "$(dirname "$0")/test_prologue.sh"
refused() {   # refused WORD ARGS...: exit 2, stderr names WORD, nothing on stdout
    word=$1
    shift
    rc=0
    "$bench" -m "$dir/m.gguf" "$@" >"$dir/out" 2>"$dir/err" || rc=$?
    [ "$rc" = 2 ] || { echo "ds4-bench $*: exit $rc, want 2"; cat "$dir/err"; exit 1; }
    grep -q -- "$word" "$dir/err" || { echo "ds4-bench $*: the error does not name $word"; cat "$dir/err"; exit 1; }
    [ ! -s "$dir/out" ] || { echo "ds4-bench $*: printed a result"; cat "$dir/out"; exit 1; }
}
refused --prompt-tokens --prompt-tokens abc
refused --prompt-tokens --prompt-tokens 0
refused --threads --threads -1
refused --prompt-seed --prompt-seed x1
refused --expert-cache-bytes --ssd-streaming --expert-cache-bytes 4GiB
refused --expert-cache-experts --ssd-streaming --expert-cache-experts -3
refused --raw-bytes --ssd-streaming --raw-bytes ''
refused --ssd-streaming --expert-cache-bytes 1000000
refused --ssd-streaming --hit-curve
refused --ssd-streaming --raw-bytes 4096
refused --ssd-streaming --cold
refused 'not both' --ssd-streaming --expert-cache-bytes 1000000 --expert-cache-experts 4
refused --page-out-experts --ssd-streaming --page-out-experts
refused --warm --ssd-streaming --warm
refused --backend --backend tpu
refused --bogus --bogus
refused --gen-tokens --gen-tokens
"$bench" -m "$dir/m.gguf" --backend cpu --threads 1 --prompt-tokens 16 --gen-tokens 2 --prompt-seed 7 >"$dir/out"
grep -q '^prefill  *16 tokens in' "$dir/out" || { echo "a good command line did not run"; cat "$dir/out"; exit 1; }
echo ok
