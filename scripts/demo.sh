#!/usr/bin/env bash
# The main job on the built-in tiny model: make a random-weight tiny model,
# start `dsv4 serve` on it, send one OpenAI-style chat request, print the
# answer, and stop the server. The model is random, so the text is gibberish;
# what matters is that the whole path (load, tokenize, render, generate,
# stream, parse, serve) works end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
DSV4="$BUILD_DIR/tools/dsv4"
PORT=${PORT:-8091}
[ -x "$DSV4" ] || { echo "demo: $DSV4 not built; run scripts/build.sh first" >&2; exit 1; }

[ -f tiny.gguf ] || "$DSV4" synth --preset tiny -o tiny.gguf
"$DSV4" inspect tiny.gguf | tail -3

"$DSV4" serve -m tiny.gguf --backend cpu --host 127.0.0.1 --port "$PORT" --ctx 4096 > demo-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  sleep 0.1
done

echo "POST /v1/chat/completions:"
curl -sS "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "deepseek-chat",
  "messages": [{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "Say hello in three words."}],
  "max_tokens": 24, "temperature": 0
}' | python3 -m json.tool
echo "server log:"
tail -3 demo-server.log
