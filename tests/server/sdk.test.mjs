// `dsv4 serve` on the tiny synthetic model, driven by the official OpenAI and
// Anthropic SDKs: chat (plain and streamed), a tool-call round trip, the
// Responses API stream, Anthropic messages with tools and thinking,
// count_tokens, API keys, a client that disconnects mid-stream, concurrent
// clients (also on a --parallel server: the serial replies, batched), every
// kind of bad input, and a clean exit on SIGTERM.
//
// The tiny model has random weights, so replies are noise; the tests check
// protocol shapes, usage accounting, session reuse and server health, not text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, metric } from './harness.mjs';

let server;
let openai;
let anthropic;

before(async () => {
  server = await startServer(['--max-body-mb', '1']);
  openai = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  const { code } = await server.stop('SIGTERM');
  assert.equal(code, 0, `dsv4 serve must exit 0 on SIGTERM:\n${server.stderr()}`);
  assert.match(server.stderr(), /dsv4 serve: stopped/);
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

test('chat completion, plain', async () => {
  const r = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }],
    max_tokens: 8,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'deepseek-chat');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat completion, streamed, with usage and session reuse', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story about a robot' }];
  const stream = await openai.chat.completions.create({
    model: 'deepseek-reasoner',
    messages,
    max_tokens: 12,
    ignore_eos: true, // (an extension) an early EOS of the random-weight model would leave too few chunks
    stream: true,
    stream_options: { include_usage: true },
  });
  let chunks = 0;
  let reasoning = '';
  let usage;
  let finish;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (c?.delta?.reasoning_content) reasoning += c.delta.reasoning_content;
    if (c?.finish_reason) finish = c.finish_reason;
  }
  assert.ok(chunks >= 3);
  assert.ok(usage && usage.completion_tokens > 0);
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage.completion_tokens_details.reasoning_tokens > 0, 'deepseek-reasoner thinks');
  // The same prompt again: the live session already holds it.
  const again = await openai.chat.completions.create({ model: 'deepseek-reasoner', messages, max_tokens: 4 });
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens);
  // The SDK's stream helper accumulates the same chunks.
  const helper = openai.chat.completions.stream({ model: 'deepseek-chat', messages, max_tokens: 6 });
  const final = await helper.finalChatCompletion();
  assert.equal(final.choices[0].message.role, 'assistant');
});

test('tool call round trip: the tool result is sent back', async () => {
  const first = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    tools: [weatherTool],
    tool_choice: 'auto',
    max_tokens: 8,
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(first.choices[0].finish_reason));
  const history = [
    { role: 'user', content: 'What is the weather in Paris?' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_0001', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_0001', content: 'sunny, 24 C' },
  ];
  const second = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: history,
    tools: [weatherTool],
    max_tokens: 8,
  });
  assert.equal(typeof second.choices[0].message.content, 'string');
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
  // Same history once more: only the reply's tokens differ from the live session.
  const third = await openai.chat.completions.create({ model: 'deepseek-chat', messages: history, tools: [weatherTool], max_tokens: 2 });
  assert.equal(third.usage.prompt_tokens_details.cached_tokens, third.usage.prompt_tokens);
  // tool_choice forcing a function works on any model (the call is forced).
  const forced = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'user', content: 'weather?' }],
    tools: [weatherTool],
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    max_tokens: 60,
  });
  assert.ok(forced.usage.completion_tokens > 0);
  assert.ok(forced.usage.prompt_tokens > 0);
});

test('Responses API, streamed', async () => {
  const stream = openai.responses.stream({
    model: 'deepseek-v4-flash',
    instructions: 'You are terse.',
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Summarize the plot of Hamlet' }] }],
    tools: [{ type: 'function', name: 'lookup', parameters: { type: 'object', properties: {} }, strict: false }],
    max_output_tokens: 10,
    reasoning: { effort: 'high' },
  });
  const types = new Set();
  stream.on('event', (e) => types.add(e.type));
  const final = await stream.finalResponse();
  for (const t of ['response.created', 'response.in_progress', 'response.output_item.added', 'response.output_item.done'])
    assert.ok(types.has(t), t);
  assert.ok(types.has('response.completed') || types.has('response.incomplete'));
  assert.ok(['completed', 'incomplete'].includes(final.status));
  assert.ok(final.output.length >= 1);
  assert.equal(final.output[0].type, 'reasoning');
  assert.ok(final.usage.output_tokens > 0 && final.usage.output_tokens <= 10);
  assert.equal(typeof final.usage.input_tokens_details.cached_tokens, 'number');
  const plain = await openai.responses.create({ model: 'deepseek-chat', input: 'hi', max_output_tokens: 4 });
  assert.equal(plain.object, 'response');
  assert.equal(typeof plain.output_text, 'string');
});

test('Anthropic messages, streamed, with tools and thinking', async () => {
  const stream = anthropic.messages.stream({
    model: 'deepseek-v4-flash',
    max_tokens: 40,
    seed: 11, // a dsv4 extension: the random-weight model's reply is then the same every run
    system: [{ type: 'text', text: 'You help with the weather.' }],
    thinking: { type: 'enabled', budget_tokens: 12 },
    tools: [{ name: 'get_weather', description: 'Weather for a city', input_schema: weatherTool.function.parameters }],
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
  });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e.type));
  const msg = await stream.finalMessage();
  assert.equal(events[0], 'message_start');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_delta'));
  assert.equal(events.at(-1), 'message_stop');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'thinking');
  assert.match(msg.content[0].signature, /^dsv4-[0-9a-f]{64}$/);
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(msg.stop_reason));
  assert.ok(msg.usage.output_tokens > 12, 'the budget ends the thinking, then the answer follows');
  // Thinking blocks and tool results go back in the history.
  const follow = await anthropic.messages.create({
    model: 'deepseek-v4-flash',
    max_tokens: 6,
    thinking: { type: 'enabled', budget_tokens: 4 },
    tools: [{ name: 'get_weather', input_schema: weatherTool.function.parameters }],
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      {
        role: 'assistant',
        content: [
          { type: 'thinking', thinking: 'I should call the tool.', signature: 'x' },
          { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } },
        ],
      },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'sunny' }] },
    ],
  });
  assert.equal(follow.type, 'message');
  assert.ok(follow.usage.input_tokens + follow.usage.cache_read_input_tokens > 0);
});

test('count_tokens matches the tokens a message request uses', async () => {
  const req = {
    model: 'deepseek-chat',
    system: 'Count me.',
    messages: [{ role: 'user', content: 'How many tokens is this?' }],
    tools: [{ name: 'noop', input_schema: { type: 'object' } }],
  };
  const counted = await anthropic.messages.countTokens(req);
  assert.ok(counted.input_tokens > 0);
  const msg = await anthropic.messages.create({ ...req, max_tokens: 2 });
  assert.equal(msg.usage.input_tokens + msg.usage.cache_read_input_tokens, counted.input_tokens);
});

test('a client that disconnects mid-stream cancels its work; the server keeps serving', async () => {
  const cancelledBefore = await metric(server.baseURL, 'dsv4_jobs_total{result="cancelled"}');
  const controller = new AbortController();
  // ignore_eos (an extension): the random-weight model may sample EOS within a
  // few tokens, which would end the stream before the client hangs up.
  const stream = await openai.chat.completions.create(
    {
      model: 'deepseek-chat',
      messages: [{ role: 'user', content: 'Write a very long essay' }],
      max_tokens: 3000,
      ignore_eos: true,
      stream: true,
    },
    { signal: controller.signal },
  );
  let seen = 0;
  // The SDK ends the iteration quietly when its request is aborted.
  for await (const _ of stream) {
    if (++seen === 3) controller.abort();
  }
  assert.ok(seen >= 3);
  let cancelled = cancelledBefore;
  for (let i = 0; i < 100 && cancelled === cancelledBefore; i++) {
    await new Promise((r) => setTimeout(r, 50));
    cancelled = await metric(server.baseURL, 'dsv4_jobs_total{result="cancelled"}');
  }
  assert.equal(cancelled, cancelledBefore + 1);
  const ok = await openai.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'still there?' }], max_tokens: 3 });
  assert.equal(ok.object, 'chat.completion');
});

test('concurrent clients (12 at once) all complete', async () => {
  const jobs = [];
  for (let i = 0; i < 12; i++) {
    const content = `client ${i} says hello`;
    if (i % 4 === 0) jobs.push(openai.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content }], max_tokens: 6 }));
    if (i % 4 === 1)
      jobs.push(
        (async () => {
          const s = await openai.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content }], max_tokens: 6, stream: true });
          let n = 0;
          for await (const _ of s) n++;
          return n;
        })(),
      );
    if (i % 4 === 2) jobs.push(anthropic.messages.stream({ model: 'deepseek-chat', max_tokens: 6, messages: [{ role: 'user', content }] }).finalMessage());
    if (i % 4 === 3) jobs.push(openai.responses.create({ model: 'deepseek-chat', input: content, max_output_tokens: 6 }));
  }
  const results = await Promise.allSettled(jobs);
  for (const r of results) assert.equal(r.status, 'fulfilled', String(r.reason));
  const health = await (await fetch(`${server.baseURL}/health`)).json();
  assert.equal(health.status, 'ok');
});

test('--parallel 4: every SDK streams side by side, with the replies of a one-at-a-time server', async () => {
  // Greedy (thinking off, temperature 0), so each request's text is fixed; the
  // batched server must give the serial server's text while all four stream at once.
  const ask = (i) => [{ role: 'user', content: `parallel client ${i} asks for a long story` }];
  const run = async (client, i) => {
    if (i % 2 === 0) {
      const s = await client.openai.chat.completions.create({ model: 'deepseek-chat', messages: ask(i), max_tokens: 24, temperature: 0, stream: true });
      let text = '';
      for await (const c of s) text += c.choices[0]?.delta?.content ?? '';
      return text;
    }
    const m = await client.anthropic.messages.stream({ model: 'deepseek-chat', max_tokens: 24, temperature: 0, messages: ask(i) }).finalMessage();
    return m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  };
  const clients = (srv) => ({
    openai: new OpenAI({ baseURL: `${srv.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: srv.baseURL, apiKey: 'unused', maxRetries: 0 }),
  });
  const serial = [];
  for (let i = 0; i < 4; i++) serial.push(await run(clients(server), i));
  const batched = await startServer(['--parallel', '4']);
  try {
    const c = clients(batched);
    const texts = await Promise.all([0, 1, 2, 3].map((i) => run(c, i)));
    assert.deepEqual(texts, serial);
    assert.equal(await metric(batched.baseURL, 'dsv4_parallel_max'), 4);
    assert.ok((await metric(batched.baseURL, 'dsv4_steps_total')) > 0);
    const health = await (await fetch(`${batched.baseURL}/health`)).json();
    assert.equal(health.parallel, 4);
  } finally {
    const { code } = await batched.stop('SIGTERM');
    assert.equal(code, 0, batched.stderr());
  }
});

test('every bad input gets a 4xx in the dialect shape and the server stays healthy', async () => {
  const post = (path, body) =>
    fetch(`${server.baseURL}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const cases = [
    ['/v1/chat/completions', '{"messages": [', 400, 'invalid JSON'],
    ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: 'ten' }), 400, 'max_tokens'],
    ['/v1/chat/completions', JSON.stringify({ model: 'gpt-5', messages: [{ role: 'user', content: 'x' }] }), 404, 'gpt-5'],
    ['/v1/chat/completions', JSON.stringify({ messages: [] }), 400, 'empty'],
    ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'word '.repeat(6000) }] }), 400, 'context length'],
    ['/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], n: 2, stream: true }), 400, 'cannot be streamed'],
    ['/v1/chat/completions', 'x'.repeat(2 * 1024 * 1024), 413, 'limit'],
    ['/v1/completions', JSON.stringify({ prompt: { text: 'x' } }), 400, 'prompt'],
    ['/v1/responses', JSON.stringify({ input: [{ type: 'message', role: 'wizard', content: 'x' }] }), 400, 'role'],
    ['/v1/messages', '{', 400, 'invalid JSON'],
    ['/v1/messages', JSON.stringify({ model: 'claude-opus', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }), 404, 'claude-opus'],
    ['/v1/messages', JSON.stringify({ max_tokens: 5, messages: [] }), 400, 'empty'],
    ['/v1/messages', JSON.stringify({ max_tokens: 5, messages: [{ role: 'user', content: 'word '.repeat(6000) }] }), 400, 'context length'],
    ['/v1/messages/count_tokens', JSON.stringify({ messages: 'nope' }), 400, 'messages'],
  ];
  for (const [path, body, status, needle] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, status, `${path} ${body.slice(0, 40)}`);
    const j = await r.json();
    const message = path.startsWith('/v1/messages') ? (assert.equal(j.type, 'error'), j.error.message) : j.error.message;
    assert.ok(message.includes(needle), `${path}: ${message}`);
  }
  // The SDKs surface the same errors as their typed exceptions.
  await assert.rejects(openai.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }), OpenAI.NotFoundError);
  await assert.rejects(openai.chat.completions.create({ model: 'deepseek-chat', messages: [] }), OpenAI.BadRequestError);
  await assert.rejects(anthropic.messages.create({ model: 'nope', max_tokens: 3, messages: [{ role: 'user', content: 'x' }] }), Anthropic.NotFoundError);
  const health = await fetch(`${server.baseURL}/health`);
  assert.equal(health.status, 200);
});

test('API keys: off by default, on with --api-key', async () => {
  const keyed = await startServer(['--api-key', 's3cret-key']);
  try {
    const good = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: 's3cret-key', maxRetries: 0 });
    const bad = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
    const models = await good.models.list();
    assert.ok(models.data.some((m) => m.id === 'deepseek-v4-flash'));
    await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
    await assert.rejects(bad.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'x' }] }), OpenAI.AuthenticationError);
    const antGood = new Anthropic({ baseURL: keyed.baseURL, apiKey: 's3cret-key', maxRetries: 0 });
    const antBad = new Anthropic({ baseURL: keyed.baseURL, apiKey: 'wrong', maxRetries: 0 });
    const m = await antGood.messages.create({ model: 'deepseek-chat', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] });
    assert.equal(m.type, 'message');
    await assert.rejects(antBad.messages.create({ model: 'deepseek-chat', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }), Anthropic.AuthenticationError);
    // Bearer tokens work for Anthropic clients too (Claude Code's ANTHROPIC_AUTH_TOKEN).
    const bearer = new Anthropic({ baseURL: keyed.baseURL, authToken: 's3cret-key', apiKey: null, maxRetries: 0 });
    assert.equal((await bearer.messages.countTokens({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'x' }] })).input_tokens > 0, true);
    assert.equal((await fetch(`${keyed.baseURL}/health`)).status, 200);
    assert.equal((await fetch(`${keyed.baseURL}/metrics`)).status, 401);
  } finally {
    assert.equal((await keyed.stop()).code, 0);
  }
  // Without --api-key any key (or none) is accepted.
  const r = await fetch(`${server.baseURL}/v1/models`);
  assert.equal(r.status, 200);
});
