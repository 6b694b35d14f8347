// A data-parallel rank that dies stops the step: three reference ranks of the native model train a step of groups
// read from a real embedded log, and rank 0 commits it as the trainer does (TrainStep, PolicyVersion and the
// consumed offsets in one transaction). When one rank fails (its input holds a NaN the native core refuses, its
// model is gone, it is rank 0 itself, or rank 0's transaction fails half-way), every rank's step rejects, naming
// the rank, and the log holds no TrainStep, no PolicyVersion and no committed offset. The next attempt reads the
// same records from the committed offsets and commits the step once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { deriveId } from '../../../core/ids.ts';
import { openEmbeddedLog } from '../../../core/log/embedded/index.ts';
import type { EventLog } from '../../../core/log/types.ts';
import { EmbeddedRegistry } from '../../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../../core/serde/events.ts';
import { TOPICS } from '../../../core/topics.ts';
import { Model, nativeAvailable } from '../../../native/index.ts';
import { sampleFromEvent, type TrainSample } from '../../../consumers/trainer/batch.ts';
import { compileTrainerOptions } from '../../../consumers/trainer/options.ts';
import { RankFailed } from '../../../native/collectives/collective.ts';
import { referenceGroup } from '../../../native/collectives/reference-collective.ts';
import { DataParallelRank, rankStepThenCommit } from '../../../consumers/trainer/parallel/rank-step.ts';
import type { StepMetrics } from '../../../consumers/trainer/step.ts';
import { groupsOf, shardStep } from '../../../consumers/trainer/parallel/shard.ts';
import type { TrainStep } from '../../../schemas/generated/types.ts';
import { TINY_CONFIG, trainerInputs } from '../fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';
const RANKS = 3;
const RUN = 'dp-fail';
const GROUP = `${RUN}.trainer`;

type Fault = 'none' | 'nan-input' | 'model-gone' | 'rank0-fails' | 'commit-fails';

/** What the log says was committed: TrainSteps, PolicyVersions (read committed) and the trainer group's offsets. */
async function committed(log: EventLog, serde: EventSerde): Promise<{ steps: number; versions: number; offsets: number[] }> {
  const count = async (topic: string) => {
    const c = await log.consumer({ groupId: deriveId('audit', topic, Math.random()), topics: [topic], readCommitted: true, fromBeginning: true });
    let n = 0;
    for (let empty = 0; empty < 3; ) {
      const rs = await c.poll({ maxRecords: 100, timeoutMs: 100 });
      if (rs.length === 0) empty++;
      for (const r of rs) if ((await serde.decode(r.value)).name !== 'DeadLetter') n++;
    }
    await c.close();
    return n;
  };
  const offsets = (await log.committed(GROUP, TOPICS.advantaged)).map((o) => o.offset);
  return { steps: await count(TOPICS.trainSteps), versions: await count(TOPICS.policyVersions), offsets };
}

/** One attempt at the step: read the groups from the committed offsets, shard them, train on three ranks, commit on rank 0. */
async function attempt(log: EventLog, serde: EventSerde, weights: string, fault: Fault): Promise<PromiseSettledResult<StepMetrics>[]> {
  const consumer = await log.consumer({ groupId: GROUP, topics: [TOPICS.advantaged], readCommitted: true });
  const items: { groupId: string; sample: TrainSample }[] = [];
  const next = new Map<number, number>();
  for (let empty = 0; empty < 3; ) {
    const rs = await consumer.poll({ maxRecords: 100, timeoutMs: 100 });
    if (rs.length === 0) empty++;
    for (const r of rs) {
      const d = await serde.decode(r.value);
      if (d.name !== 'AdvantagedTrajectory') continue;
      items.push({ groupId: d.value.trajectory.group_id, sample: sampleFromEvent(d.value, 0) });
      next.set(r.partition, r.offset + 1);
    }
  }
  await consumer.close();
  const { shards } = shardStep(groupsOf(items, (s) => s.tokens.length), RANKS);
  const samples = shards.map((s) => s.flatMap((g) => g.samples.map((x) => ({ ...x }))));
  if (fault === 'nan-input') samples[2]![0] = { ...samples[2]![0]!, behaviourLogprobs: samples[2]![0]!.behaviourLogprobs.map((x, i) => (i === 1 ? Number.NaN : x)) };
  const options = compileTrainerOptions({ max_tokens_per_micro_batch: 32 });
  const group = referenceGroup(RANKS);
  const models = Array.from({ length: RANKS }, () => Model.load(weights, TINY_CONFIG, { threads: 1 }));
  const ranks = models.map((m, k) => new DataParallelRank(m, group[k]!, options, { bucketBytes: 4 * 101, dtype: 'fp32' }));
  if (fault === 'model-gone') models[1]!.dispose();
  const producer = await log.producer({ transactionalId: `${RUN}.trainer` });
  const commit = async (m: StepMetrics) => {
    const step: TrainStep = {
      event_id: deriveId(RUN, 'train-step', 1), time_ms: Date.now(), run_id: RUN, step: 1, policy_version: 0, produced_version: 1,
      trajectories: items.length, tokens: items.reduce((n, i) => n + i.sample.tokens.length, 0), trajectory_ids: items.map((i) => i.sample.trajectoryId),
      loss: m.loss, pg_loss: m.pgLoss, kl: 0, entropy: m.entropy, clip_fraction: m.clip, approx_kl: m.approxKl, grad_norm: m.gradNorm, learning_rate: options.learningRate,
      reward_mean: 0, staleness_mean: 0, staleness_max: 0, iw_mean: 1, iw_max: m.iwMax, iw_truncated_fraction: 0, dropped_stale: 0, wait_ms: 0, compute_ms: 0, metrics: [], dropped_trajectory_ids: [],
    };
    const tx = await producer.transaction();
    try {
      await tx.send(TOPICS.trainSteps, [{ key: RUN, value: serde.encode('TrainStep', step) }]);
      await tx.send(TOPICS.policyVersions, [{ key: RUN, value: serde.encode('PolicyVersion', { event_id: deriveId(RUN, 'policy-version', 1), time_ms: Date.now(), run_id: RUN, policy_version: 1, parent: 0, step: 1, weights_uri: 'w', checksum: 'c', format: 'safetensors', config_json: '{}', metrics: [] }) }]);
      if (fault === 'commit-fails') throw new Error('the broker went away half-way through the transaction');
      await tx.sendOffsets(GROUP, [...next].map(([partition, offset]) => ({ topic: TOPICS.advantaged, partition, offset })));
      await tx.commit();
    } catch (err) {
      await tx.abort();
      throw err;
    }
  };
  const work = (k: number) => async () => {
    if (fault === 'rank0-fails' && k === 0) throw new Error('rank 0 lost its GPU');
    return ranks[k]!.step(samples[k]!, 0);
  };
  const results = await Promise.allSettled(ranks.map((_, k) => rankStepThenCommit(group[k]!, work(k), commit)));
  await producer.close();
  for (const m of models) m.dispose();
  return results;
}

test('a rank that fails stops the step on every rank: no TrainStep, no PolicyVersion, no offsets; the next attempt commits once', { skip, timeout: 120_000 }, async () => {
  const inputs = await trainerInputs('dp-fail', RUN, [0, 1, 2, 3, 4, 5].map((g) => ({ g })), 3, 2);
  const log = openEmbeddedLog({ dir: inputs.logDir });
  const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
  try {
    const failing: [Fault, number, RegExp][] = [
      ['nan-input', 2, /behaviour_logprobs\[1\] is NaN|NaN/],
      ['model-gone', 1, /model was disposed/],
      ['rank0-fails', 0, /rank 0 lost its GPU/],
      ['commit-fails', 0, /the broker went away half-way/],
    ];
    for (const [fault, rank, why] of failing) {
      const results = await attempt(log, serde, inputs.weights, fault);
      results.forEach((r, k) => {
        assert.equal(r.status, 'rejected', `${fault}: rank ${k} must not finish the step`);
        const reason = (r as PromiseRejectedResult).reason as Error;
        if (k === rank) assert.match(reason.message, why, `${fault}: rank ${k}'s own error`);
        else assert.ok(reason instanceof RankFailed && reason.failedRank === rank, `${fault}: rank ${k} must learn that rank ${rank} failed, got ${String(reason)}`);
      });
      assert.deepEqual(await committed(log, serde), { steps: 0, versions: 0, offsets: [] }, `${fault}: nothing committed`);
    }
    const ok = await attempt(log, serde, inputs.weights, 'none');
    for (const r of ok) assert.equal(r.status, 'fulfilled', String((r as PromiseRejectedResult).reason));
    const ends = (await log.offsets(TOPICS.advantaged)).map((p) => p.high);
    const after = await committed(log, serde);
    assert.equal(after.steps, 1);
    assert.equal(after.versions, 1);
    assert.deepEqual(after.offsets.sort(), ends.sort(), 'the step consumed every record, once');
    // the step trained every trajectory of the log: 6 groups of 3
    const steps = await log.consumer({ groupId: 'audit-ids', topics: [TOPICS.trainSteps], readCommitted: true, fromBeginning: true });
    const rs = await steps.poll({ maxRecords: 10, timeoutMs: 500 });
    await steps.close();
    const ids = rs.length === 1 ? ((await serde.decode(rs[0]!.value)).value as TrainStep).trajectory_ids : [];
    assert.equal(new Set(ids).size, 18);
  } finally {
    await log.close();
  }
});
