#!/usr/bin/env bash
# The curl steps of docs/demo.md against a running demo, each checked.
#
#   make serve                      # in one terminal
#   scripts/demo_walkthrough.sh     # in another (YARD=http://host:port to point elsewhere)
#
# Writes announcement.wav, yard.png and later.wav into a temporary directory
# and prints where. Exits non-zero at the first step that does not answer as
# the docs say.
set -euo pipefail

YARD=${YARD:-http://127.0.0.1:8080}
NOTEBOOK="Authorization: Bearer sk-notebook"
ANNOUNCER="Authorization: Bearer sk-announcer"
JSON="Content-Type: application/json"
OUT=$(mktemp -d)

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

step "healthz"
curl -sf "$YARD/healthz" || fail "yard is not answering at $YARD (is make serve running?)"

step "models"
curl -sf "$YARD/v1/models" -H "$NOTEBOOK" | grep -q '"tiny-llama"' || fail "tiny-llama not listed"
echo "tiny-llama, tts-joe, tiny-image listed"

step "chat (the first request loads llama-server)"
curl -sf -D "$OUT/headers" "$YARD/v1/chat/completions" -H "$NOTEBOOK" -H "$JSON" \
  -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello, yard!"}], "max_tokens": 16}' \
  | grep -q '"completion_tokens"' || fail "no chat completion"
grep -i '^x-yard-' "$OUT/headers"

step "streaming chat"
events=$(curl -sfN "$YARD/v1/chat/completions" -H "$ANNOUNCER" -H "$JSON" \
  -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Stream, please."}], "max_tokens": 8, "stream": true}' \
  | grep -c '^data: ')
[ "$events" -ge 3 ] || fail "only $events server-sent events"
echo "$events server-sent events"

step "text completion"
curl -sf "$YARD/v1/completions" -H "$NOTEBOOK" -H "$JSON" \
  -d '{"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 8}' \
  | grep -q '"text_completion"' || fail "no text completion"
echo ok

step "speech (loads piper)"
curl -sf "$YARD/v1/audio/speech" -H "$ANNOUNCER" -H "$JSON" \
  -d '{"model": "tts-joe", "voice": "joe", "input": "The two o clock announcement starts now."}' \
  -o "$OUT/announcement.wav"
head -c 4 "$OUT/announcement.wav" | grep -q RIFF || fail "not a WAV file"
echo "$(wc -c < "$OUT/announcement.wav") bytes of WAV"

step "image"
curl -sf "$YARD/v1/images/generations" -H "$NOTEBOOK" -H "$JSON" \
  -d '{"model": "tiny-image", "prompt": "a yard at dusk"}' \
  | python3 -c 'import sys, json, base64; sys.stdout.buffer.write(base64.b64decode(json.load(sys.stdin)["data"][0]["b64_json"]))' \
  > "$OUT/yard.png"
head -c 8 "$OUT/yard.png" | grep -q PNG || fail "not a PNG file"
echo "$(wc -c < "$OUT/yard.png") bytes of PNG"

step "a server by name: piper's own API"
curl -sf "$YARD/backends/tts/synthesize" -H "$NOTEBOOK" -H "$JSON" \
  -d '{"text": "Hello from piper."}' -o "$OUT/piper.wav"
head -c 4 "$OUT/piper.wav" | grep -q RIFF || fail "not a WAV file"
echo ok

step "a job"
location=$(curl -sf -D - -o /dev/null "$YARD/v1/audio/speech" -H "$NOTEBOOK" -H "Prefer: respond-async" \
  -H "$JSON" -d '{"model": "tts-joe", "voice": "joe", "input": "This one can wait."}' \
  | tr -d '\r' | awk 'tolower($1) == "location:" {print $2}')
[ -n "$location" ] || fail "no Location for the job"
echo "job at $location"
for _ in $(seq 60); do
  status=$(curl -sf "$YARD$location" -H "$NOTEBOOK" | python3 -c 'import sys, json; print(json.load(sys.stdin)["status"])')
  [ "$status" = succeeded ] && break
  sleep 0.5
done
[ "$status" = succeeded ] || fail "job status $status"
curl -sf "$YARD$location/result" -H "$NOTEBOOK" -o "$OUT/later.wav"
head -c 4 "$OUT/later.wav" | grep -q RIFF || fail "job result is not a WAV file"
echo "succeeded; result fetched"

step "errors"
code=$(curl -s -o /dev/null -w '%{http_code}' "$YARD/v1/chat/completions" -H "$JSON" -d '{"model": "tiny-llama"}')
[ "$code" = 401 ] || fail "expected 401 without a key, got $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "$YARD/v1/chat/completions" -H "$NOTEBOOK" -H "$JSON" \
  -d '{"model": "gpt-4", "messages": []}')
[ "$code" = 404 ] || fail "expected 404 for an unknown model, got $code"
echo "401 without a key, 404 for an unknown model"

printf '\nAll steps answered as docs/demo.md says. Files in %s\n' "$OUT"
