// The advantage consumer on the embedded log: complete groups emitted with GRPO advantages and group stats,
// partial groups on timeout (emit or drop), non-train splits skipped, dynamic sampling, duplicates ignored.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createAdvantageProcessor, type AdvantageOptions } from '../../consumers/advantage/consumer.ts';
import { openLog } from '../../core/log/open.ts';
import { TOPICS } from '../../core/topics.ts';
import type { AdvantagedTrajectory } from '../../schemas/generated/types.ts';
import { newSerde, rewarded, tempDir, trajectory } from '../../testkit/events.ts';

async function run(options: AdvantageOptions, inputs: { groupId: string; index: number; size: number; score: number; split?: string }[], waitMs = 0) {
  const log = await openLog({ kind: 'embedded', dir: tempDir('adv') });
  for (const name of Object.values(TOPICS)) await log.createTopic({ name, partitions: 2 });
  const serde = await newSerde();
  const p = await log.producer();
  await p.send(TOPICS.rewarded, inputs.map((x) => {
    const t = trajectory({ groupId: x.groupId, index: x.index, groupSize: x.size, tokens: 12, split: x.split });
    return { key: x.groupId, value: serde.encode('RewardedTrajectory', rewarded(t, x.score)) };
  }));
  const proc = createAdvantageProcessor({ log, serde, ...options });
  const running = proc.run();
  await new Promise((r) => setTimeout(r, 400 + waitMs));
  await proc.stop();
  await running;
  const c = await log.consumer({ groupId: 'read', topics: [TOPICS.advantaged] });
  const out: AdvantagedTrajectory[] = [];
  for (let empty = 0; empty < 2; ) {
    const b = await c.poll({ maxRecords: 1000, timeoutMs: 100 });
    if (b.length === 0) empty++;
    for (const r of b) out.push((await serde.decode(r.value)).value as AdvantagedTrajectory);
  }
  await log.close();
  return { out, metrics: proc.metrics() };
}

const group = (id: string, scores: number[], extra: { split?: string; size?: number } = {}) => scores.map((score, index) => ({ groupId: id, index, size: extra.size ?? scores.length, score, split: extra.split }));

test('complete groups: GRPO advantages per token (0 where masked), group stats, eval splits skipped, duplicates ignored', async () => {
  const inputs = [...group('a', [1, 0, 0, 1]), ...group('b', [1, 1], { split: 'test' }), ...group('c', [0.5, 0.5, 0.5])];
  inputs.push(inputs[1]!); // a duplicate member of a closed group: late, not a new group
  const { out, metrics } = await run({ estimator: 'grpo' }, inputs);
  const a = out.filter((o) => o.trajectory.group_id === 'a');
  assert.equal(a.length, 4);
  const adv = 0.5 / (Math.sqrt(1 / 3) + 1e-6);
  for (const o of a) {
    const expected = o.reward.score === 1 ? adv : -adv;
    o.trajectory.response_mask.forEach((m, t) => assert.ok(Math.abs(o.advantages[t]! - (m ? expected : 0)) < 1e-5));
    assert.deepEqual({ ...o.group, reward_std: Math.round(o.group.reward_std * 1e6) / 1e6 }, { group_members: 4, expected_size: 4, reward_mean: 0.5, reward_std: 0.57735, partial: false });
    assert.equal(o.estimator, 'grpo');
  }
  assert.equal(out.filter((o) => o.trajectory.group_id === 'b').length, 0);
  assert.equal(out.filter((o) => o.trajectory.group_id === 'c').length, 3);
  assert.equal(metrics.counters['skipped_not_train'], 2);
  assert.equal(metrics.counters['late_members'], 1);
});

test('dynamic sampling drops groups whose rewards are all equal (counted)', async () => {
  const { out, metrics } = await run({ estimator: 'grpo', dynamicSampling: true }, [...group('a', [1, 0]), ...group('c', [0.5, 0.5, 0.5])]);
  assert.deepEqual([...new Set(out.map((o) => o.trajectory.group_id))], ['a']);
  assert.equal(metrics.counters['filtered_groups'], 1);
  assert.equal(metrics.counters['filtered_members'], 3);
});

test('a group that never completes is emitted partial on its timeout, or dropped (counted)', async () => {
  const partial = group('p', [1, 0, 1], { size: 8 });
  const emitted = await run({ estimator: 'rloo', groupTimeoutMs: 200, partialGroups: 'emit' }, partial, 300);
  assert.equal(emitted.out.length, 3);
  assert.ok(emitted.out.every((o) => o.group.partial && o.group.group_members === 3 && o.group.expected_size === 8));
  assert.equal(emitted.metrics.counters['partial_timeout'], 1);
  const dropped = await run({ estimator: 'rloo', groupTimeoutMs: 200, partialGroups: 'drop' }, partial, 300);
  assert.equal(dropped.out.length, 0);
  assert.equal(dropped.metrics.counters['partial_dropped_members'], 3);
});

test('the open-group bound closes the oldest group early', async () => {
  const { out, metrics } = await run({ estimator: 'grpo', maxOpenGroups: 2, partialGroups: 'emit' }, [...group('x', [1], { size: 4 }), ...group('y', [1], { size: 4 }), ...group('z', [0], { size: 4 })]);
  assert.equal(metrics.counters['partial_evicted'], 1);
  assert.deepEqual(out.map((o) => o.trajectory.group_id), ['x']);
});
