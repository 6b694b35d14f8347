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

/**
 * Run `body` after a prelude that makes stderr look like a terminal (cli-progress draws, and hides the cursor,
 * only on one; stderr is a pipe here) and imports Progress; resolves with how it ended and what it printed.
 */
async function runBars(body: string): Promise<{ code: number | null; signal: string | null; out: string; err: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-progress-'));
  try {
    const script = join(dir, 'bars.mts');
    writeFileSync(script, `Object.assign(process.stderr, { isTTY: true, columns: 100 });\nimport { Progress } from ${JSON.stringify(PROGRESS)};\n${body}`);
    const child = spawn(process.execPath, ['--import', 'tsx', script], { cwd: join(import.meta.dirname, '..', '..'), stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    let out = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const end = await new Promise<{ code: number | null; signal: string | null }>((resolve) => child.on('exit', (code, sig) => resolve({ code, signal: sig })));
    return { ...end, out, err };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  test(`${signal} during the bars shows the cursor again and still ends the process`, { timeout: 30_000 }, async () => {
    const { code, signal: ended, out, err } = await runBars(`const bar = new Progress(true).bar('train', 10);
bar.update(3, 10, 'reward 0.1');
setTimeout(() => process.kill(process.pid, '${signal}'), 200);
setTimeout(() => console.log('still running'), 10_000);
`);
    assert.deepEqual({ code, signal: ended }, { code: null, signal }, 'ended by the signal');
    assert.equal(out, '', 'did not keep running');
    assert.ok(err.includes(HIDE), 'the bars hid the cursor');
    assert.ok(err.lastIndexOf(SHOW) > err.lastIndexOf(HIDE), 'and it was shown again');
  });
}

test('a line written to stderr while the bars are up is printed above them, not drawn over', { timeout: 30_000 }, async () => {
  const { code, err } = await runBars(`const p = new Progress(true);
const bar = p.bar('train', 10);
const evalBar = p.bar('eval', 4);
bar.update(1, 10, 'first');
evalBar.update(1, 4, 'before');
process.stderr.write('admin: http://127.0.0.1:1/dashboard/\\n');
setTimeout(() => { bar.update(2, 10, 'second'); process.stderr.write('last words\\n'); p.stop(); }, 300);
`);
  assert.equal(code, 0, err);
  // Replay the terminal: the bars move the cursor up to redraw; a line printed above them survives.
  const screen = render(err);
  assert.ok(screen.some((l) => l.startsWith('admin: http://127.0.0.1:1/dashboard/')), screen.join('\n'));
  assert.ok(screen.some((l) => l.startsWith('last words')), screen.join('\n'));
  assert.ok(screen.some((l) => l.startsWith('train  [') && l.includes('2/10 second')), screen.join('\n'));
});

/** A minimal terminal: CR, LF, cursor up (ESC[nA), to column (ESC[nG), erase to end of line (ESC[0K); other sequences dropped. */
function render(out: string): string[] {
  const lines: string[] = [''];
  let row = 0;
  let col = 0;
  const put = (ch: string) => {
    const l = lines[row]!.padEnd(col);
    lines[row] = l.slice(0, col) + ch + l.slice(col + 1);
    col++;
  };
  for (let i = 0; i < out.length; i++) {
    const c = out[i]!;
    if (c === '\x1B') {
      const m = /^\[(\??)(\d*)([A-Za-z])/.exec(out.slice(i + 1));
      if (!m) continue;
      i += m[0].length;
      const n = Number(m[2] || '1');
      if (m[3] === 'A') row = Math.max(0, row - n);
      else if (m[3] === 'G') col = n - 1;
      else if (m[3] === 'K') lines[row] = lines[row]!.slice(0, col);
      continue;
    }
    if (c === '\r') col = 0;
    else if (c === '\n') {
      row++;
      col = 0;
      if (lines.length <= row) lines.push('');
    } else put(c);
  }
  return lines;
}
