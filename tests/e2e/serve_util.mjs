// Helpers for the Node e2e tests: start the real `chorus serve` on a free loopback port.
import { spawn } from 'node:child_process';
import path from 'node:path';

export const MODEL_NAME = 'stories260K';

// Starts `chorus serve` on the stories260K model with extra flags; resolves to
// { proc, url, exited } once it prints its URL. `exited` resolves to the exit code.
export function startServer(extraArgs = []) {
  const bin = process.env.CHORUS_BIN;
  const models = process.env.CHORUS_MODELS;
  const args = ['serve', '--model', path.join(models, 'stories260K/stories260K.bin'),
    '--tokenizer', path.join(models, 'stories260K/tok512.bin'), '--served-model-name', MODEL_NAME,
    '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--pool-size', '64', ...extraArgs];
  const proc = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal)));
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('server did not start: ' + stderr)); }, 60000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/at (http:\/\/[^\s]+)\/v1/);
      if (m) { clearTimeout(timer); resolve({ proc, url: m[1], exited, stderr: () => stderr }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}): ${stderr}`)); });
  });
}

// Reads an SSE response body, calling onData(payload) for each `data:` event.
export async function readSse(response, onData) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of response.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (ev.startsWith(':')) continue;
      if (!ev.startsWith('data: ')) throw new Error('bad SSE event: ' + ev);
      onData(ev.slice(6));
    }
  }
  if (buf.length) throw new Error('trailing SSE bytes: ' + buf);
}

// Minimal test runner: prints one line per test and a closing "N passed, M failed" line.
export async function run(tests) {
  let passed = 0, failed = 0;
  for (const [name, fn] of tests) {
    try {
      await fn();
      passed++;
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}
