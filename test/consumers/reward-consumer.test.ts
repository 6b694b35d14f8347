// The reward consumer on the embedded log: rewards and components out, other event kinds ignored, throwing /
// NaN rewards and undecodable records dead-lettered with their reason while the consumer goes on, and a
// batched ONNX reward model (a tiny model this test builds with onnx-proto).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import onnxProto from 'onnx-proto';
const { onnx } = onnxProto;
import { createRewardProcessor } from '../../consumers/reward/consumer.ts';
import { OnnxRewardModel } from '../../consumers/reward/model.ts';
import { RewardRegistry } from '../../consumers/reward/registry.ts';
import { gsm8kReward } from '../../core/tasks/gsm8k.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog } from '../../core/log/types.ts';
import { RecentIds, type StreamProcessor } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { TOPICS } from '../../core/topics.ts';
import type { DeadLetter, RewardedTrajectory, TurnCompleted } from '../../schemas/generated/types.ts';
import { completed, newSerde, tempDir, trajectory } from '../../testkit/events.ts';

async function setup(): Promise<{ log: EventLog; serde: EventSerde }> {
  const log = await openLog({ kind: 'embedded', dir: tempDir('reward') });
  for (const name of Object.values(TOPICS)) await log.createTopic({ name, partitions: 2 });
  return { log, serde: await newSerde() };
}

async function drain(p: StreamProcessor): Promise<void> {
  const running = p.run();
  for (let i = 0; i < 200 && (await p.lag().catch(() => 1)) > 0; i++) await new Promise((r) => setTimeout(r, 25));
  await p.stop();
  await running;
}

async function readTopic<T>(log: EventLog, serde: EventSerde, topic: string): Promise<T[]> {
  const c = await log.consumer({ groupId: `read-${Math.random()}`, topics: [topic] });
  const out: T[] = [];
  for (let empty = 0; empty < 2; ) {
    const b = await c.poll({ maxRecords: 1000, timeoutMs: 100 });
    if (b.length === 0) empty++;
    for (const r of b) out.push((await serde.decode(r.value)).value as T);
  }
  await c.close();
  return out;
}

const turn = (id: string): TurnCompleted => ({
  event_id: id, time_ms: 1, run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, role: 'assistant', token_ids: [1], logprobs: [-1], response_mask: [1],
  text: 'x', tool_calls: [], tool_call_parse_error: null, finish_reason: 'stop', policy_version: 0, latency_ms: 1, server: null, tokenization_mismatch: false,
});

test('rewards, components and ids; other events ignored; throwing, NaN and undecodable records dead-lettered, the rest goes on', async () => {
  const { log, serde } = await setup();
  const registry = new RewardRegistry()
    .register('gsm8k', gsm8kReward())
    .register('throws', () => {
      throw new Error('reward exploded');
    })
    .register('nan', () => NaN);
  const p = await log.producer();
  const good = [0, 1, 2, 3].map((i) => trajectory({ groupId: 'g1', index: i, groupSize: 4 }));
  good[1] = { ...good[1]!, tool_rewards: [0.25], num_tool_calls: 2, num_invalid_tool_calls: 1 };
  await p.send(TOPICS.rolloutEvents, [
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(good[0]!)) },
    { key: 'g1', value: serde.encode('TurnCompleted', turn('turn-1')) },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(trajectory({ groupId: 'g1', index: 9, dataSource: 'throws' }))) },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(good[1]!)) },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(trajectory({ groupId: 'g1', index: 8, dataSource: 'nan' }))) },
    { key: 'g1', value: Buffer.from('not avro at all') },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(trajectory({ groupId: 'g1', index: 7, dataSource: 'unknown_source' }))) },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(good[2]!)) },
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(good[0]!)) }, // a duplicate event
    { key: 'g1', value: serde.encode('TrajectoryCompleted', completed(good[3]!)) },
  ]);
  const proc = await createRewardProcessor({ log, serde, registry, shaping: { toolSuccessBonus: 0.1, invalidCallPenalty: 0.5 } });
  await drain(proc);

  const out = await readTopic<RewardedTrajectory>(log, serde, TOPICS.rewarded);
  assert.deepEqual(out.map((o) => o.trajectory.trajectory_id), ['g1/0', 'g1/1', 'g1/2', 'g1/3']);
  assert.deepEqual(out.map((o) => o.reward.score), [1, 0 + 0.25 + 0.1 - 0.5, 1, 0]);
  assert.deepEqual(out[1]!.reward.components.map((c) => c.name), ['outcome', 'tool', 'shaping.tool_success', 'shaping.invalid_call']);
  assert.deepEqual(out.map((o) => o.reward.correct), [true, false, true, false]);
  assert.equal(new Set(out.map((o) => o.event_id)).size, 4);

  const dlq = (await readTopic<DeadLetter>(log, serde, TOPICS.deadLetter)).sort((a, b) => a.source_offset - b.source_offset);
  assert.deepEqual(dlq.map((d) => d.error_code), ['REWARD_FAILED', 'REWARD_NON_FINITE', 'SERDE_MAGIC_BYTE', 'REWARD_FAILED']);
  assert.deepEqual(dlq.map((d) => d.source_offset), [2, 4, 5, 6]);
  assert.match(dlq[0]!.error, /reward function throws threw: Error: reward exploded/);
  assert.match(dlq[1]!.error, /returned score = NaN/);
  assert.match(dlq[3]!.error, /no reward function for data_source "unknown_source"/);
  assert.equal(dlq[2]!.value.toString(), 'not avro at all'); // raw bytes kept
  assert.ok(dlq.every((d) => d.consumer === 'reward' && d.source_topic === TOPICS.rolloutEvents));
  const m = proc.metrics();
  assert.equal(m.deadLettered, 4);
  assert.equal(m.counters['duplicates'], 1);
  assert.equal(m.skipped, 1); // the TurnCompleted
  await log.close();
});

/** A tiny reward model: mean of token embeddings (masked), then a linear layer. Score = mean over ids of w·E[id] + b. */
function buildTinyModel(path: string, vocab: number, dim: number): { E: number[][]; w: number[]; b: number } {
  const E = Array.from({ length: vocab }, (_, i) => Array.from({ length: dim }, (_, d) => Math.sin(i * 0.37 + d) / 2));
  const w = Array.from({ length: dim }, (_, d) => (d % 2 ? 0.5 : -0.25));
  const b = 0.1;
  const f32 = (name: string, dims: number[], data: number[]) => onnx.TensorProto.create({ name, dims, dataType: onnx.TensorProto.DataType.FLOAT, floatData: data });
  const i64 = (name: string, data: number[]) => onnx.TensorProto.create({ name, dims: [data.length], dataType: onnx.TensorProto.DataType.INT64, int64Data: data });
  const node = (op: string, inputs: string[], outputs: string[], attrs: ReturnType<typeof onnx.AttributeProto.create>[] = []) => onnx.NodeProto.create({ opType: op, input: inputs, output: outputs, attribute: attrs });
  const vi = (name: string, elem: number, shape: (number | string)[]) =>
    onnx.ValueInfoProto.create({ name, type: { tensorType: { elemType: elem, shape: { dim: shape.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) } } } });
  const graph = onnx.GraphProto.create({
    name: 'tiny_rm',
    initializer: [f32('E', [vocab, dim], E.flat()), f32('W', [dim, 1], w), f32('B', [1], [b]), i64('ax1', [1]), i64('ax2', [2])],
    node: [
      node('Gather', ['E', 'input_ids'], ['emb']),
      node('Cast', ['attention_mask'], ['maskf'], [onnx.AttributeProto.create({ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: onnx.TensorProto.DataType.FLOAT })]),
      node('Unsqueeze', ['maskf', 'ax2'], ['mask3']),
      node('Mul', ['emb', 'mask3'], ['masked']),
      node('ReduceSum', ['masked', 'ax1'], ['summed'], [onnx.AttributeProto.create({ name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 0 })]),
      node('ReduceSum', ['maskf', 'ax1'], ['count'], [onnx.AttributeProto.create({ name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 1 })]),
      node('Div', ['summed', 'count'], ['meanemb']),
      node('MatMul', ['meanemb', 'W'], ['lin']),
      node('Add', ['lin', 'B'], ['score']),
    ],
    input: [vi('input_ids', onnx.TensorProto.DataType.INT64, ['B', 'L']), vi('attention_mask', onnx.TensorProto.DataType.INT64, ['B', 'L'])],
    output: [vi('score', onnx.TensorProto.DataType.FLOAT, ['B', 1])],
  });
  const model = onnx.ModelProto.create({ irVersion: 7, opsetImport: [{ domain: '', version: 13 }], producerName: 'rlstream-test', graph });
  writeFileSync(path, onnx.ModelProto.encode(model).finish());
  return { E, w, b };
}

function reference(ids: number[], m: { E: number[][]; w: number[]; b: number }): number {
  const dim = m.w.length;
  const mean = new Array<number>(dim).fill(0);
  for (const id of ids) for (let d = 0; d < dim; d++) mean[d]! += m.E[id]![d]! / ids.length;
  return mean.reduce((a, x, d) => a + x * m.w[d]!, m.b);
}

test('a batched ONNX reward model scores token ids (padding masked), as a component beside the rule-based outcome', async () => {
  const path = join(tempDir('rm'), 'tiny.onnx');
  const ref = buildTinyModel(path, 1000, 8);
  const model = await OnnxRewardModel.load(path, { name: 'tiny' });
  const seqs = [[1, 2, 3], [5, 6, 7, 8, 9, 10], [42]];
  const scores = await model.score(seqs);
  seqs.forEach((s, i) => assert.ok(Math.abs(scores[i]! - reference(s, ref)) < 1e-5, `${scores[i]} vs ${reference(s, ref)}`));

  const { log, serde } = await setup();
  const p = await log.producer();
  const trajs = Array.from({ length: 12 }, (_, i) => trajectory({ groupId: `g${i % 3}`, index: i, tokens: 20 }));
  await p.send(TOPICS.rolloutEvents, trajs.map((t) => ({ key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) })));
  const proc = await createRewardProcessor({ log, serde, model: { scorer: model, weight: 2 }, batch: { maxRecords: 8, maxWaitMs: 50 } });
  await drain(proc);
  const out = await readTopic<RewardedTrajectory>(log, serde, TOPICS.rewarded);
  assert.equal(out.length, 12);
  for (const o of out) {
    const rm = o.reward.components.find((c) => c.name === 'reward_model')!;
    const expected = 2 * reference([...o.trajectory.prompt_ids, ...o.trajectory.response_ids], ref);
    assert.ok(Math.abs(rm.value - expected) < 1e-4, `${rm.value} vs ${expected}`);
    const outcome = o.reward.components.find((c) => c.name === 'outcome')!;
    assert.ok(Math.abs(o.reward.score - (outcome.value + rm.value)) < 1e-12);
    assert.equal(o.reward.reward_fn, 'gsm8k+tiny');
  }
  assert.ok((proc.metrics().counters['model_batches'] ?? 0) <= 4, 'trajectories were scored in batches');
  await model.close();
  await log.close();
});

test('duplicate inputs: the same id in another record is one, the same record read again is not', () => {
  const ids = new RecentIds(2);
  const at = (offset: number) => ({ topic: TOPICS.rolloutEvents, partition: 1, offset });
  assert.equal(ids.seen('a', at(5)), false);
  // Read again after a rewind (its first reading's transaction did not commit): handled again.
  assert.equal(ids.seen('a', at(5)), false);
  // The same event written twice (a producer's retry): dropped.
  assert.equal(ids.seen('a', at(9)), true);
  assert.equal(ids.seen('a', { ...at(5), partition: 2 }), true);
  // Bounded: the oldest id is forgotten.
  ids.seen('b', at(6));
  ids.seen('c', at(7));
  assert.equal(ids.seen('a', at(9)), false);
});
