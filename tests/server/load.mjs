// Load test of `dsv4 serve` on loopback: a bounded number of requests
// (default 200) with a bounded number in flight (default 16), a mix of every
// endpoint, streamed and not. Reports p50 / p99 / max latency and errors as
// one JSON line, and fails if any request failed, came back incomplete, or
// took longer than the per-request limit (a hang).
//
// Environment: DSV4_BIN, DSV4_MODEL (see harness.mjs); DSV4_LOAD_REQUESTS,
// DSV4_LOAD_CONCURRENCY, DSV4_LOAD_TIMEOUT_MS to change the bounds.
import { startServer, metric } from './harness.mjs';

const total = Number(process.env.DSV4_LOAD_REQUESTS ?? 200);
const concurrency = Number(process.env.DSV4_LOAD_CONCURRENCY ?? 16);
const timeoutMs = Number(process.env.DSV4_LOAD_TIMEOUT_MS ?? 60000);

const server = await startServer(['--queue', String(Math.max(64, concurrency * 2))]);

// Each kind: [path, body(i), how a complete reply ends].
const kinds = [
  ['/v1/chat/completions', (i) => ({ model: 'deepseek-chat', max_tokens: 8, messages: [{ role: 'user', content: `load ${i}` }] }), '"finish_reason"'],
  ['/v1/chat/completions', (i) => ({ model: 'deepseek-chat', max_tokens: 8, stream: true, messages: [{ role: 'user', content: `load ${i}` }] }), 'data: [DONE]'],
  ['/v1/messages', (i) => ({ model: 'deepseek-chat', max_tokens: 8, stream: true, messages: [{ role: 'user', content: `load ${i}` }] }), 'event: message_stop'],
  ['/v1/responses', (i) => ({ model: 'deepseek-chat', max_output_tokens: 8, stream: true, input: `load ${i}` }), 'response.'],
  ['/v1/completions', (i) => ({ model: 'deepseek-chat', max_tokens: 8, prompt: `load ${i}` }), '"text_completion"'],
];

async function one(i) {
  const [path, body, ending] = kinds[i % kinds.length];
  const t0 = performance.now();
  try {
    const r = await fetch(`${server.baseURL}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body(i)),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await r.text();
    const ms = performance.now() - t0;
    if (r.status !== 200) return { ms, error: `${path}: HTTP ${r.status} ${text.slice(0, 200)}` };
    if (!text.includes(ending)) return { ms, error: `${path}: incomplete reply: ${text.slice(-200)}` };
    return { ms };
  } catch (e) {
    return { ms: performance.now() - t0, error: `${path}: ${e.name}: ${e.message}` };
  }
}

const results = [];
let next = 0;
const wall0 = performance.now();
await Promise.all(
  Array.from({ length: concurrency }, async () => {
    while (next < total) results.push(await one(next++));
  }),
);
const wallS = (performance.now() - wall0) / 1000;
const errors = results.filter((r) => r.error);
const ms = results.map((r) => r.ms).sort((a, b) => a - b);
const pct = (p) => ms[Math.min(ms.length - 1, Math.floor((p / 100) * ms.length))];
const health = await (await fetch(`${server.baseURL}/health`)).json();
const completion = await metric(server.baseURL, 'dsv4_completion_tokens_total');
const exit = await server.stop('SIGTERM');
const report = {
  requests: results.length,
  concurrency,
  errors: errors.length,
  p50_ms: Math.round(pct(50)),
  p99_ms: Math.round(pct(99)),
  max_ms: Math.round(ms.at(-1)),
  wall_s: Number(wallS.toFixed(2)),
  requests_per_s: Number((results.length / wallS).toFixed(1)),
  completion_tokens: completion,
  server_exit: exit.code,
};
console.log(JSON.stringify(report));
for (const e of errors.slice(0, 10)) console.error('error:', e.error);
const ok = errors.length === 0 && results.length === total && health.status === 'ok' && exit.code === 0;
if (!ok) {
  console.error(`load test failed:\n${server.stderr().split('\n').slice(-20).join('\n')}`);
  process.exit(1);
}
