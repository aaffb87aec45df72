// Starts `dsv4 serve` for the SDK tests and the load test, and stops it.
//
// Environment (set by run_tests.sh): DSV4_BIN (the dsv4 binary), DSV4_MODEL
// (a model GGUF; the tiny synthetic one in CI). The server listens on a free
// loopback port (--port 0) that it reports on stderr.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

export const here = path.dirname(fileURLToPath(import.meta.url));

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (run the tests through tests/server/run_tests.sh)`);
  return v;
}

// Starts a server with extra flags; resolves once it listens.
// Returns {baseURL, port, stderr(), stop(signal) -> exit code}.
export async function startServer(extraArgs = [], { ctx = 4096 } = {}) {
  const args = ['serve', '-m', env('DSV4_MODEL'), '--port', '0', '--ctx', String(ctx), '--keepalive', '1', ...extraArgs];
  const child = spawn(env('DSV4_BIN'), args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`dsv4 serve did not start:\n${log}`)), 60000);
    child.stderr.on('data', (d) => {
      log += d.toString();
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`dsv4 serve exited with ${code}:\n${log}`));
    });
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    port,
    baseURL: `http://127.0.0.1:${port}`,
    stderr: () => log,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode !== null) return { code: child.exitCode, signal: null };
      child.kill(signal);
      // (unref: a pending timer must not keep the test process alive)
      const timeout = new Promise((resolve) => setTimeout(() => resolve({ code: 'timeout' }), 60000).unref());
      return Promise.race([exited, timeout]);
    },
  };
}

// Reads a counter from GET /metrics.
export async function metric(baseURL, name, headers = {}) {
  const text = await (await fetch(`${baseURL}/metrics`, { headers })).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}
