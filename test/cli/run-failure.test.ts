// `rlstream run` when a role fails part-way: the task of docs/tasks.md, written to a directory outside the
// checkout (its reward.ts loaded through the `rlstream` command, as a user runs it), with a training file whose
// line after the rows the start-up check reads is not JSON. The rollout worker reaches it after those rows; the run
// must then stop every other role and exit 1 promptly with that one error line: no stack trace, no warning, no role
// left polling a closed log.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { appendFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { TRAIN_ROWS_CHECKED } from '../../cli/run/preflight.ts';

const ROOT = join(import.meta.dirname, '..', '..');
const BIN = join(ROOT, 'bin', 'rlstream.js');

function writeDocTask(dir: string): void {
  const text = readFileSync(join(ROOT, 'docs', 'tasks.md'), 'utf8');
  for (const m of text.matchAll(/<!-- file: (\S+) -->\n```\w*\n([\s\S]*?)```/g)) writeFileSync(join(dir, m[1]!), m[1] === 'config.yaml' ? m[2]!.replaceAll('RLSTREAM', ROOT) : m[2]!);
}

test('a role that fails ends the run: exit 1 with its error as one line, every other role stopped', { timeout: 240_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-run-failure-'));
  try {
    writeDocTask(dir);
    // Past the rows `config check` (and so `run` before it starts) reads, so that a role meets the bad line; 8 groups
    // of 2 a step take the rollout worker there within a few steps.
    const good = readFileSync(join(dir, 'train.jsonl'), 'utf8').trim().split('\n');
    const padded = Array.from({ length: TRAIN_ROWS_CHECKED + 1 }, (_, i) => good[i % good.length]!);
    writeFileSync(join(dir, 'train.jsonl'), padded.join('\n') + '\n');
    const rows = padded.length;
    appendFileSync(join(dir, 'train.jsonl'), '{not a row\n');
    const child = spawn(process.execPath, [BIN, 'run', 'config.yaml', '--set', 'trainer.max_steps=50', '--set', 'trainer.groups_per_step=8', '--set', 'rollout.n=2', '--no-admin', '--no-progress'], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.stdout.resume();
    // A run whose roles outlive the failure never exits: give it well over what start-up and one step take here.
    const killer = setTimeout(() => child.kill('SIGKILL'), 180_000);
    const [code, signal] = (await new Promise((resolve) => child.on('exit', (c, s) => resolve([c, s])))) as [number | null, string | null];
    clearTimeout(killer);
    assert.equal(signal, null, `the run did not exit after the failure; stderr:\n${stderr.slice(-3000)}`);
    assert.equal(code, 1, stderr);
    const lines = stderr.trim().split('\n');
    assert.match(lines[lines.length - 1]!, new RegExp(`^rlstream: INPUT_INVALID: ${join(dir, 'train.jsonl')} line ${rows + 1}: not JSON`));
    // Besides the run's own lines ("run: …" and plain progress lines), that one line: no stack frames, no warnings
    // from roles stopped under it.
    assert.deepEqual(lines.filter((l) => !/^(run: |(sft|eval|train) +\d+\/\d+ )/.test(l)), [lines[lines.length - 1]], stderr);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
