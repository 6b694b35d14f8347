// Which run directory the main job works in (cli/run/resume.ts): a new one, the newest unfinished run of the
// same configuration, or the one --resume names; finished runs and runs of another configuration are left alone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { chooseRun, finishRun, isFinished } from '../../cli/run/resume.ts';

const CONFIG = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');

test('resume: auto picks the newest unfinished run of the configuration; finished and other-configuration runs are skipped', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-resume-'));
  try {
    const config = loadRunConfig(CONFIG, { 'run.data_dir': dir, 'run.id': 'r' });
    const other = loadRunConfig(CONFIG, { 'run.data_dir': dir, 'run.id': 'r', 'trainer.max_steps': 3 });
    const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s));
    // Nothing there yet: a new run, whose id carries its start time.
    const a = chooseRun(config, { kind: 'auto' }, at(1));
    assert.equal(a.resumed, false);
    assert.equal(a.runId, 'r-1-20260101000001');
    assert.match(a.message, /starting run r-1-20260101000001 .*no unfinished run/);
    const b = chooseRun(config, { kind: 'new' }, at(2));
    assert.equal(b.resumed, false);
    assert.match(b.message, /--new/);
    chooseRun(other, { kind: 'new' }, at(3)); // newer, but started by another configuration
    // The newest unfinished run of this configuration is b.
    const c = chooseRun(config, { kind: 'auto' }, at(4));
    assert.deepEqual([c.resumed, c.runId, c.runDir], [true, b.runId, b.runDir]);
    assert.match(c.message, /resuming run r-1-20260101000002.*1 older unfinished run/);
    // Once b has finished, a is the newest unfinished one; once a has too, a new run starts.
    finishRun(b.runDir, { steps: 1 });
    assert.ok(isFinished(b.runDir));
    assert.equal(chooseRun(config, { kind: 'auto' }, at(5)).runId, a.runId);
    finishRun(a.runDir, { steps: 1 });
    const d = chooseRun(config, { kind: 'auto' }, at(6));
    assert.deepEqual([d.resumed, d.runId], [false, 'r-1-20260101000006']);
    assert.equal(readdirSync(dir).length, 4);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('resume: --resume takes an unfinished run of this run.id; a finished run, another run.id or no run directory is refused', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-resume-'));
  try {
    const config = loadRunConfig(CONFIG, { 'run.data_dir': dir, 'run.id': 'r' });
    const a = chooseRun(config, { kind: 'new' });
    const picked = chooseRun(config, { kind: 'dir', dir: a.runDir });
    assert.deepEqual([picked.resumed, picked.runId, picked.runDir], [true, a.runId, a.runDir]);
    assert.match(picked.message, /as --resume asked/);
    const changed = chooseRun(loadRunConfig(CONFIG, { 'run.data_dir': dir, 'run.id': 'r', 'trainer.max_steps': 3 }), { kind: 'dir', dir: a.runDir });
    assert.match(changed.message, /configuration differed/);
    assert.throws(() => chooseRun(loadRunConfig(CONFIG, { 'run.data_dir': dir, 'run.id': 'q' }), { kind: 'dir', dir: a.runDir }), (e) => isRlstreamError(e, 'CONFIG_INVALID') && /not a run of run.id q/.test(e.message));
    assert.throws(() => chooseRun(config, { kind: 'dir', dir }), (e) => isRlstreamError(e, 'CONFIG_INVALID') && /not a run directory/.test(e.message));
    finishRun(a.runDir, {});
    assert.throws(() => chooseRun(config, { kind: 'dir', dir: a.runDir }), (e) => isRlstreamError(e, 'CONFIG_INVALID') && /has finished.*--new/.test(e.message));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
