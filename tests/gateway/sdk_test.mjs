// Drives ds4-gateway with the official OpenAI and Anthropic client libraries, on ds4d
// serving the scripted fixture model (ds4-make-model --preset scripted): after a chat
// prompt it calls get_weather(city="Paris", days=3); once the tool result is in the
// conversation it answers "It is sunny in Paris.". Env: GW_URL, GW_KEY, NODE_PATH.
import assert from 'node:assert/strict';
import net from 'node:net';
import { createRequire } from 'node:module';

const require = createRequire(process.env.NODE_MODULES_DIR + '/');
const OpenAI = require('openai').default;
const Anthropic = require('@anthropic-ai/sdk').default;

const base = process.env.GW_URL;
const key = process.env.GW_KEY;
const openai = new OpenAI({ apiKey: key, baseURL: base + '/v1', maxRetries: 0 });
const anthropic = new Anthropic({ apiKey: key, baseURL: base, maxRetries: 0 });
const ANSWER = 'It is sunny in Paris.';
const ARGS = { city: 'Paris', days: 3 };
const weatherTool = {
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city',
              parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } } },
};

const tests = [];
const test = (name, fn) => tests.push([name, fn]);

test('models.list', async () => {
  const models = [];
  for await (const m of openai.models.list()) models.push(m);
  assert.equal(models.length, 1);
  assert.ok(models[0].id.length > 0);
});

test('chat: tool call round trip, non-streaming', async () => {
  const messages = [{ role: 'system', content: 'You help.' }, { role: 'user', content: 'Weather in Paris?' }];
  const r1 = await openai.chat.completions.create({ model: 'ds4', messages, tools: [weatherTool], temperature: 0 });
  const c1 = r1.choices[0];
  assert.equal(c1.finish_reason, 'tool_calls');
  assert.equal(c1.message.tool_calls.length, 1);
  const call = c1.message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), ARGS);
  assert.ok(r1.usage.prompt_tokens > 0 && r1.usage.completion_tokens > 0);
  messages.push(c1.message, { role: 'tool', tool_call_id: call.id, content: 'sunny' });
  const r2 = await openai.chat.completions.create({ model: 'ds4', messages, tools: [weatherTool], temperature: 0 });
  assert.equal(r2.choices[0].finish_reason, 'stop');
  assert.equal(r2.choices[0].message.content, ANSWER);
  // The resent conversation's common prefix was not evaluated again.
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens / 2,
            JSON.stringify(r2.usage));
});

test('chat: streamed tool call arrives as argument deltas, then usage', async () => {
  const stream = await openai.chat.completions.create({
    model: 'ds4', messages: [{ role: 'user', content: 'Weather?' }], tools: [weatherTool], temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let args = '', deltas = 0, name = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const tc of ch.delta.tool_calls ?? []) {
      if (tc.function?.name) name = tc.function.name;
      if (tc.function?.arguments) { args += tc.function.arguments; deltas++; }
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(name, 'get_weather');
  assert.deepEqual(JSON.parse(args), ARGS);
  assert.ok(deltas >= 3, `argument deltas: ${deltas}`);
  assert.equal(finish, 'tool_calls');
  assert.ok(usage && usage.completion_tokens === 8, JSON.stringify(usage));
});

test('chat: plain streaming text (no tools: DSML is text)', async () => {
  const stream = await openai.chat.completions.create({
    model: 'ds4', messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'x' },
                             { role: 'user', content: '<tool_result>ok</tool_result>' }],
    temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, ANSWER);
});

test('completions', async () => {
  const r = await openai.completions.create({ model: 'ds4', prompt: 'Weather?>', max_tokens: 10, temperature: 0 });
  assert.equal(r.choices[0].text, ANSWER);
  const s = await openai.completions.create({ model: 'ds4', prompt: 'Weather?>', max_tokens: 2, temperature: 0, stream: true });
  let text = '', finish = null;
  for await (const c of s) { text += c.choices[0]?.text ?? ''; finish = c.choices[0]?.finish_reason ?? finish; }
  assert.equal(text, 'It is sunny in Paris');   // two tokens of the script
  assert.equal(finish, 'length');
});

test('responses: tool call round trip, streaming and not', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: weatherTool.function.parameters }];
  const r1 = await openai.responses.create({ model: 'ds4', input: 'Weather in Paris?', tools, temperature: 0 });
  const call = r1.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r1.output));
  assert.deepEqual(JSON.parse(call.arguments), ARGS);
  const input = [{ role: 'user', content: 'Weather in Paris?' }, call,
                 { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }];
  const r2 = await openai.responses.create({ model: 'ds4', input, tools, temperature: 0 });
  assert.equal(r2.output_text, ANSWER);
  assert.ok(r2.usage.input_tokens_details.cached_tokens > 0);
  const stream = await openai.responses.create({ model: 'ds4', input: 'Weather?', tools, temperature: 0, stream: true });
  let args = '', done = null;
  for await (const ev of stream) {
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  assert.deepEqual(JSON.parse(args), ARGS);
  assert.equal(done.output[0].type, 'function_call');
});

test('anthropic messages: tool_use round trip, non-streaming', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather', input_schema: weatherTool.function.parameters }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const m1 = await anthropic.messages.create({ model: 'ds4', max_tokens: 64, system: 'You help.', messages, tools, temperature: 0 });
  assert.equal(m1.stop_reason, 'tool_use');
  const use = m1.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(use.input, ARGS);
  messages.push({ role: 'assistant', content: m1.content },
                { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] });
  const m2 = await anthropic.messages.create({ model: 'ds4', max_tokens: 64, system: 'You help.', messages, tools, temperature: 0 });
  assert.equal(m2.stop_reason, 'end_turn');
  assert.equal(m2.content[0].text, ANSWER);
  assert.ok(m2.usage.cache_read_input_tokens > 0, JSON.stringify(m2.usage));
});

test('anthropic messages: streamed tool_use with input_json deltas', async () => {
  const tools = [{ name: 'get_weather', input_schema: { type: 'object' } }];
  const stream = anthropic.messages.stream({ model: 'ds4', max_tokens: 64, temperature: 0,
                                             messages: [{ role: 'user', content: 'Weather?' }], tools });
  let partial = 0;
  stream.on('inputJson', () => { partial++; });
  const msg = await stream.finalMessage();
  assert.equal(msg.stop_reason, 'tool_use');
  assert.deepEqual(msg.content.find((b) => b.type === 'tool_use').input, ARGS);
  assert.ok(partial >= 3, `inputJson events: ${partial}`);
  const text = anthropic.messages.stream({ model: 'ds4', max_tokens: 64, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'x', content: 'ok' }] }] });
  assert.equal((await text.finalMessage()).content[0].text, ANSWER);
});

test('errors through the SDKs', async () => {
  const bad = new OpenAI({ apiKey: 'wrong-key-wrong-key', baseURL: base + '/v1', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', messages: [{ role: 'user', content: 'x' }], logprobs: true }),
                       (e) => e.status === 400 && e.param === 'logprobs');
  const badA = new Anthropic({ apiKey: 'wrong-key-wrong-key', baseURL: base, maxRetries: 0 });
  await assert.rejects(badA.messages.create({ model: 'ds4', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
                       (e) => e.status === 401 && e.error?.error?.type === 'authentication_error');
});

test('1000 idle connections do not stop a well-behaved client', async () => {
  const idle = [];
  const opened = await Promise.all(Array.from({ length: 1000 }, (_, i) => new Promise((resolve) => {
    const s = net.connect(new URL(base).port, '127.0.0.1', () => {
      // Half send nothing, half a slow partial request line that never completes.
      if (i % 2) s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');
      resolve(true);
    });
    s.on('error', () => resolve(false));
    idle.push(s);
  })));
  assert.equal(opened.filter(Boolean).length, 1000);
  const t0 = Date.now();
  const r = await openai.chat.completions.create({ model: 'ds4', temperature: 0,
    messages: [{ role: 'user', content: '<tool_result>ok</tool_result>' }] });
  const ms = Date.now() - t0;
  assert.equal(r.choices[0].message.content, ANSWER);
  assert.ok(ms < 10000, `served in ${ms} ms`);
  // The idle ones are still open (not refused to make room).
  assert.ok(idle.filter((s) => !s.destroyed).length >= 990);
  for (const s of idle) s.destroy();
  console.log(`  (served in ${ms} ms beside 1000 idle connections)`);
});

let failed = 0;
for (const [name, fn] of tests) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}\n  ${e.stack ?? e}`);
  }
}
console.log(`${tests.length - failed}/${tests.length} passed`);
process.exit(failed ? 1 : 0);
