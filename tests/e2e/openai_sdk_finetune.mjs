// The official OpenAI Node SDK (npm `openai`), unmodified, against the real `chorus serve`'s
// fine-tuning API: files.create (multipart), fineTuning.jobs.create / retrieve / list /
// listEvents / cancel, the finished ft: model in models.list and answering a completion, and the
// SDK's error classes for bad input.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, run, MODEL_NAME } from './serve_util.mjs';

const require = createRequire(path.join(process.env.CHORUS_NODE_DIR, 'package.json'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;
const toFile = sdk.toFile;

const state = fs.mkdtempSync(path.join(os.tmpdir(), 'chorus-sdk-ft-'));
// The first documents of the stories260K "things" text, one {"text"} line each.
const text = fs.readFileSync(
  path.join(process.env.CHORUS_MODELS, 'stories260K-finetunes/things/data/train.txt'), 'utf8');
const docs = text.split(/\n[ \t]*\n/).map((d) => d.replace(/^\n+|\n+$/g, '')).filter((d) => d.trim());
const jsonl = docs.slice(0, 16).map((d) => JSON.stringify({ text: d })).join('\n') + '\n';
const jsonlPath = path.join(state, 'train.jsonl');
fs.writeFileSync(jsonlPath, jsonl);

const KEY = 'sdk-ft-key';
const server = await startServer(['--api-key', KEY, '--registry', path.join(state, 'registry.json'),
  '--finetune-dir', path.join(state, 'ft')]);
const client = new OpenAI({ baseURL: server.url + '/v1', apiKey: KEY, maxRetries: 0 });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let fileId;

async function waitFor(id, pred) {
  for (let i = 0; i < 3000; i++) {
    const job = await client.fineTuning.jobs.retrieve(id);
    if (pred(job)) return job;
    await sleep(100);
  }
  throw new Error('job did not get there: ' + id);
}

await run([
  ['files.create (fs.createReadStream) and files.retrieve', async () => {
    const f = await client.files.create({ file: fs.createReadStream(jsonlPath), purpose: 'fine-tune' });
    assert.equal(f.object, 'file');
    assert.ok(f.id.startsWith('file-'));
    assert.equal(f.purpose, 'fine-tune');
    assert.equal(f.bytes, Buffer.byteLength(jsonl));
    assert.equal(f.filename, 'train.jsonl');
    fileId = f.id;
    const again = await client.files.retrieve(f.id);
    assert.equal(again.id, f.id);
    const list = await client.files.list();
    assert.ok(list.data.some((x) => x.id === f.id));
  }],
  ['fineTuning.jobs.create / retrieve / listEvents until succeeded; the model answers', async () => {
    const job = await client.fineTuning.jobs.create({
      model: MODEL_NAME, training_file: fileId, suffix: 'sdk', seed: 11,
      hyperparameters: { n_epochs: 1, batch_size: 2, learning_rate_multiplier: 'auto' },
    });
    assert.equal(job.object, 'fine_tuning.job');
    assert.ok(['queued', 'running', 'validating_files'].includes(job.status), job.status);
    const done = await waitFor(job.id, (j) => ['succeeded', 'failed', 'cancelled'].includes(j.status));
    assert.equal(done.status, 'succeeded', JSON.stringify(done.error));
    assert.equal(done.fine_tuned_model, `ft:${MODEL_NAME}:sdk:${job.id}`);
    const events = await client.fineTuning.jobs.listEvents(job.id, { limit: 100 });
    assert.ok(events.data.length > 3);
    assert.equal(events.data[0].object, 'fine_tuning.job.event');
    assert.equal(events.data[0].message, 'The job has successfully completed');
    const listed = await client.fineTuning.jobs.list({ limit: 10 });
    assert.ok(listed.data.some((j) => j.id === job.id));
    const models = await client.models.list();
    assert.ok(models.data.some((m) => m.id === done.fine_tuned_model));
    const c = await client.completions.create({ model: done.fine_tuned_model, prompt: 'Once', max_tokens: 6, temperature: 0 });
    assert.equal(c.model, done.fine_tuned_model);
    assert.ok(c.choices[0].text.length > 0);
  }],
  ['fineTuning.jobs.cancel', async () => {
    const job = await client.fineTuning.jobs.create({
      model: MODEL_NAME, training_file: fileId, hyperparameters: { n_epochs: 50, batch_size: 1 },
    });
    await waitFor(job.id, (j) => j.status === 'running');
    const c = await client.fineTuning.jobs.cancel(job.id);
    assert.equal(c.id, job.id);
    const done = await waitFor(job.id, (j) => j.status !== 'running');
    assert.equal(done.status, 'cancelled');
    assert.equal(done.fine_tuned_model, null);
  }],
  ['bad input: the SDK raises BadRequestError / NotFoundError naming the problem', async () => {
    await assert.rejects(
      client.fineTuning.jobs.create({ model: 'gpt-4o-mini', training_file: fileId }),
      (e) => e instanceof OpenAI.BadRequestError && /gpt-4o-mini/.test(e.message));
    await assert.rejects(
      client.fineTuning.jobs.create({ model: MODEL_NAME, training_file: 'file-nope' }),
      (e) => e instanceof OpenAI.BadRequestError && /file-nope/.test(e.message));
    await assert.rejects(
      client.fineTuning.jobs.create({ model: MODEL_NAME, training_file: fileId, hyperparameters: { n_epochs: 1000 } }),
      (e) => e instanceof OpenAI.BadRequestError && /n_epochs/.test(e.message));
    await assert.rejects(client.fineTuning.jobs.retrieve('ftjob-nope'),
      (e) => e instanceof OpenAI.NotFoundError);
    await assert.rejects(
      client.files.create({ file: await toFile(Buffer.from('{}\n'), 'x.jsonl'), purpose: 'assistants' }),
      (e) => e instanceof OpenAI.BadRequestError && /fine-tune/.test(e.message));
  }],
  ['a bad line fails the job, naming the line', async () => {
    const bad = jsonl.split('\n').slice(0, 4).join('\n') + '\n{"prompt": "no completion"}\n';
    const f = await client.files.create({ file: await toFile(Buffer.from(bad), 'bad.jsonl'), purpose: 'fine-tune' });
    const job = await client.fineTuning.jobs.create({ model: MODEL_NAME, training_file: f.id });
    const done = await waitFor(job.id, (j) => ['succeeded', 'failed', 'cancelled'].includes(j.status));
    assert.equal(done.status, 'failed');
    assert.match(done.error.message, /line 5/);
    assert.equal(done.error.param, 'training_file');
  }],
  ['server shuts down cleanly', async () => {
    server.proc.kill('SIGTERM');
    assert.equal(await server.exited, 0, server.stderr());
    fs.rmSync(state, { recursive: true, force: true });
  }],
]);
