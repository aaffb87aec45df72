// Tool calls through the official SDKs, end to end: `dsv4 serve --script`
// replays the completions a model would write (script.json; a random-weight
// model never writes a tool call), and everything else is the real server:
// the DSML parser streaming argument fragments, tool-call ids, the
// tool-call memory, and exact replay when the SDK sends the conversation back
// (verified by the session reuse: the whole previous turn is a cache hit).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, metric, here } from './harness.mjs';

let server;
let openai;
let anthropic;

before(async () => {
  server = await startServer(['--script', path.join(here, 'script.json')]);
  openai = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
});

after(async () => {
  assert.equal((await server.stop('SIGINT')).code, 0, server.stderr());
});

const parameters = {
  type: 'object',
  properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
  required: ['city'],
};
const question = 'What is the weather in Paris?';

test('OpenAI chat: tool_calls deltas stream, the result goes back, the turn is replayed exactly', async () => {
  const stream = openai.chat.completions.stream({
    model: 'deepseek-chat',
    messages: [{ role: 'user', content: question }],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters } }],
    stream_options: { include_usage: true },
  });
  let fragments = 0;
  stream.on('chunk', (c) => {
    const tc = c.choices[0]?.delta?.tool_calls;
    if (tc && tc[0].function?.arguments) fragments++;
  });
  const first = await stream.finalChatCompletion();
  const msg = first.choices[0].message;
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, 'Let me look that up.');
  assert.equal(msg.tool_calls.length, 1);
  const call = msg.tool_calls[0];
  assert.match(call.id, /^call_[0-9a-f]{32}$/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
  assert.ok(fragments >= 2, `arguments stream in fragments (${fragments})`);

  const second = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: [
      { role: 'user', content: question },
      { role: 'assistant', content: msg.content, tool_calls: msg.tool_calls },
      { role: 'tool', tool_call_id: call.id, content: 'sunny' },
    ],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters } }],
  });
  assert.equal(second.choices[0].message.content, 'It is sunny in Paris.');
  assert.equal(second.choices[0].finish_reason, 'stop');
  // Exact replay: the previous prompt and the whole generated turn are reused.
  assert.equal(second.usage.prompt_tokens_details.cached_tokens, first.usage.prompt_tokens + first.usage.completion_tokens);
});

test('Anthropic: thinking, text and tool_use with input_json_delta; tool_result round trip', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: parameters }];
  const stream = anthropic.messages.stream({
    model: 'deepseek-v4-flash',
    max_tokens: 400,
    thinking: { type: 'enabled', budget_tokens: 300 },
    tools,
    messages: [{ role: 'user', content: question }],
  });
  let jsonDeltas = 0;
  let thinkingDeltas = 0;
  stream.on('inputJson', () => jsonDeltas++);
  stream.on('thinking', () => thinkingDeltas++);
  const first = await stream.finalMessage();
  assert.deepEqual(first.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(first.content[0].thinking, 'The user wants the weather. I will call get_weather.');
  assert.equal(first.content[1].text, 'Let me look that up.');
  const use = first.content[2];
  assert.match(use.id, /^toolu_[0-9a-f]{32}$/);
  assert.deepEqual(use.input, { city: 'Paris', unit: 'celsius' });
  assert.equal(first.stop_reason, 'tool_use');
  assert.ok(jsonDeltas >= 2 && thinkingDeltas >= 2);

  const second = await anthropic.messages.create({
    model: 'deepseek-v4-flash',
    max_tokens: 400,
    thinking: { type: 'enabled', budget_tokens: 300 },
    tools,
    messages: [
      { role: 'user', content: question },
      { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] },
    ],
  });
  assert.deepEqual(second.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(second.content[1].text, 'It is sunny in Paris.');
  assert.equal(second.stop_reason, 'end_turn');
  const firstTotal = first.usage.input_tokens + first.usage.cache_read_input_tokens + first.usage.output_tokens;
  assert.equal(second.usage.cache_read_input_tokens, firstTotal);
});

test('Responses: function_call events stream; function_call_output round trip', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters, strict: false }];
  const stream = openai.responses.stream({ model: 'deepseek-v4-flash', input: [{ role: 'user', content: question }], tools });
  let argDeltas = 0;
  stream.on('response.function_call_arguments.delta', () => argDeltas++);
  const first = await stream.finalResponse();
  assert.equal(first.status, 'completed');
  assert.deepEqual(first.output.map((o) => o.type), ['reasoning', 'message', 'function_call']);
  const fc = first.output[2];
  assert.match(fc.call_id, /^call_[0-9a-f]{32}$/);
  assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris', unit: 'celsius' });
  assert.ok(argDeltas >= 2);
  assert.equal(first.output_text, 'Let me look that up.');

  const second = await openai.responses.create({
    model: 'deepseek-v4-flash',
    input: [{ role: 'user', content: question }, ...first.output, { type: 'function_call_output', call_id: fc.call_id, output: 'sunny' }],
    tools,
  });
  assert.equal(second.output_text, 'It is sunny in Paris.');
  assert.equal(second.usage.input_tokens_details.cached_tokens, first.usage.input_tokens + first.usage.output_tokens);
});

test('tool_choice "none" keeps tools unused; a disconnect mid-stream cancels', async () => {
  const r = await openai.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'user', content: 'hello' }],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters } }],
    tool_choice: 'none',
  });
  assert.equal(r.choices[0].message.content, 'Hello from the script.');
  assert.equal(r.choices[0].message.tool_calls, undefined);

  const before = await metric(server.baseURL, 'dsv4_jobs_total{result="cancelled"}');
  const controller = new AbortController();
  const s = await anthropic.messages.create(
    { model: 'deepseek-chat', max_tokens: 1000, stream: true, messages: [{ role: 'user', content: 'tell a slow story' }] },
    { signal: controller.signal },
  );
  let deltas = 0;
  // The SDK ends the iteration (or throws its abort error) once the request is aborted.
  try {
    for await (const e of s) if (e.type === 'content_block_delta' && ++deltas === 5) controller.abort();
  } catch (e) {
    assert.ok(e instanceof Anthropic.APIUserAbortError, String(e));
  }
  assert.ok(deltas >= 5);
  let after = before;
  for (let i = 0; i < 100 && after === before; i++) {
    await new Promise((res) => setTimeout(res, 20));
    after = await metric(server.baseURL, 'dsv4_jobs_total{result="cancelled"}');
  }
  assert.equal(after, before + 1);
});
