// The on-disk KV cache and resident sessions of `dsv4 serve`, through the
// official SDKs, across real process restarts: a long prompt stored by one
// server is restored by the next one, which reports the cached prompt tokens
// (OpenAI prompt_tokens_details.cached_tokens, Anthropic
// cache_read_input_tokens) and prefills only the suffix; two agents
// alternating stay warm with --sessions 2; a damaged file is removed with a
// warning and an unusable directory only costs the cache, never a request.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, metric } from './harness.mjs';

let dir;
before(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsv4-kv-sdk-'));
});
after(() => {
  fs.rmSync(dir, { recursive: true, force: true });
});

// A system prompt of a few hundred tokens (an agent's instructions and tool schemas, in small).
const system = (who) =>
  `You are ${who}.` + Array.from({ length: 10 }, (_, i) => ` Rule ${i}: answer questions about ${who} briefly.`).join('');

const clients = (server) => ({
  openai: new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 }),
  anthropic: new Anthropic({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 }),
});

const cacheFlags = (d) => ['--kv-disk-dir', d, '--kv-cache-min-tokens', '64'];
const cacheFiles = (d) => fs.readdirSync(d).filter((n) => /^[0-9a-f]{64}\.kv$/.test(n));

async function stopClean(server) {
  const { code } = await server.stop('SIGTERM');
  assert.equal(code, 0, server.stderr());
}

test('OpenAI: cached_tokens for a long prompt after a restart; only the suffix is prefilled', async () => {
  const cache = path.join(dir, 'openai');
  const first = await startServer(cacheFlags(cache));
  const a = clients(first).openai;
  const r1 = await a.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'system', content: system('the release manager') }, { role: 'user', content: 'What is new in 2.0?' }],
    max_tokens: 4,
  });
  assert.equal(r1.usage.prompt_tokens_details.cached_tokens, 0);
  await stopClean(first);
  assert.match(first.stderr(), /KV disk cache: stored [0-9a-f]{64}\.kv \(cold/);
  assert.match(first.stderr(), /KV disk cache: stored [0-9a-f]{64}\.kv \(shutdown/);
  assert.equal(cacheFiles(cache).length, 2);
  assert.equal(fs.statSync(cache).mode & 0o777, 0o700);
  for (const f of cacheFiles(cache)) assert.equal(fs.statSync(path.join(cache, f)).mode & 0o777, 0o600);

  const second = await startServer(cacheFlags(cache));
  try {
    const b = clients(second).openai;
    const r2 = await b.chat.completions.create({
      model: 'deepseek-chat',
      messages: [{ role: 'system', content: system('the release manager') }, { role: 'user', content: 'And what is new in 3.0?' }],
      max_tokens: 4,
    });
    const cached = r2.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached > 64, `cached ${cached}`);
    assert.ok(cached < r2.usage.prompt_tokens);
    assert.equal(await metric(second.baseURL, 'dsv4_kv_disk_hits_total'), 1);
    assert.equal(await metric(second.baseURL, 'dsv4_kv_disk_restored_tokens_total'), cached);
    assert.equal(await metric(second.baseURL, 'dsv4_prefilled_tokens_total'), r2.usage.prompt_tokens - cached);
    assert.match(second.stderr(), /KV disk cache: restored \d+ of \d+ prompt tokens/);
  } finally {
    await stopClean(second);
  }
});

test('Anthropic: cache_read_input_tokens after a restart', async () => {
  const cache = path.join(dir, 'anthropic');
  const request = (question) => ({
    model: 'deepseek-chat',
    max_tokens: 4,
    system: system('the support desk'),
    messages: [{ role: 'user', content: question }],
  });
  const first = await startServer(cacheFlags(cache));
  const m1 = await clients(first).anthropic.messages.create(request('My order is late.'));
  assert.equal(m1.usage.cache_read_input_tokens, 0);
  await stopClean(first);

  const second = await startServer(cacheFlags(cache));
  try {
    const counted = await clients(second).anthropic.messages.countTokens(request('My parcel is damaged.'));
    const m2 = await clients(second).anthropic.messages.create(request('My parcel is damaged.'));
    assert.ok(m2.usage.cache_read_input_tokens > 64, JSON.stringify(m2.usage));
    assert.equal(m2.usage.input_tokens + m2.usage.cache_read_input_tokens, counted.input_tokens);
    // Streaming reports the same in message_delta.
    const stream = clients(second).anthropic.messages.stream(request('My parcel never arrived.'));
    const final = await stream.finalMessage();
    assert.ok(final.usage.cache_read_input_tokens > 64, JSON.stringify(final.usage));
  } finally {
    await stopClean(second);
  }
});

test('--sessions 2: two agents alternating both reuse their whole previous prompt', async () => {
  const server = await startServer(['--sessions', '2']);
  try {
    const { openai } = clients(server);
    const conv = [system('the build agent'), system('the docs agent')].map((s) => [{ role: 'system', content: s }]);
    const lastPrompt = [0, 0];
    for (let round = 0; round < 3; round++) {
      for (const a of [0, 1]) {
        conv[a].push({ role: 'user', content: `step ${round}` });
        const r = await openai.chat.completions.create({ model: 'deepseek-chat', messages: conv[a], max_tokens: 3 });
        if (round > 0) assert.ok(r.usage.prompt_tokens_details.cached_tokens >= lastPrompt[a], `agent ${a} round ${round}`);
        lastPrompt[a] = r.usage.prompt_tokens;
        conv[a].push({ role: 'assistant', content: r.choices[0].message.content ?? '' });
      }
    }
    assert.equal(await metric(server.baseURL, 'dsv4_sessions_live'), 2);
    assert.equal(await metric(server.baseURL, 'dsv4_session_picks_total{pick="displaced"}'), 0);
  } finally {
    await stopClean(server);
  }
});

test('a damaged cache file is removed with a warning; an unusable directory only disables the cache', async () => {
  const cache = path.join(dir, 'damaged');
  fs.mkdirSync(cache, { mode: 0o700 });
  fs.writeFileSync(path.join(cache, 'c'.repeat(64) + '.kv'), Buffer.alloc(4000, 7));
  const server = await startServer(cacheFlags(cache));
  try {
    const r = await clients(server).openai.chat.completions.create({
      model: 'deepseek-chat',
      messages: [{ role: 'user', content: 'hello' }],
      max_tokens: 2,
    });
    assert.ok(r.usage.completion_tokens > 0);
    assert.match(server.stderr(), /KV disk cache: removing .*c{64}\.kv: /);
    assert.equal(fs.existsSync(path.join(cache, 'c'.repeat(64) + '.kv')), false);
    assert.equal(await metric(server.baseURL, 'dsv4_kv_disk_rejected_files_total'), 1);
  } finally {
    await stopClean(server);
  }
  const notADir = path.join(dir, 'plain-file');
  fs.writeFileSync(notADir, 'x');
  const degraded = await startServer(cacheFlags(path.join(notADir, 'kv')));
  try {
    assert.match(degraded.stderr(), /KV disk cache disabled, serving without it/);
    const r = await clients(degraded).openai.chat.completions.create({
      model: 'deepseek-chat',
      messages: [{ role: 'user', content: 'hello' }],
      max_tokens: 2,
    });
    assert.ok(r.usage.completion_tokens > 0);
    assert.equal(await metric(degraded.baseURL, 'dsv4_kv_disk_enabled'), 0);
  } finally {
    await stopClean(degraded);
  }
});
