#!/usr/bin/env bash
# End-to-end test of ds4-gateway: ds4d serving the scripted fixture model, the gateway in
# front, the official OpenAI / Anthropic npm clients (pinned, installed into the build tree)
# through sdk_test.mjs, then curl checks of the error shapes and the start-up refusals.
# Exit 77 (ctest: skipped) with the reason when node or the npm registry is unavailable.
# Usage: run_e2e.sh BIN_DIR NPM_DIR
set -uo pipefail
BIN=$1
NPM_DIR=$2
HERE=$(cd "$(dirname "$0")" && pwd)
OPENAI_VERSION=7.60.0
ANTHROPIC_VERSION=1.16.0

skip() { echo "SKIPPED: $*"; exit 77; }
command -v node >/dev/null || skip "node is not installed"
command -v curl >/dev/null || skip "curl is not installed"
stamp="$NPM_DIR/.installed-$OPENAI_VERSION-$ANTHROPIC_VERSION"
if [ ! -f "$stamp" ]; then
  command -v npm >/dev/null || skip "npm is not installed"
  mkdir -p "$NPM_DIR"
  echo '{"private":true}' > "$NPM_DIR/package.json"
  if ! (cd "$NPM_DIR" && timeout 180 npm install --no-audit --no-fund --silent \
          "openai@$OPENAI_VERSION" "@anthropic-ai/sdk@$ANTHROPIC_VERSION" >npm.log 2>&1); then
    tail -5 "$NPM_DIR/npm.log"
    skip "npm could not install openai@$OPENAI_VERSION and @anthropic-ai/sdk@$ANTHROPIC_VERSION (registry unreachable?)"
  fi
  touch "$stamp"
fi

TMP=$(mktemp -d /tmp/ds4-gw-e2e-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- ds4d"; tail -20 "$TMP/d.log"; echo "--- gateway"; tail -20 "$TMP/g.log"; exit 1; }

"$BIN/ds4-make-model" --preset scripted --quiet "$TMP/scripted.gguf" || fail "ds4-make-model"
"$BIN/ds4d" --model "$TMP/scripted.gguf" --socket "$TMP/ds4.sock" --no-store --threads 1 >"$TMP/d.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$TMP/ds4.sock" ] && break; sleep 0.1; done
[ -S "$TMP/ds4.sock" ] || fail "ds4d did not start"
"$BIN/ds4-gateway" --socket "$TMP/ds4.sock" --listen 127.0.0.1:0 --port-file "$TMP/port" \
  --state-dir "$TMP/state" --max-body 65536 --timeout 30 >"$TMP/g.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$TMP/port" ] && break; sleep 0.1; done
[ -s "$TMP/port" ] || fail "ds4-gateway did not start"
URL="http://127.0.0.1:$(cat "$TMP/port")"
KEY=$("$BIN/ds4-gateway" --state-dir "$TMP/state" --print-key)
[ "$(stat -c %a "$TMP/state/http-key")" = 600 ] || fail "key file mode is not 600"

# A second ds4d + gateway on the default model (a raw Python model, no chat template), for the
# JSON-output tests: what it writes is JSON only because the constraint makes it so.
DEFAULT_MODEL="$HERE/../../models/ds4-pystd-q8_0.gguf"
if [ -f "$DEFAULT_MODEL" ]; then
  "$BIN/ds4d" --model "$DEFAULT_MODEL" --socket "$TMP/d2.sock" --no-store --threads 1 >"$TMP/d2.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$TMP/d2.sock" ] && break; sleep 0.1; done
  [ -S "$TMP/d2.sock" ] || fail "ds4d on the default model did not start"
  "$BIN/ds4-gateway" --socket "$TMP/d2.sock" --listen 127.0.0.1:0 --port-file "$TMP/port2" --no-auth \
    --state-dir "$TMP/state2" --timeout 30 >"$TMP/g2.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$TMP/port2" ] && break; sleep 0.1; done
  [ -s "$TMP/port2" ] || fail "the second ds4-gateway did not start"
  export GW_JSON_URL="http://127.0.0.1:$(cat "$TMP/port2")"
fi

# The answer's first token id: what the model writes after the raw prompt "Weather?>".
ANSWER_TOKEN=$("$BIN/ds4" --socket "$TMP/ds4.sock" run --raw --ids --temperature 0 --max-tokens 1 "Weather?>" | tr -d ' \n')
GW_URL=$URL GW_KEY=$KEY ANSWER_TOKEN=$ANSWER_TOKEN NODE_MODULES_DIR="$NPM_DIR/node_modules" timeout 300 node "$HERE/sdk_test.mjs" || fail "sdk_test.mjs"

# curl: status and error shape. check METHOD PATH STATUS JQ-LIKE-SUBSTRING [curl args...]
check() {
  local method=$1 path=$2 want=$3 needle=$4; shift 4
  local body status
  body=$(curl -s -o - -w '\n%{http_code}' -X "$method" "$URL$path" "$@")
  status=${body##*$'\n'}
  body=${body%$'\n'*}
  [ "$status" = "$want" ] || fail "$method $path: status $status, want $want: $body"
  [[ "$body" == *"$needle"* ]] || fail "$method $path: body lacks $needle: $body"
  echo "ok   curl $method $path -> $status"
}
AUTH=(-H "Authorization: Bearer $KEY")
CHAT='{"model":"m","messages":[{"role":"user","content":"x"}]'
check GET /health 200 '"status":"ok"'
check GET /v1/models 401 '"code":"invalid_api_key"'
check POST /v1/chat/completions 401 '"error":{"message"' -d "$CHAT}"
check POST /v1/messages 401 '{"type":"error","error":{"type":"authentication_error"' -H "Authorization: Bearer nope"
check POST /v1/chat/completions 400 '"code":"invalid_json"' "${AUTH[@]}" -d '{"messages":'
check POST /v1/chat/completions 400 '"param":"top_logprobs"' "${AUTH[@]}" -d "$CHAT,\"logprobs\":true,\"top_logprobs\":21}"
check POST /v1/chat/completions 400 '"param":"frequency_penalty"' "${AUTH[@]}" -d "$CHAT,\"frequency_penalty\":3}"
check POST /v1/chat/completions 400 '"param":"logit_bias"' "${AUTH[@]}" -d "$CHAT,\"logit_bias\":{\"x\":1}}"
check POST /v1/completions 400 '"code":"unsupported_parameter"' "${AUTH[@]}" -d '{"model":"m","prompt":"x","echo":true}'
check POST /v1/chat/completions 400 '"param":"response_format.json_schema.schema"' "${AUTH[@]}" -d "$CHAT,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"array\"}}}}"
check POST /v1/chat/completions 400 '"param":"messages"' "${AUTH[@]}" -d '{"model":"m","messages":[]}'
check POST /v1/messages 400 '"type":"invalid_request_error"' -H "x-api-key: $KEY" -d "$CHAT}"
check POST /v1/nothing 404 '"code":"unknown_url"' "${AUTH[@]}" -d '{}'
check GET /v1/chat/completions 405 '"code":"method_not_allowed"' "${AUTH[@]}"
head -c 100000 /dev/zero | tr '\0' 'a' > "$TMP/big"
check POST /v1/chat/completions 413 '"error"' "${AUTH[@]}" --data-binary "@$TMP/big"
check GET /metrics 200 'ds4_gateway_completion_tokens_total' "${AUTH[@]}"
check GET /metrics 200 'ds4d_decode_tokens_per_second' "${AUTH[@]}"
{ printf 'X-Big: '; head -c 200000 /dev/zero | tr '\0' 'b'; echo; } > "$TMP/big-header"
status=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models" "${AUTH[@]}" -H "@$TMP/big-header")
[ "$status" = 431 ] || [ "$status" = 413 ] || [ "$status" = 000 ] || fail "oversized header: status $status"
echo "ok   curl oversized header -> $status"

# Start-up refusals: no key on a non-loopback address; a key file others can read.
if "$BIN/ds4-gateway" --socket "$TMP/ds4.sock" --listen 0.0.0.0:0 --no-auth >"$TMP/r.log" 2>&1; then
  fail "--no-auth on 0.0.0.0 was accepted"
fi
grep -q "non-loopback" "$TMP/r.log" || fail "refusal does not say why: $(cat "$TMP/r.log")"
echo "ok   --no-auth on 0.0.0.0 refused"
cp "$TMP/state/http-key" "$TMP/open-key" && chmod 644 "$TMP/open-key"
if "$BIN/ds4-gateway" --key-file "$TMP/open-key" --print-key >"$TMP/r.log" 2>&1; then fail "a 0644 key file was accepted"; fi
echo "ok   world-readable key file refused"
echo "PASSED"
