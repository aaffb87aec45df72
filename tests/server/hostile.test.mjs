// `dsv4 serve` as a process, against the clients an attacker on the same
// machine (or a web page in the user's browser) can be: each test sends what
// such a client sends, on raw sockets where the client must misbehave, and
// checks the server answers as it should and stays up (/health).
// The same cases in-process, with exact assertions: tests/unit/test_server_hostile.cpp
// and test_server_json_limits.cpp.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer } from './harness.mjs';

const chat = JSON.stringify({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] });

// Sends `data` (a string or a list of strings sent `gapMs` apart) on a fresh
// connection; resolves with everything received once the server closes or
// `timeoutMs` passed ({text, closed}).
function raw(port, data, { timeoutMs = 5000, gapMs = 0 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let text = '';
    let done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      sock.destroy();
      resolve({ text, closed });
    };
    sock.on('data', (d) => (text += d.toString('latin1')));
    sock.on('close', () => finish(true));
    sock.on('error', () => finish(true));
    setTimeout(() => finish(false), timeoutMs).unref();
    sock.on('connect', async () => {
      for (const part of Array.isArray(data) ? data : [data]) {
        if (done) return;
        sock.write(part);
        if (gapMs) await new Promise((r) => setTimeout(r, gapMs));
      }
    });
  });
}

const status = (text) => Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? -1);

function post(path_, body, { host = '127.0.0.1', type = 'application/json', extra = '' } = {}) {
  return `POST ${path_} HTTP/1.1\r\nHost: ${host}\r\nContent-Type: ${type}\r\n${extra}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

async function healthy(server) {
  const r = await fetch(`${server.baseURL}/health`, { signal: AbortSignal.timeout(5000) });
  return r.status === 200;
}

test('1. deeply nested JSON gets a 400 and the process survives (count_tokens, tool schemas, arguments)', async () => {
  const server = await startServer();
  try {
    // An object schema whose properties nest 50,000 levels deep (a walker recursing per level overflows a thread's stack).
    const deep = '{"type":"object","properties":{"a":'.repeat(50000) + '{}' + '}}'.repeat(50000);
    const bodies = [
      ['/v1/messages/count_tokens', `{"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t","input_schema":${deep}}]}`],
      ['/v1/chat/completions', `{"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"t","parameters":${deep}}}]}`],
      ['/v1/chat/completions', `{"model":"tiny","messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"t","arguments":${JSON.stringify(deep)}}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`],
    ];
    for (const [p, body] of bodies) {
      const r = await raw(server.port, post(p, body));
      assert.equal(status(r.text), 400, `${p}: ${r.text.slice(0, 300)}`);
      assert.match(r.text, /128 levels/);
      assert.ok(await healthy(server), `the server died on ${p}`);
    }
  } finally {
    await server.stop('SIGKILL');
  }
});

test('2. a chunked body over --max-body-mb gets 413 before it is read', async () => {
  const server = await startServer(['--max-body-mb', '1']);
  try {
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`;
    const chunk = 'a'.repeat(65536);
    const parts = [head];
    for (let i = 0; i < 48; ++i) parts.push(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    parts.push('0\r\n\r\n');
    const r = await raw(server.port, parts, { gapMs: 5 });
    assert.equal(status(r.text), 413, r.text.slice(0, 300));
    assert.ok(await healthy(server));
  } finally {
    await server.stop('SIGKILL');
  }
});

test('3. request paths cannot add /metrics series', async () => {
  const server = await startServer();
  try {
    await raw(server.port, 'GET /x%22%7D%20injected_total%201%0A%23 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
    for (let i = 0; i < 20; ++i) await fetch(`${server.baseURL}/unique/${i}`);
    const text = await (await fetch(`${server.baseURL}/metrics`)).text();
    assert.ok(!text.includes('injected'), 'an injected series');
    assert.ok(!text.includes('/unique/'), 'a series per path');
    assert.match(text, /endpoint="other",status="404"/);
  } finally {
    await server.stop('SIGKILL');
  }
});

test('4. slow clients hold no HTTP thread: /health answers while 40 of them trickle headers', async () => {
  const server = await startServer(['--http-threads', '4']);
  const socks = [];
  try {
    for (let i = 0; i < 40; ++i) {
      const s = net.connect(server.port, '127.0.0.1');
      s.on('error', () => {});
      s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n');
      socks.push(s);
    }
    const drip = setInterval(() => socks.forEach((s, i) => s.write(`X-Drip-${i}: 1\r\n`)), 300);
    try {
      await new Promise((r) => setTimeout(r, 300));
      for (let i = 0; i < 3; ++i) {
        const t0 = Date.now();
        assert.ok(await healthy(server), '/health did not answer');
        assert.ok(Date.now() - t0 < 1500);
      }
    } finally {
      clearInterval(drip);
    }
  } finally {
    socks.forEach((s) => s.destroy());
    await server.stop('SIGKILL');
  }
});

test('4b. a request that does not arrive within --read-timeout gets 408', async () => {
  const server = await startServer(['--read-timeout', '1']);
  try {
    const r = await raw(server.port, ['POST /v1/chat/completions HTTP/1.1\r\n', 'Host: 127.0.0.1\r\n'], { gapMs: 400 });
    assert.equal(status(r.text), 408, r.text);
    assert.ok(r.closed);
  } finally {
    await server.stop('SIGKILL');
  }
});

test('5. a queued client that gives up frees its queue slot', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-hostile-'));
  const script = path.join(dir, 'slow.json');
  fs.writeFileSync(script, JSON.stringify({ replies: [{ match: '', text: 'one two three four five six seven eight', token_delay_ms: 100 }] }));
  const server = await startServer(['--script', script, '--queue', '1']);
  try {
    // The running request takes ~1.6 s (16 tokens, 100 ms each).
    const long = JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] });
    const running = fetch(`${server.baseURL}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: long });
    await new Promise((r) => setTimeout(r, 200));
    const queued = new AbortController();
    const waiting = fetch(`${server.baseURL}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chat, signal: queued.signal }).catch(() => null);
    await new Promise((r) => setTimeout(r, 200));
    queued.abort();
    await waiting;
    await new Promise((r) => setTimeout(r, 200));
    const next = await fetch(`${server.baseURL}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chat });
    assert.equal(next.status, 200, await next.text());
    assert.equal((await running).status, 200);
  } finally {
    await server.stop('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('6. a keyless server refuses foreign Host headers, foreign origins and non-JSON bodies', async () => {
  const server = await startServer();
  try {
    assert.equal(status((await raw(server.port, post('/v1/chat/completions', chat, { host: 'rebind.example' }))).text), 403);
    assert.equal(status((await raw(server.port, post('/v1/chat/completions', chat, { extra: 'Origin: https://evil.example\r\n' }))).text), 403);
    assert.equal(status((await raw(server.port, post('/v1/chat/completions', chat, { type: 'text/plain' }))).text), 415);
    assert.equal(status((await raw(server.port, post('/v1/chat/completions', chat, { host: `localhost:${server.port}` }))).text), 200);
  } finally {
    await server.stop('SIGKILL');
  }
});

test('7. CR/LF in a request cannot forge a log line', async () => {
  const server = await startServer();
  try {
    await raw(server.port, 'GET /v1/models%0D%0Adsv4:%20GET%20/forged%20200 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
    await raw(server.port, post('/v1/chat/completions', JSON.stringify({ model: 'x\r\ndsv4: POST /forged 200', messages: [{ role: 'user', content: 'hi' }] })));
    await new Promise((r) => setTimeout(r, 200));
    assert.ok(!/\ndsv4: (GET|POST) \/forged/.test(server.stderr()), server.stderr());
  } finally {
    await server.stop('SIGKILL');
  }
});

test('9. API keys: any case of Bearer; a wrong x-api-key beside a right Bearer', async () => {
  const server = await startServer(['--api-key', 'secret']);
  try {
    const models = (h) => fetch(`${server.baseURL}/v1/models`, { headers: h }).then((r) => r.status);
    assert.equal(await models({ authorization: 'BEARER secret' }), 200);
    assert.equal(await models({ authorization: 'Bearer secret', 'x-api-key': 'wrong' }), 200);
    assert.equal(await models({ authorization: 'Bearer wrong' }), 401);
  } finally {
    await server.stop('SIGKILL');
  }
});
