// The main job's progress bars hide the terminal cursor: a Ctrl-C (SIGINT) or SIGTERM during the run must give
// it back, and still end the process as the signal would. Run in a child process that signals itself.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'node:test';

const PROGRESS = pathToFileURL(join(import.meta.dirname, '..', '..', 'cli', 'run', 'progress.ts')).href;
const HIDE = '\x1B[?25l';
const SHOW = '\x1B[?25h';

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  test(`${signal} during the bars shows the cursor again and still ends the process`, { timeout: 30_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rlstream-progress-'));
    try {
      const script = join(dir, 'bars.mts');
      writeFileSync(
        script,
        // cli-progress draws (and hides the cursor) only on a terminal: stderr is a pipe here, so say it is one.
        `Object.assign(process.stderr, { isTTY: true, columns: 100 });
import { Progress } from ${JSON.stringify(PROGRESS)};
const bar = new Progress(true).bar('train', 10);
bar.update(3, 10, 'reward 0.1');
setTimeout(() => process.kill(process.pid, '${signal}'), 200);
setTimeout(() => console.log('still running'), 10_000);
`,
      );
      const child = spawn(process.execPath, ['--import', 'tsx', script], { cwd: join(import.meta.dirname, '..', '..'), stdio: ['ignore', 'pipe', 'pipe'] });
      let err = '';
      let out = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      const end = await new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on('exit', (code, sig) => resolve({ code, signal: sig })));
      assert.deepEqual(end, { code: null, signal }, 'ended by the signal');
      assert.equal(out, '', 'did not keep running');
      assert.ok(err.includes(HIDE), 'the bars hid the cursor');
      assert.ok(err.lastIndexOf(SHOW) > err.lastIndexOf(HIDE), 'and it was shown again');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
}
