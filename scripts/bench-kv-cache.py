#!/usr/bin/env python3
"""Time to first token of a long prompt, cold and after a server restart (issue #7's measurement).

Starts `dsv4 serve --kv-disk-dir DIR` on MODEL, sends one chat request whose
system prompt is about --tokens tokens long (max_tokens 1, so the request time is
the time to the first token), stops the server with SIGTERM (a clean shutdown
saves every live session), starts it again and sends the same system prompt
with a different question. Prints the two times, their ratio, the cached tokens
the second reply reports, the cache files and the server's store/restore log
lines (size and milliseconds), and writes them as CSV with --csv.

  scripts/bench-kv-cache.py --bin build/tools/dsv4 -m MODEL [--tokens 25000] [--csv OUT] [-- serve flags...]

Needs only python3. The cache directory is a fresh temporary one (removed at the end, or kept
with --keep-dir).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PARAGRAPH = ("You are a careful coding agent. Read the repository before changing it, keep every "
             "change small, run the tests after each step and explain what you did and why. ")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        sys.exit(f"bench-kv-cache: {path}: HTTP {e.code}: {e.read().decode(errors='replace')[:500]}")


class Server:
    def __init__(self, args, cache_dir, log_path):
        self.port = free_port()
        cmd = [args.bin, "serve", "-m", args.model, "--port", str(self.port), "--kv-disk-dir", cache_dir,
               "--ctx", str(args.tokens + 2048)] + args.serve_args
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + args.load_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"bench-kv-cache: the server exited ({self.proc.returncode}); see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.proc.kill()
        sys.exit(f"bench-kv-cache: the server did not answer /health within {args.load_timeout} s")

    def stop(self, timeout):
        self.proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        code = self.proc.wait(timeout=timeout)
        self.log.close()
        return code, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/tools/dsv4")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=25000, help="system prompt length to aim for")
    ap.add_argument("--csv")
    ap.add_argument("--keep-dir", action="store_true")
    ap.add_argument("--load-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=3600)
    ap.add_argument("serve_args", nargs="*", help="extra dsv4 serve flags (after --)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="dsv4-kvbench-")
    cache_dir = os.path.join(work, "kv")
    try:
        srv = Server(args, cache_dir, os.path.join(work, "serve1.log"))
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/v1/models", timeout=10) as r:
            model_id = json.loads(r.read())["data"][0]["id"]
        # Size the system prompt with the server's own tokenizer.
        unit = post(srv.port, "/v1/messages/count_tokens",
                    {"model": model_id, "messages": [{"role": "user", "content": PARAGRAPH * 10}]}, 60)["input_tokens"]
        reps = max(1, int(args.tokens / max(1, unit / 10.0)))
        system = PARAGRAPH * reps

        def ask(question):
            body = {"model": model_id, "max_tokens": 1, "temperature": 0,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
            t0 = time.time()
            r = post(srv.port, "/v1/chat/completions", body, args.request_timeout)
            return time.time() - t0, r["usage"]

        cold_s, cold_usage = ask("Which file holds the tokenizer?")
        code1, stop1_s = srv.stop(600)
        srv = Server(args, cache_dir, os.path.join(work, "serve2.log"))
        warm_s, warm_usage = ask("Where are the tests?")
        code2, _ = srv.stop(600)

        files = sorted((f, os.path.getsize(os.path.join(cache_dir, f))) for f in os.listdir(cache_dir) if f.endswith(".kv"))
        logs = ""
        for name in ("serve1.log", "serve2.log"):
            with open(os.path.join(work, name)) as f:
                logs += "".join(l for l in f if "KV disk cache" in l)
        cached = (warm_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows = [("prompt_tokens", warm_usage["prompt_tokens"]), ("cold_ttft_s", f"{cold_s:.3f}"),
                ("warm_ttft_s", f"{warm_s:.3f}"), ("warm_over_cold_pct", f"{100.0 * warm_s / cold_s:.2f}"),
                ("warm_cached_tokens", cached), ("shutdown_s", f"{stop1_s:.2f}"),
                ("cache_files", len(files)), ("cache_bytes", sum(s for _, s in files))]
        print(logs, end="")
        print(f"server exits: {code1}, {code2}")
        for k, v in rows:
            print(f"{k:20s} {v}")
        if args.csv:
            with open(args.csv, "w") as f:
                f.write(f"# scripts/bench-kv-cache.py, model {args.model}, serve flags {' '.join(args.serve_args)}\n")
                f.write(",".join(k for k, _ in rows) + "\n" + ",".join(str(v) for _, v in rows) + "\n")
        return 0 if cached > 0 and code1 == 0 and code2 == 0 else 1
    finally:
        if args.keep_dir:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
