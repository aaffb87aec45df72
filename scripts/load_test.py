#!/usr/bin/env python3
"""HTTP load test of `dsv4 serve`: N clients stream chat completions at once.

Reports time to first token (TTFT) and inter-token latency (ITL) p50 / p99,
aggregate and per-stream decode tokens/s, as a table and one JSON line; exits
1 if any request failed or came back incomplete. Python standard library only,
so it runs wherever the server does.

  # against a running server
  scripts/load_test.py --url http://127.0.0.1:8000 --clients 16 --requests 64 --max-tokens 256
  # start one (the tiny synthetic model unless --model): what CI runs
  scripts/load_test.py --serve build/tools/dsv4 --serve-arg=--parallel=4 --clients 8 --requests 32
  # mixed: one long prompt (--long-words words) first, the others while it is prefilled
  scripts/load_test.py --url ... --clients 16 --long-words 20000

Every request asks for exactly --max-tokens tokens (ignore_eos) with thinking
off, so the counts do not depend on the model. TTFT: request sent -> first
content chunk. ITL: gaps between consecutive content chunks of a stream (the
server sends one chunk per token unless a stop string holds text back).
Aggregate tokens/s: all completion tokens / wall time of the run.
"""
import argparse
import http.client
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100.0 * len(v)))]


def stream_chat(host, port, body, timeout):
    """One streamed request: (ttft_s, gaps, completion_tokens, error, prompt_tokens)."""
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return None, [], 0, "HTTP %d %s" % (r.status, r.read(300)), 0
        first, last, gaps, tokens, prompt, done = None, None, [], 0, 0, False
        buf = b""
        while not done:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(4096)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                frame, buf = buf.split(b"\n\n", 1)
                for line in frame.split(b"\n"):
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        done = True
                        continue
                    j = json.loads(data)
                    if j.get("usage"):
                        tokens = j["usage"]["completion_tokens"]
                        prompt = j["usage"]["prompt_tokens"]
                    for c in j.get("choices", []):
                        d = c.get("delta", {})
                        if d.get("content") or d.get("reasoning_content"):
                            now = time.monotonic()
                            if first is None:
                                first = now
                            else:
                                gaps.append(now - last)
                            last = now
        if not done:
            return None, [], 0, "stream ended without [DONE]", 0
        return (first - t0) if first else None, gaps, tokens, None, prompt
    except Exception as e:  # a refused or dropped connection is a failed request
        return None, [], 0, "%s: %s" % (type(e).__name__, e), 0
    finally:
        conn.close()


def start_server(binary, model, serve_args, ctx):
    tmp = None
    if not model:
        tmp = tempfile.mkdtemp(prefix="dsv4_load_")
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([binary, "synth", "--preset", "tiny", "-o", model], check=True, stdout=subprocess.DEVNULL)
    args = [binary, "serve", "-m", model, "--port", "0", "--ctx", str(ctx)] + serve_args
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            # keep draining stderr so the server never blocks on a full pipe
            threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()
            return proc, int(m.group(1)), log, tmp
    proc.kill()
    sys.exit("dsv4 serve did not start:\n" + "".join(log[-30:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (else --serve starts one)")
    ap.add_argument("--serve", metavar="DSV4_BIN", help="start `DSV4_BIN serve` on a free port")
    ap.add_argument("--model", help="with --serve: the model (default: the tiny synthetic one)")
    ap.add_argument("--serve-arg", action="append", default=[], help="with --serve: an extra flag (repeatable)")
    ap.add_argument("--ctx", type=int, default=4096, help="with --serve: --ctx")
    ap.add_argument("--clients", type=int, default=8, help="requests in flight at once (0 with --long-words: it alone)")
    ap.add_argument("--requests", type=int, default=0, help="requests in all (default: one per client)")
    ap.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request")
    ap.add_argument("--prompt-words", type=int, default=32, help="words in each prompt")
    ap.add_argument("--long-words", type=int, default=0,
                    help="mixed run: one request with a prompt of this many words starts first (max_tokens 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a request may take")
    ap.add_argument("--json", help="also append the JSON result to this file")
    a = ap.parse_args()
    if not a.url and not a.serve:
        ap.error("--url or --serve is required")
    total = a.requests or a.clients

    proc = tmp = None
    if a.serve:
        proc, port, log, tmp = start_server(a.serve, a.model, a.serve_arg, a.ctx)
        host = "127.0.0.1"
    else:
        u = urllib.parse.urlparse(a.url)
        host, port = u.hostname, u.port or 80

    # Common English words: about one token each with the DeepSeek tokenizer, so --long-words ~ prompt tokens.
    common = ("the of and to in is that for it as was with be by on not he this are or his from at which but have "
              "an they you were her she there been one all we their has would when if so no what up out who them "
              "some more time could into only other then its two may first any new like our over also").split()

    run_id = "%08x" % random.getrandbits(32)  # no prompt of this run is a prefix the server holds already

    def body(i, words, max_tokens):
        text = "run %s request %d: " % (run_id, i) + " ".join(common[(i * 7919 + k * 31) % len(common)] for k in range(words))
        return {"model": "deepseek-chat", "messages": [{"role": "user", "content": text}], "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0}

    results, lock = [], threading.Lock()
    long_result = {}
    if a.long_words > 0:
        def long_request():
            t0 = time.monotonic()
            ttft, _, _, err, prompt = stream_chat(host, port, body(-1, a.long_words, 1), a.timeout)
            long_result.update(ttft=ttft, error=err, wall=time.monotonic() - t0, prompt=prompt)
        long_thread = threading.Thread(target=long_request)
        long_thread.start()
        time.sleep(0.5)  # the long prompt is being prefilled when the others arrive
    next_i = [0]

    def client():
        while True:
            with lock:
                i = next_i[0]
                if i >= total:
                    return
                next_i[0] += 1
            r = stream_chat(host, port, body(i, a.prompt_words, a.max_tokens), a.timeout)
            with lock:
                results.append(r)

    wall0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - wall0
    if a.long_words > 0:
        long_thread.join()

    errors = [r[3] for r in results if r[3]]
    if long_result.get("error"):
        errors.append("long request: " + long_result["error"])
    ttft = [r[0] for r in results if r[0] is not None]
    gaps = [g for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    incomplete = sum(1 for r in results if not r[3] and r[2] != a.max_tokens)
    per_stream = [r[2] / (r[0] + sum(r[1])) for r in results if r[0] and r[2] and not r[3]]
    per_stream_decode = [(len(r[1])) / sum(r[1]) for r in results if r[1] and sum(r[1]) > 0]
    report = {
        "clients": a.clients, "requests": len(results), "max_tokens": a.max_tokens, "prompt_words": a.prompt_words,
        "errors": len(errors), "incomplete": incomplete,
        "ttft_p50_ms": round(pct(ttft, 50) * 1000, 1), "ttft_p99_ms": round(pct(ttft, 99) * 1000, 1),
        "itl_p50_ms": round(pct(gaps, 50) * 1000, 2), "itl_p99_ms": round(pct(gaps, 99) * 1000, 2),
        "aggregate_tps": round(tokens / wall, 1) if wall > 0 else 0,
        "stream_decode_tps_mean": round(sum(per_stream_decode) / len(per_stream_decode), 1) if per_stream_decode else 0,
        "stream_tps_mean": round(sum(per_stream) / len(per_stream), 1) if per_stream else 0,
        "completion_tokens": tokens, "wall_s": round(wall, 2),
    }
    if a.long_words > 0:
        report["long_words"] = a.long_words
        report["long_ttft_s"] = round(long_result["ttft"], 2) if long_result.get("ttft") else None
        report["long_prompt_tokens"] = long_result.get("prompt", 0)
        if long_result.get("ttft"):
            report["long_prefill_tps"] = round(report["long_prompt_tokens"] / long_result["ttft"], 1)

    print("%-26s %s" % ("clients x requests", "%d x %d (max_tokens %d)" % (a.clients, len(results), a.max_tokens)))
    for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "aggregate_tps", "stream_decode_tps_mean",
              "errors"):
        print("%-26s %s" % (k, report[k]))
    if a.long_words > 0:
        print("%-26s %s (%s tokens)" % ("long prompt TTFT s", report["long_ttft_s"], report["long_prompt_tokens"]))
    print(json.dumps(report))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(report) + "\n")
    for e in errors[:10]:
        print("error:", e, file=sys.stderr)
    if proc:
        proc.terminate()
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        if code != 0:
            errors.append("server exit %s" % code)
            print("server exit %s:\n%s" % (code, "".join(log[-20:])), file=sys.stderr)
    if tmp:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    ok = not errors and incomplete == 0 and len(results) == total
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
