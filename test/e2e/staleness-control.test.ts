// One staleness bound for both ends, changed during a run through the admin API: the main job (on the
// embedded log, and on Kafka) starts with trainer.staleness_bound 3; after step 2 the test posts set_staleness 1, and the
// trainer trains no sample older than 1 from then on while the rollout gate takes the same bound; then a
// stop through the admin API ends both ends, and the main job returns before trainer.max_steps.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { runMainJob } from '../../cli/run/main-job.ts';
import { openRunContext } from '../../cli/run/context.ts';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';
import type { TrainStep } from '../../schemas/generated/types.ts';

const CONFIG = join(import.meta.dirname, '..', '..', 'examples', 'calculator', 'config.yaml');

async function post(runDir: string, path: string, body: unknown): Promise<number> {
  const link = readFileSync(join(runDir, 'admin-url'), 'utf8').trim();
  const url = new URL(link);
  const token = url.hash.replace(/^#token=/, '');
  const res = await fetch(`${url.origin}/api${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` }, body: JSON.stringify(body) });
  return res.status;
}

/** Every completed trajectory's oldest policy version, read back from the run's log. */
async function oldestVersions(shape: Record<string, unknown>, dataDir: string): Promise<Map<string, number>> {
  const embedded = shape['log.kind'] === undefined;
  const ctx = await openRunContext(loadRunConfig(CONFIG, { ...shape, ...(embedded ? { 'log.dir': join(dataDir, 'log') } : {}) }), silentLogger);
  const out = new Map<string, number>();
  try {
    const c = await ctx.log.consumer({ groupId: `audit-${randomUUID()}`, topics: [TOPICS.rolloutEvents], fromBeginning: true, readCommitted: true });
    const ends = new Map((await ctx.log.offsets(TOPICS.rolloutEvents)).filter((p) => p.high > p.low).map((p) => [p.partition, p.high] as const));
    await readToEnd(c, TOPICS.rolloutEvents, ends, async (records) => {
      for (const r of records) {
        const d = await ctx.serde.decode(r.value);
        if (d.name === 'TrajectoryCompleted') out.set(d.value.trajectory.trajectory_id, d.value.trajectory.min_policy_version);
      }
    }, { what: 'staleness audit', timeoutMs: 60_000 }).finally(() => c.close());
  } finally {
    await ctx.close();
  }
  return out;
}

async function scenario(shape: Record<string, unknown>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-staleness-'));
  const steps: TrainStep[] = [];
  let changedAt = -1;
  let stopAt = -1;
  const posts: Promise<number>[] = [];
  try {
    const summary = await runMainJob({
      configPath: CONFIG,
      overrides: { ...shape, 'run.data_dir': dir, 'trainer.max_steps': 30, 'trainer.staleness_bound': 3, 'task.heldout_problems': 4, 'eval.every_steps': 1000, 'admin.port': 0 },
      progress: false,
      initialEval: false,
      onTrainStep: (s) => {
        steps.push(s);
        const runDir = join(dir, s.run_id);
        if (s.step === 2) {
          changedAt = s.step;
          posts.push(post(runDir, `/runs/${s.run_id}/control/staleness`, { bound: 1, reason: 'test' }));
        }
        if (s.step === 6) {
          stopAt = s.step;
          posts.push(post(runDir, `/runs/${s.run_id}/control/stop`, { reason: 'test' }));
        }
      },
    });
    assert.deepEqual(await Promise.all(posts), [202, 202]);
    assert.equal(changedAt, 2);
    assert.equal(stopAt, 6);
    assert.deepEqual(summary.staleness_bound, { rollout: 1, trainer: 1 });
    // The step under way when the command arrived may have taken older samples; every later one none.
    const later = steps.filter((s) => s.step >= changedAt + 2);
    assert.ok(later.length > 0);
    for (const s of later) assert.ok(s.staleness_max <= 1, `step ${s.step} trained a sample ${s.staleness_max} versions old`);
    // None dropped that the new bound allows: a sample is dropped at the version its step started from.
    const oldest = await oldestVersions(shape, summary.data_dir);
    const dropped = later.flatMap((s) => s.dropped_trajectory_ids.map((id) => ({ id, staleness: s.policy_version - oldest.get(id)! })));
    for (const d of dropped) assert.ok(d.staleness > 1, `${d.id} dropped at staleness ${d.staleness}, which the bound 1 allows`);
    // Stop: the run ended soon after the command, far short of max_steps.
    assert.ok(summary.steps >= stopAt && summary.steps < 30, `steps ${summary.steps}`);
    // The mismatch figure of the JSON line counts the steps that trained: empty or stale-only steps compared nothing.
    const { mean, max } = summary.rl.logprob_mismatch;
    assert.ok(mean > 0 && Number.isFinite(max) && max >= mean, `logprob_mismatch ${mean} / ${max}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('embedded log: set_staleness through the admin API changes the bound at both ends; stop ends the main job', { timeout: 240_000 }, () => scenario({}));

// A private broker: the shared one holds topics of other tests, created with other partition counts.
const kafkaMissing = PrivateBroker.libs() ? null : 'needs the Kafka jars (bash infra/setup.sh)';
test('Kafka: set_staleness through the admin API changes the bound at both ends; stop ends the main job', { timeout: 300_000, skip: kafkaMissing ?? false }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-staleness-kafka-'));
  const broker = await PrivateBroker.start(dir);
  try {
    await scenario({ 'log.kind': 'kafka', 'log.brokers': broker.brokers, 'run.id': `staleness-${randomUUID().slice(0, 8)}` });
  } finally {
    await broker.halt();
    rmSync(dir, { recursive: true, force: true });
  }
});
