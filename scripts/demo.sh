#!/usr/bin/env bash
# The main job: set up and build, then start ds4d on the embedded default model and ask
# it something through the ds4 client. Usage: scripts/demo.sh [PROMPT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
B=${DS4_BUILD_DIR:-build}

# The embedded default: the trained model committed under models/ when present, else a
# deterministic random tiny model (it runs end to end but writes noise).
MODEL=${DS4_MODEL:-}
if [ -z "$MODEL" ]; then
  if [ -f models/ds4-pystd-q8_0.gguf ]; then
    MODEL=models/ds4-pystd-q8_0.gguf
  else
    MODEL=$B/models/tiny.gguf
    [ -f "$MODEL" ] || { mkdir -p "$B/models"; "$B/bin/ds4-make-model" --preset tiny --quiet "$MODEL"; }
  fi
fi
PROMPT=${1:-$'def fibonacci(n):\n    if n'}

SOCK=$(mktemp -u /tmp/ds4-demo-XXXXXX.sock)
"$B/bin/ds4d" --model "$MODEL" --socket "$SOCK" --ctx 1024 2>"$B/ds4d-demo.log" &
DPID=$!
trap 'kill $DPID 2>/dev/null || true; wait $DPID 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -S "$SOCK" ] && break
  kill -0 $DPID 2>/dev/null || { echo "ds4d failed to start:" >&2; cat "$B/ds4d-demo.log" >&2; exit 1; }
  sleep 0.1
done
[ -S "$SOCK" ] || { echo "ds4d did not start listening" >&2; cat "$B/ds4d-demo.log" >&2; exit 1; }

echo "model: $MODEL" >&2
echo "prompt: $PROMPT" >&2
echo "---" >&2
printf '%s' "$PROMPT"
# Greedy with a repetition penalty: a model this small loops without one.
"$B/bin/ds4" --socket "$SOCK" run --raw --max-tokens "${DS4_MAX_TOKENS:-96}" \
  --repeat-penalty "${DS4_REPEAT_PENALTY:-1.3}" "$PROMPT"
echo
echo "---" >&2
"$B/bin/ds4" --socket "$SOCK" stats >&2
