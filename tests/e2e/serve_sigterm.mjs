// SIGTERM on the real `chorus serve`: running requests finish within --drain-timeout (or are
// aborted with an error event after it), /health turns 503, and the process exits 0.
import assert from 'node:assert/strict';
import { startServer, readSse, run } from './serve_util.mjs';

async function streamThenSigterm(server, onFirst) {
  const res = await fetch(server.url + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: [1], max_tokens: 400, ignore_eos: true, temperature: 0, stream: true }),
  });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  const seen = { finish: null, error: null, done: false, text: '' };
  let first = true;
  await readSse(res, (data) => {
    if (first) { first = false; onFirst(); }
    if (data === '[DONE]') { seen.done = true; return; }
    const j = JSON.parse(data);
    if (j.error) { seen.error = j.error; return; }
    for (const c of j.choices) {
      seen.text += c.text;
      if (c.finish_reason) seen.finish = c.finish_reason;
    }
  });
  return seen;
}

await run([
  ['drain lets a running stream finish, then exits 0', async () => {
    const server = await startServer(['--drain-timeout', '120']);
    const health = await fetch(server.url + '/health');
    assert.equal(health.status, 200);
    const seen = await streamThenSigterm(server, () => server.proc.kill('SIGTERM'));
    assert.equal(seen.error, null);
    assert.equal(seen.finish, 'length');
    assert.ok(seen.done);
    assert.equal(await server.exited, 0, server.stderr());
  }],
  ['drain timeout 0 aborts the stream with an error event, exits 0', async () => {
    const server = await startServer(['--drain-timeout', '0']);
    const seen = await streamThenSigterm(server, () => server.proc.kill('SIGTERM'));
    assert.ok(seen.error, 'expected an error event');
    assert.equal(seen.error.code, 'service_unavailable');
    assert.ok(seen.done);
    assert.equal(await server.exited, 0, server.stderr());
  }],
  ['SIGINT on an idle server exits 0', async () => {
    const server = await startServer();
    server.proc.kill('SIGINT');
    assert.equal(await server.exited, 0, server.stderr());
  }],
]);
