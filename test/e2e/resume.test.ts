// The main job resumes after a crash: `rlstream run` (a real process) is SIGKILLed at a random moment three
// times and started again with the same arguments each time; every later life resumes the first life's run
// (one run directory), and the last one finishes it. The log then holds steps 1..max_steps once each,
// contiguous, with no trajectory in two steps, and the final JSON line has the shape of an uninterrupted run's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import { collectRun, readTopic } from '../../testkit/audit.ts';
import { runLife, stepsPrinted, type Kill, type Life } from '../../testkit/run-life.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CONFIG = join(ROOT, 'examples', 'calculator', 'config.yaml');
// Steps come in bursts (a resumed trainer takes what was already advantaged), up to 9 before a kill lands on a fast
// machine: three lives must not use up the run, or the last one starts a new run instead of resuming.
const MAX_STEPS = 40;
const KILLS = 3;
const SETS = { 'trainer.max_steps': MAX_STEPS, 'trainer.groups_per_step': 2, 'rollout.n': 4, 'rollout.concurrency': 16, 'task.heldout_problems': 8, 'eval.problems': 4, 'eval.every_steps': 10 };

const lastStep = (stderr: string): number => Math.max(0, ...stepsPrinted(stderr));

/** One life of `rlstream run` in `dataDir` (testkit/run-life.ts); `extra` overrides the test's settings. */
const life = (dataDir: string, runIdBase: string, kill: Kill | null, extra: Record<string, number> = {}): Promise<Life> =>
  runLife(CONFIG, { ...SETS, ...extra, 'run.id': runIdBase, 'run.data_dir': dataDir }, kill);

/**
 * Keys of a JSON value, recursively, with the type of each leaf: the shape of the summary line. An array's items
 * count as one shape (`[]`): a longer run lists more evaluations, which is not another shape.
 */
function shape(v: unknown, at = ''): string[] {
  if (v === null || typeof v !== 'object') return [`${at}:${v === null ? 'null' : typeof v}`];
  if (Array.isArray(v)) return [...new Set(v.flatMap((x) => shape(x, `${at}[]`)))].sort();
  return Object.entries(v as Record<string, unknown>).flatMap(([k, x]) => shape(x, `${at}.${k}`)).sort();
}

test('main job: SIGKILLed at random moments three times, each restart resumes the run; the final run is whole', { timeout: 600_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-resume-'));
  try {
    const runIdBase = `resume${process.pid}`;
    const lives: { kill: Kill | null; life: Life; steps: number }[] = [];
    for (let i = 0; i <= KILLS; i++) {
      // Kills fall anywhere from start-up (evaluation, first rollouts) to a life's second step, at a random moment
      // within the step under way (a step takes well under a second here, and a resumed trainer may take a few
      // at once from what was already advantaged).
      const kill = i < KILLS ? { afterSteps: Math.floor(Math.random() * 3), delayMs: Math.round(Math.random() * 300) } : null;
      const l = await life(dir, runIdBase, kill);
      const steps = lastStep(l.stderr);
      lives.push({ kill, life: l, steps });
      process.stderr.write(`# life ${i}: ${kill === null ? 'to the end' : `SIGKILL ${kill.delayMs} ms after ${kill.afterSteps} step(s) of its own`}, ${l.signal ?? `exit ${l.code}`}, last step it printed ${steps}; ${l.stderr.split('\n')[0]}\n`);
    }
    const runs = readdirSync(dir);
    assert.equal(runs.length, 1, `one run directory: ${runs.join(', ')}`);
    const runId = runs[0]!;
    assert.match(lives[0]!.life.stderr, new RegExp(`^run: starting run ${runId} `, 'm'));
    for (const [i, l] of lives.entries()) {
      if (i > 0) assert.match(l.life.stderr, new RegExp(`^run: resuming run ${runId}, the newest unfinished run`, 'm'), `life ${i}`);
      if (i < KILLS) assert.equal(l.life.signal, 'SIGKILL', `life ${i} ended by its SIGKILL (it had not finished)`);
    }
    const last = lives[KILLS]!.life;
    assert.equal(last.code, 0, last.stderr.slice(-3000));
    const summary = JSON.parse(last.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
    assert.equal(summary['run_id'], runId);
    assert.equal(summary['steps'], MAX_STEPS);

    // The log: every step once, contiguous; no trajectory trained (or dropped) in two steps.
    const log = openEmbeddedLog({ dir: join(dir, runId, 'log') });
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    try {
      const r = await collectRun(log, serde, runId);
      assert.deepEqual(r.steps, Array.from({ length: MAX_STEPS }, (_, i) => i + 1), 'steps 1..max_steps, each once, in order');
      assert.deepEqual(r.versions, Array.from({ length: MAX_STEPS + 1 }, (_, i) => i), 'policy versions 0..max_steps, each once');
      const twice = [...r.consumed].filter(([, n]) => n > 1).map(([id]) => id);
      assert.deepEqual(twice, [], 'trajectories in more than one step');
      const completedTwice = [...r.completed].filter(([, n]) => n > 1).length;
      for (const id of r.consumed.keys()) assert.ok(r.completed.has(id), `trained trajectory ${id} has a TrajectoryCompleted`);
      let trained = 0;
      await readTopic(log, TOPICS.trainSteps, async (v) => {
        const ev = await serde.decode(v);
        if (ev.name === 'TrainStep' && ev.value.run_id === runId) trained += ev.value.trajectories;
      });
      assert.equal(summary['trajectories'], trained, 'the summary counts the trajectories trained in every life');
      process.stderr.write(`# resume: ${r.steps.length} steps, ${r.consumed.size} trajectories consumed once (${trained} trained), ${r.started.size} started, ${completedTwice} completed twice\n`);
    } finally {
      await serde.registry.close();
      await log.close();
    }

    // The shape of an uninterrupted run's line (a short one, in a directory of its own).
    const freshDir = mkdtempSync(join(tmpdir(), 'rlstream-resume-fresh-'));
    try {
      const fresh = await life(freshDir, runIdBase, null, { 'trainer.max_steps': 2 });
      assert.equal(fresh.code, 0, fresh.stderr.slice(-3000));
      assert.match(fresh.stderr, /^run: starting run /m);
      assert.deepEqual(shape(summary), shape(JSON.parse(fresh.stdout.trim().split('\n').pop()!)));
    } finally {
      rmSync(freshDir, { recursive: true, force: true });
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
