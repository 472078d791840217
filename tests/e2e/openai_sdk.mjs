// The official OpenAI Node SDK (npm `openai`) against the real `chorus serve`: models,
// completions, chat, streaming (with include_usage), tools, embeddings, and the SDK's error
// classes.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, run, MODEL_NAME } from './serve_util.mjs';

const require = createRequire(path.join(process.env.CHORUS_NODE_DIR, 'package.json'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;
const expectedText = fs.readFileSync(
  path.join(process.env.CHORUS_MODELS, 'stories260K/expected_greedy_t0_200steps.txt'), 'utf8');

const TOOLS = [{
  type: 'function',
  function: {
    name: 'weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } },
  },
}];

const KEY = 'sdk-test-key';
const server = await startServer(['--api-key', KEY]);
const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: KEY, maxRetries: 0 });

await run([
  ['models.list', async () => {
    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [MODEL_NAME]);
  }],
  ['completions: greedy text equals llama2.c', async () => {
    const r = await client.completions.create({ model: MODEL_NAME, prompt: [1], max_tokens: 40, temperature: 0 });
    assert.ok(r.id.startsWith('cmpl-'));
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok(r.choices[0].text.length > 20);
    assert.ok(expectedText.startsWith(r.choices[0].text), r.choices[0].text);
    assert.deepEqual(r.usage, { prompt_tokens: 1, completion_tokens: 40, total_tokens: 41 });
  }],
  ['completions: streaming equals non-streaming', async () => {
    const params = { model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 30, temperature: 0 };
    const full = await client.completions.create(params);
    const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = '', finish = null, usage = null, chunks = 0;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        chunks++;
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(text, full.choices[0].text);
    assert.equal(finish, full.choices[0].finish_reason);
    assert.ok(chunks > 5);
    assert.deepEqual(usage, full.usage);
  }],
  ['chat: non-streaming and streaming agree', async () => {
    const params = {
      model: MODEL_NAME,
      messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
      max_tokens: 24, temperature: 0, seed: 7,
    };
    const r = await client.chat.completions.create(params);
    assert.ok(r.id.startsWith('chatcmpl-'));
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let content = '', role = null, usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.delta.content) content += c.delta.content;
      }
    }
    assert.equal(role, 'assistant');
    assert.equal(content, r.choices[0].message.content);
    assert.deepEqual(usage, r.usage);
  }],
  ['chat: logprobs and n', async () => {
    const r = await client.chat.completions.create({
      model: MODEL_NAME, messages: [{ role: 'user', content: 'Hi' }], max_completion_tokens: 5, n: 2,
      temperature: 0, logprobs: true, top_logprobs: 2,
    });
    assert.equal(r.choices.length, 2);
    assert.equal(r.choices[0].message.content, r.choices[1].message.content);
    assert.equal(r.choices[0].logprobs.content.length, r.usage.completion_tokens / 2);
    assert.equal(r.choices[0].logprobs.content[0].top_logprobs.length, 2);
  }],
  ['tools: auto, then the tool result round-trips to a final answer (streamed and not)', async () => {
    // stories260K never writes a call by itself: under tool_choice "auto" it answers in text,
    // which must stay content; the conversation then carries a call and its result back.
    const base = { model: MODEL_NAME, tools: TOOLS, max_tokens: 8, temperature: 0 };
    const first = await client.chat.completions.create({
      ...base, messages: [{ role: 'user', content: 'Weather in Paris?' }], tool_choice: 'auto',
    });
    assert.equal(typeof first.choices[0].message.content, 'string');
    assert.equal(first.choices[0].message.tool_calls, undefined);
    assert.ok(['stop', 'length'].includes(first.choices[0].finish_reason));
    const messages = [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_abc', type: 'function', function: { name: 'weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_abc', content: 'sunny' },
    ];
    const final = await client.chat.completions.create({ ...base, messages });
    assert.equal(typeof final.choices[0].message.content, 'string');
    assert.ok(final.choices[0].message.content.length > 0);
    const stream = await client.chat.completions.create({ ...base, messages, stream: true });
    let content = '';
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        assert.equal(c.delta.tool_calls, undefined);
        if (c.delta.content) content += c.delta.content;
      }
    }
    assert.equal(content, final.choices[0].message.content);
  }],
  ['tools: required and a named function are enforced, streamed and not, then round-trip', async () => {
    // stories260K never calls a tool by itself: the grammar engine makes the reply a call.
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    const named = { type: 'function', function: { name: 'weather' } };
    for (const tool_choice of ['required', named]) {
      const params = { model: MODEL_NAME, tools: TOOLS, tool_choice, messages, temperature: 1, seed: 3 };
      const r = await client.chat.completions.create(params);
      const msg = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(msg.content, null);
      assert.equal(msg.tool_calls.length, 1);
      const call = msg.tool_calls[0];
      assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(call.type, 'function');
      assert.equal(call.function.name, 'weather');
      const args = JSON.parse(call.function.arguments);
      assert.equal(typeof args, 'object');
      for (const k of Object.keys(args)) assert.ok(k === 'city' && typeof args[k] === 'string', call.function.arguments);
      // Streamed: the same call, reassembled from delta.tool_calls as the SDK's users do.
      const stream = await client.chat.completions.create({ ...params, stream: true });
      const calls = [];
      let finish = null, content = '';
      for await (const chunk of stream) {
        for (const c of chunk.choices) {
          if (c.finish_reason) finish = c.finish_reason;
          if (c.delta.content) content += c.delta.content;
          for (const d of c.delta.tool_calls ?? []) {
            if (d.id) calls[d.index] = { id: d.id, name: d.function.name, arguments: d.function.arguments ?? '' };
            else calls[d.index].arguments += d.function.arguments;
          }
        }
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(content, '');
      assert.equal(calls.length, 1);
      assert.equal(calls[0].name, 'weather');
      assert.deepEqual(JSON.parse(calls[0].arguments), args);  // same seed, same call
      // The call and its result go back; the final answer is text.
      const final = await client.chat.completions.create({
        model: MODEL_NAME, tools: TOOLS, max_tokens: 8, temperature: 0,
        messages: [...messages, msg, { role: 'tool', tool_call_id: call.id, content: 'sunny' }],
      });
      assert.equal(typeof final.choices[0].message.content, 'string');
      assert.ok(['stop', 'length'].includes(final.choices[0].finish_reason));
    }
  }],
  ['tools: bad input is a 400 naming the field', async () => {
    const messages = [{ role: 'user', content: 'Hi' }];
    const bad = async (extra, param) => assert.rejects(
      client.chat.completions.create({ model: MODEL_NAME, messages, max_tokens: 1, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === param);
    await bad({ tools: [{ type: 'function', function: { description: 'no name' } }] }, 'tools[0].function.name');
    await bad({ tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, 'tools[0].function.parameters');
    await bad({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name');
    await bad({ tool_choice: 'required' }, 'tool_choice');
    await bad({ messages: [...messages, { role: 'tool', content: 'x' }] }, 'messages[1].tool_call_id');
  }],
  ['embeddings: the SDK\'s default base64 decodes to the float form', async () => {
    const input = ['Once upon a time', 'Lily and Ben went to the park'];
    const r = await client.embeddings.create({ model: MODEL_NAME, input });  // asks for base64
    const f = await client.embeddings.create({ model: MODEL_NAME, input, encoding_format: 'float' });
    assert.equal(r.object, 'list');
    assert.equal(r.data.length, 2);
    for (let i = 0; i < 2; i++) {
      assert.equal(r.data[i].index, i);
      assert.equal(r.data[i].embedding.length, f.data[i].embedding.length);
      assert.ok(r.data[i].embedding.length > 0);
      assert.deepEqual(Array.from(r.data[i].embedding), f.data[i].embedding);
      const norm = Math.hypot(...f.data[i].embedding);
      assert.ok(Math.abs(norm - 1) < 1e-5, String(norm));
    }
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
    await assert.rejects(client.embeddings.create({ model: MODEL_NAME, input: '' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'input');
  }],
  ['errors map to the SDK classes', async () => {
    await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
    await assert.rejects(client.completions.create({ model: MODEL_NAME, prompt: 'x', temperature: -1 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
    const bad = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
    await assert.rejects(client.completions.create({ model: MODEL_NAME, prompt: 'x', max_tokens: 100000 }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded');
  }],
].map(([name, fn]) => [name, fn]).concat([['server shuts down cleanly', async () => {
  server.proc.kill('SIGTERM');
  assert.equal(await server.exited, 0, server.stderr());
}]]));
