// eval, sft and run as real processes, for what a new user trips over: eval measures what the main job measures
// (the config's held-out difficulty), lists the same choices as the README, and reads a relative --weights from
// the working directory; sft without --out and a run whose model.init is missing write under the run's data
// directory, and nothing under the repository (the shipped checkpoint stays byte for byte).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { after, test } from 'node:test';

const REPO = join(import.meta.dirname, '..', '..');
const BIN = join(REPO, 'bin', 'rlstream.js');
const CONFIG = join(REPO, 'examples', 'calculator', 'config.yaml');
const SHIPPED = join(REPO, 'examples', 'calculator', 'checkpoints', 'sft');
const TINY_SFT = 'sft.stages=[{problems: 16, steps: 2}]';
const dir = mkdtempSync(join(tmpdir(), 'rlstream-eval-sft-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function rlstream(args: string[], cwd = REPO) {
  const r = spawnSync(process.execPath, [BIN, ...args], { cwd, encoding: 'utf8', timeout: 300_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Every file under examples/ with its content hash: what a run must leave as it was. */
function snapshot(root = join(REPO, 'examples')): Map<string, string> {
  const out = new Map<string, string>();
  const visit = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) visit(p);
      else out.set(relative(root, p), createHash('sha256').update(readFileSync(p)).digest('hex'));
    }
  };
  visit(root);
  return out;
}

test('eval: the config\'s held-out difficulty by default, the README\'s choices in --help, --weights relative to the working directory', { timeout: 300_000 }, () => {
  const help = rlstream(['eval', '--help']);
  assert.match(help.stdout, /easy \| medium \| hard/);
  assert.match(readFileSync(join(REPO, 'README.md'), 'utf8'), /eval <config> \[--weights f\] \[--difficulty easy\\\|medium\\\|hard\]/);

  // From the repository root, a path relative to it (relative to the config's folder it would not exist).
  const r = rlstream(['eval', CONFIG, '--problems', '3', '--weights', relative(REPO, SHIPPED)]);
  assert.equal(r.code, 0, r.stderr);
  const line = JSON.parse(r.stdout.trim().split('\n').pop()!) as { difficulty: string; problems: number };
  assert.equal(line.difficulty, 'medium', 'what the main job measures (task.heldout)');
  assert.equal(line.problems, 3);

  const missing = rlstream(['eval', CONFIG, '--problems', '1', '--weights', 'no/such/weights.safetensors']);
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /--weights no\/such\/weights.safetensors does not exist \(looked for .*no\/such\/weights.safetensors\)/);
});

test('sft without --out writes under run.data_dir, never over the shipped checkpoint', { timeout: 300_000 }, () => {
  const before = snapshot();
  const data = join(dir, 'sft-data');
  const r = rlstream(['sft', CONFIG, '--set', `run.data_dir=${data}`, '--set', TINY_SFT]);
  assert.equal(r.code, 0, r.stderr);
  const out = (JSON.parse(r.stdout.trim().split('\n').pop()!) as { out: string }).out;
  assert.ok(out.startsWith(data + '/sft-1-'), out);
  assert.ok(statSync(join(out, 'model.safetensors')).size > 0);
  assert.deepEqual(snapshot(), before, 'nothing under examples/ changed');
});

test('a run whose model.init does not exist trains it into the run directory, not into the source tree', { timeout: 300_000 }, () => {
  const before = snapshot();
  const data = join(dir, 'run-data');
  const r = rlstream([
    'run', CONFIG, '--no-admin', '--no-progress',
    '--set', `run.data_dir=${data}`, '--set', 'model.init=checkpoints/typo', '--set', TINY_SFT,
    '--set', 'trainer.max_steps=1', '--set', 'task.heldout_problems=2',
  ]);
  assert.equal(r.code, 0, r.stderr);
  const summary = JSON.parse(r.stdout.trim().split('\n').pop()!) as { data_dir: string; sft_seconds: number | null };
  assert.ok(summary.sft_seconds !== null, 'SFT ran');
  assert.ok(existsSync(join(summary.data_dir, 'sft', 'model.safetensors')), 'the warm start is in the run directory');
  assert.match(r.stderr, /model\.init .*checkpoints\/typo does not exist: training the warm start now \(SFT\) into /);
  assert.equal(existsSync(join(REPO, 'examples', 'calculator', 'checkpoints', 'typo')), false);
  assert.deepEqual(snapshot(), before, 'nothing under examples/ changed');
});
