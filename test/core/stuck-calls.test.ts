// A process whose native call never returns must still end: Node's exit joins libuv's thread pool, so
// process.exit waits forever on a thread stuck in a call (a librdkafka transactional call across a broker
// restart left a role alive but idle, which its supervisor never restarted). A read of a FIFO nobody writes
// holds a pool thread the same way, for real.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const stuckCalls = fileURLToPath(new URL('../../core/stuck-calls.ts', import.meta.url));

/** Runs `body` in a child (ESM, tsx) after a pool thread is blocked on `fifo`; resolves how it ended, or 'alive' after `ms`. */
function child(fifo: string, body: string, ms: number): Promise<{ end: string; stderr: string }> {
  const src = `import { readFile } from 'node:fs'; import { markStuck, exitNow } from ${JSON.stringify(stuckCalls)};
readFile(${JSON.stringify(fifo)}, () => {});
setTimeout(() => { ${body} }, 100);`;
  const c = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', src], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  c.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      c.kill('SIGKILL');
      resolve({ end: 'alive', stderr });
    }, ms);
    c.once('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ end: signal ?? `code ${code}`, stderr });
    });
  });
}

test('exitNow ends a process whose stuck call holds a pool thread; process.exit alone does not', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-stuck-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fifo = join(dir, 'never-written');
  execFileSync('mkfifo', [fifo]);

  // Without the record: the exit waits for the thread, and the process stays alive.
  const plain = await child(fifo, 'process.exit(1);', 4000);
  assert.equal(plain.end, 'alive', `process.exit with a blocked pool thread: ${plain.end}`);

  // With the call recorded as stuck, exitNow ends it, saying why (a process still alive after 15 s reads 'alive').
  const marked = await child(fifo, `markStuck('transactional sendOffsets'); exitNow(1);`, 15_000);
  assert.equal(marked.end, 'SIGKILL', marked.stderr);
  assert.match(marked.stderr, /ending with SIGKILL instead of exit code 1: 1 native call\(s\) never returned \(transactional sendOffsets\)/);
});

test('exitNow exits with its code when no call is stuck, or the stuck one came back', async () => {
  const src = `import { markStuck, exitNow } from ${JSON.stringify(stuckCalls)}; const back = markStuck('x'); back(); exitNow(3);`;
  const c = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', src], { stdio: 'ignore' });
  const code = await new Promise<number | null>((r) => c.once('exit', (c0) => r(c0)));
  assert.equal(code, 3);
});
