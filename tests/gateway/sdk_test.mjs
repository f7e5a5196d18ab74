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

// ---- sampling controls, n, forced tool calls, sessions (the daemon's sampling: tests/daemon/sampling_e2e_test.cpp)
const answerToken = Number(process.env.ANSWER_TOKEN);   // the answer's first token id (ds4 tokenize)
const afterTool = [{ role: 'user', content: '<tool_result>ok</tool_result>' }];

function checkLogprobs(entries, n, text) {
  assert.ok(entries.length > 0);
  assert.equal(entries.map((e) => e.token).join(''), text);
  for (const e of entries) {
    assert.ok(e.logprob <= 0, JSON.stringify(e));
    assert.equal(e.top_logprobs.length, n);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
    for (let k = 1; k < n; k++) assert.ok(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  }
}

test('chat: logprobs with top alternatives, streamed and not, the same', async () => {
  const r = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, logprobs: true, top_logprobs: 3 });
  assert.equal(r.choices[0].message.content, ANSWER);
  const entries = r.choices[0].logprobs.content;
  checkLogprobs(entries, 3, ANSWER);
  const stream = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, logprobs: true,
                                                        top_logprobs: 3, stream: true });
  const streamed = [];
  for await (const c of stream) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, entries);
});

test('completions and responses: logprobs in their shapes', async () => {
  const r = await openai.completions.create({ model: 'ds4', prompt: 'Weather?>', max_tokens: 10, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  assert.equal(lp.text_offset[0], 0);
  const x = await openai.responses.create({ model: 'ds4', input: '<tool_result>ok</tool_result>', temperature: 0, top_logprobs: 2,
                                            include: ['message.output_text.logprobs'] });
  assert.equal(x.output_text, ANSWER);
  checkLogprobs(x.output.find((o) => o.type === 'message').content[0].logprobs, 2, ANSWER);
});

test('logit_bias and penalties reach the sampler', async () => {
  assert.ok(answerToken > 0, 'ANSWER_TOKEN');
  const plain = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, max_tokens: 4 });
  assert.ok(plain.choices[0].message.content.startsWith('It is sunny'));
  const biased = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, max_tokens: 4,
                                                        logit_bias: { [answerToken]: -100 } });
  assert.ok(!biased.choices[0].message.content.startsWith('It is sunny'), biased.choices[0].message.content);
  const pen = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, frequency_penalty: 0.5,
                                                     presence_penalty: 0.5, repetition_penalty: 1.1 });
  assert.equal(pen.choices[0].message.content, ANSWER);   // no repeats in the answer: unchanged
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', messages: afterTool, logit_bias: { 99999999: 1 } }),
                       (e) => e.status === 400 && /outside the vocabulary/.test(e.message));
});

test('chat: n = 2 gives two indexed choices, streamed and not', async () => {
  const r = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => [c.index, c.message.content]), [[0, ANSWER], [1, ANSWER]]);
  const one = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0 });
  assert.equal(r.usage.completion_tokens, 2 * one.usage.completion_tokens);
  const stream = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, temperature: 0, n: 2, stream: true });
  const text = ['', ''];
  const finish = [null, null];
  for await (const c of stream)
    for (const ch of c.choices) { text[ch.index] += ch.delta?.content ?? ''; finish[ch.index] = ch.finish_reason ?? finish[ch.index]; }
  assert.deepEqual(text, [ANSWER, ANSWER]);
  assert.deepEqual(finish, ['stop', 'stop']);
});

test('forced tool_choice: the output starts the named call even after a tool result', async () => {
  const messages = [{ role: 'user', content: 'Weather?' }];
  const auto = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, tools: [weatherTool], temperature: 0 });
  assert.equal(auto.choices[0].message.content, ANSWER);   // unforced: it answers
  for (const tool_choice of [{ type: 'function', function: { name: 'get_weather' } }, 'required']) {
    const r = await openai.chat.completions.create({ model: 'ds4', messages: afterTool, tools: [weatherTool], temperature: 0, tool_choice });
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(tool_choice));
    assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(r.choices[0].message.tool_calls[0].function.arguments), ARGS);
  }
  const tools = [{ name: 'get_weather', input_schema: weatherTool.function.parameters }];
  const m = await anthropic.messages.create({ model: 'ds4', max_tokens: 64, temperature: 0, tools,
    tool_choice: { type: 'tool', name: 'get_weather' }, messages: afterTool });
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.find((b) => b.type === 'tool_use').input, ARGS);
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', messages, tools: [weatherTool],
    tool_choice: { type: 'function', function: { name: 'nope' } } }), (e) => e.status === 400 && e.param === 'tool_choice');
});

test('session extension: the conversation stays in ds4d between calls', async () => {
  const session = 'gw-chat-' + process.pid;
  const r1 = await openai.chat.completions.create({ model: 'ds4', temperature: 0, tools: [weatherTool], session,
    messages: [{ role: 'system', content: 'You help.' }, { role: 'user', content: 'Weather in Paris?' }] });
  const call = r1.choices[0].message.tool_calls[0];
  assert.deepEqual(JSON.parse(call.function.arguments), ARGS);
  // Only the new message: the session holds the rest.
  const r2 = await openai.chat.completions.create({ model: 'ds4', temperature: 0, tools: [weatherTool], session,
    messages: [{ role: 'tool', tool_call_id: call.id, content: 'sunny' }] });
  assert.equal(r2.choices[0].message.content, ANSWER);
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens, JSON.stringify([r1.usage, r2.usage]));
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', messages: afterTool, session, n: 2 }),
                       (e) => e.status === 400 && e.param === 'n');
  // The tool schemas are in the session's first turn: other tools are refused, leaving them
  // out continues with the remembered ones.
  const otherTool = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', session, tools: [otherTool],
    messages: [{ role: 'user', content: 'x' }] }), (e) => e.status === 400 && e.param === 'tools');
  const s2 = 'gw-chat2-' + process.pid;
  const t1 = await openai.chat.completions.create({ model: 'ds4', temperature: 0, tools: [weatherTool], session: s2,
    messages: [{ role: 'user', content: 'Weather in Paris?' }] });
  const c2 = t1.choices[0].message.tool_calls[0];
  const t2 = await openai.chat.completions.create({ model: 'ds4', temperature: 0, session: s2,
    messages: [{ role: 'tool', tool_call_id: c2.id, content: 'sunny' }] });
  assert.equal(t2.choices[0].message.content, ANSWER);
});

test('responses: previous_response_id continues its named session', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: weatherTool.function.parameters }];
  const r1 = await openai.responses.create({ model: 'ds4', input: 'Weather in Paris?', tools, temperature: 0,
                                             session: 'gw-resp-' + process.pid });
  const call = r1.output.find((o) => o.type === 'function_call');
  const r2 = await openai.responses.create({ model: 'ds4', previous_response_id: r1.id, tools, temperature: 0,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
  assert.equal(r2.output_text, ANSWER);
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens);
  // r1 is no longer the session's latest turn: continuing from it forks the conversation
  // (statelessly), and gives what continuing it did the first time.
  const toolOutput = [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }];
  const f1 = await openai.responses.create({ model: 'ds4', previous_response_id: r1.id, tools, temperature: 0,
                                             input: toolOutput });
  assert.equal(f1.output_text, ANSWER);
  // Its prompt is r1's whole turn (and its stop token) + the new input.
  assert.ok(f1.usage.input_tokens >= r1.usage.input_tokens + r1.usage.output_tokens + r2.usage.input_tokens,
            JSON.stringify([r1.usage, r2.usage, f1.usage]));
  // The session was not touched: r2 is still its latest turn and continues there.
  const r3 = await openai.responses.create({ model: 'ds4', previous_response_id: r2.id, temperature: 0, input: 'more?' });
  assert.ok(r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens, JSON.stringify(r3.usage));
  // Naming the session explicitly with a stale turn would drop its later turns: refused.
  await assert.rejects(openai.responses.create({ model: 'ds4', previous_response_id: r1.id, input: 'again',
                                                 session: 'gw-resp-' + process.pid }),
                       (e) => e.status === 400 && e.param === 'previous_response_id');
  // A fork into a new named session, which then continues there.
  const forkName = 'gw-fork-' + process.pid;
  const f2 = await openai.responses.create({ model: 'ds4', previous_response_id: r1.id, tools, temperature: 0,
                                             session: forkName, input: toolOutput });
  assert.equal(f2.output_text, ANSWER);
  const f3 = await openai.responses.create({ model: 'ds4', previous_response_id: f2.id, temperature: 0, input: 'more?' });
  assert.ok(f3.usage.input_tokens_details.cached_tokens >= f2.usage.input_tokens, JSON.stringify(f3.usage));
  await assert.rejects(openai.responses.create({ model: 'ds4', previous_response_id: r1.id, input: 'x', session: forkName }),
                       (e) => e.status === 400 && e.param === 'session');   // not empty any more
  await assert.rejects(openai.responses.create({ model: 'ds4', previous_response_id: 'resp_unknown', input: 'x' }),
                       (e) => e.status === 400 && e.code === 'previous_response_not_found');
});

test('responses: previous_response_id without a session (stateless, as OpenAI clients use it)', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters: weatherTool.function.parameters }];
  const r1 = await openai.responses.create({ model: 'ds4', input: 'Weather in Paris?', tools, temperature: 0 });
  const call = r1.output.find((o) => o.type === 'function_call');
  assert.deepEqual(JSON.parse(call.arguments), ARGS);
  const r2 = await openai.responses.create({ model: 'ds4', previous_response_id: r1.id, tools, temperature: 0,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
  assert.equal(r2.output_text, ANSWER);
  // The conversation's prefix came from ds4d's one-shot pool, not evaluated again.
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens, JSON.stringify(r2.usage));
  // store: false is not remembered.
  const r3 = await openai.responses.create({ model: 'ds4', input: 'x', store: false, max_output_tokens: 2 });
  await assert.rejects(openai.responses.create({ model: 'ds4', previous_response_id: r3.id, input: 'y' }),
                       (e) => e.status === 400 && e.code === 'previous_response_not_found');
});

// On the default model (a raw Python model with no chat template: left alone it writes
// code), response_format json_object makes every answer one JSON object.
const jsonClient = process.env.GW_JSON_URL
  ? new OpenAI({ apiKey: 'none', baseURL: process.env.GW_JSON_URL + '/v1', maxRetries: 0 }) : null;
const asObject = (text) => {
  const v = JSON.parse(text);
  assert.ok(v !== null && typeof v === 'object' && !Array.isArray(v), text);
  return v;
};
test('response_format json_object / json_schema: the default model answers with JSON.parse-able objects', async () => {
  if (!jsonClient) { console.log('  (skipped: no default model)'); return; }
  const messages = [{ role: 'user', content: 'Describe a Python list of three primes as a JSON object.' }];
  const plain = await jsonClient.chat.completions.create({ model: 'ds4', messages, temperature: 0, max_tokens: 48 });
  assert.throws(() => asObject(plain.choices[0].message.content), 'the model alone does not write JSON');
  const r = await jsonClient.chat.completions.create({ model: 'ds4', messages, temperature: 0, max_tokens: 64,
                                                       response_format: { type: 'json_object' } });
  asObject(r.choices[0].message.content);
  // Sampled, streamed, and cut by a small budget: still one whole object.
  for (const [seed, max_tokens] of [[1, 96], [2, 12], [3, 3]]) {
    const stream = await jsonClient.chat.completions.create({ model: 'ds4', messages, temperature: 1.0, seed,
      max_tokens, response_format: { type: 'json_object' }, stream: true });
    let text = '', finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    asObject(text);
    assert.ok(finish === 'stop' || finish === 'length', finish);
  }
  const resp = await jsonClient.responses.create({ model: 'ds4', input: 'A config file as JSON.', temperature: 0,
                                                   max_output_tokens: 40, text: { format: { type: 'json_object' } } });
  asObject(resp.output_text);
  // json_schema: the schema is written into the prompt and the answer is one JSON object
  // (the schema itself is not enforced); a root that is not an object is refused.
  const schema = { type: 'object', properties: { primes: { type: 'array', items: { type: 'integer' } } } };
  const s = await jsonClient.chat.completions.create({ model: 'ds4', messages, temperature: 0, max_tokens: 64,
    response_format: { type: 'json_schema', json_schema: { name: 'primes', strict: true, schema } } });
  asObject(s.choices[0].message.content);
  const rs = await jsonClient.responses.create({ model: 'ds4', input: 'Three primes.', temperature: 0, max_output_tokens: 40,
                                                 text: { format: { type: 'json_schema', name: 'primes', schema } } });
  asObject(rs.output_text);
  await assert.rejects(jsonClient.chat.completions.create({ model: 'ds4', messages,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array' } } } }),
    (e) => e.status === 400 && e.param === 'response_format.json_schema.schema');
});

test('errors through the SDKs', async () => {
  const bad = new OpenAI({ apiKey: 'wrong-key-wrong-key', baseURL: base + '/v1', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');
  await assert.rejects(openai.chat.completions.create({ model: 'ds4', messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }),
                       (e) => e.status === 400 && e.param === 'top_logprobs');
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
