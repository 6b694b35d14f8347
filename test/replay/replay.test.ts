// Replay against a recorded run in the embedded log: the live sink (with every 7th event delivered twice)
// and a replay into an empty store give the same answer to every named query, on chDB and on the ClickHouse
// server; counts match the run exactly (no double counting); the SFT export, re-derived rewards and log
// copies are deterministic, and a copied log's records are byte-identical after a round trip.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import type { EventLog, LogRecord } from '../../core/log/types.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { MemoryRegistry, type SchemaRegistry } from '../../core/serde/registry.ts';
import { openLog } from '../../core/log/open.ts';
import { TOPICS } from '../../core/topics.ts';
import { listNamedQueries, runNamed } from '../../core/traces/queries.ts';
import { renderTrajectory } from '../../core/traces/render.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { ReplayJob } from '../../consumers/replay/job.ts';
import { parsePosition } from '../../consumers/replay/range.ts';
import { JsonlTarget, LogCopyTarget, TopicTarget, TracesTarget } from '../../consumers/replay/targets.ts';
import { advantageStage } from '../../consumers/advantage/stage.ts';
import { RewardRegistry } from '../../consumers/reward/registry.ts';
import type { AdvantagedTrajectory } from '../../schemas/generated/types.ts';
import { recordRun, type Recorded } from '../../testkit/record-run.ts';
import { targets } from '../traces/targets.ts';

const RUN = { runId: 'run-a', groups: 30, groupSize: 4, assistantTurns: 3, trajectoriesPerStep: 16, seed: 7 };
let dir: string;
let log: EventLog;
let registry: EmbeddedRegistry;
let serde: EventSerde;
let recorded: Recorded;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rlstream-replay-'));
  log = openEmbeddedLog({ dir: join(dir, 'log'), fsync: 'none' });
  registry = await EmbeddedRegistry.open(log);
  serde = await new EventSerde(registry).init();
  recorded = await recordRun(log, serde, RUN, 7);
});

after(async () => {
  await registry.close();
  await log.close();
  rmSync(dir, { recursive: true, force: true });
});

async function answers(store: TraceStore, trajectoryId: string): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const q of listNamedQueries()) {
    const params = q.params.some((p) => p.name === 'id') ? { id: trajectoryId } : {};
    out[q.name] = (await runNamed(store, q.name, params)).rows;
  }
  return out;
}

function count(name: string): number {
  return recorded.events.filter((e) => e.name === name).length;
}

for (const target of targets()) {
  test(`${target.name}: live sink and replay into an empty store answer every named query alike; duplicates do not count twice`, { skip: target.skip ?? false, timeout: 120_000 }, async () => {
    const live = await target.open('live');
    const replayed = await target.open('replayed');
    try {
      const sink = new TraceSink({ log, store: live, serde, groupId: `traces-${target.name}-${Date.now()}`, maxRows: 700 });
      await sink.drain();
      await sink.stop();
      assert.equal(sink.stats.records, recorded.sent);
      assert.ok(recorded.sent > recorded.events.length, 'the recording holds duplicates');

      const rebuild = new TracesTarget(replayed, serde);
      const job = ReplayJob.start({ log, serde, target: rebuild });
      const end = await job.done;
      assert.equal(end.state, 'done', end.error ?? '');
      assert.equal(end.read, recorded.sent);
      // The rebuild takes the sink's path: the planned events through the native transcoders.
      assert.ok(rebuild.transcoded > 0.9 * recorded.sent, `${rebuild.transcoded} of ${recorded.sent} records transcoded`);
      assert.equal(end.undecodable, 0);

      const someId = recorded.events.find((e) => e.name === 'TrajectoryStarted')!.value as { trajectory_id: string };
      const a = await answers(live, someId.trajectory_id);
      const b = await answers(replayed, someId.trajectory_id);
      assert.deepEqual(b, a);

      // Exact counts: each fact once, although some events arrived twice.
      const runs = a['runs'] as { trajectories: number; turns: number }[];
      assert.deepEqual(runs.map((r) => [r.trajectories, r.turns]), [[count('TrajectoryCompleted'), count('TurnCompleted')]]);
      const calls = (a['tool_stats'] as { calls: number }[]).reduce((s, r) => s + r.calls, 0);
      assert.equal(calls, count('ToolCallCompleted'));
      const steps = a['staleness_by_step'] as unknown[];
      assert.equal(steps.length, count('TrainStep'));
      const heldout = (a['reward_by_step'] as { heldout: number }[]).reduce((s, r) => s + r.heldout, 0);
      assert.equal(heldout, recorded.events.filter((e) => e.name === 'RewardedTrajectory' && (e.value as { trajectory: { dataset: { split: string } } }).trajectory.dataset.split === 'heldout').length);
      const turnsOfOne = a['trajectory'] as { turn_index: number; trained_tokens: number; role: string }[];
      assert.deepEqual(turnsOfOne.map((t) => t.turn_index), [0, 1, 2, 3, 4]);
      assert.ok(turnsOfOne.every((t) => (t.role === 'assistant') === t.trained_tokens > 0));
      const parseFailures = recorded.events.filter((e) => e.name === 'TurnCompleted' && (e.value as { tool_call_parse_error: string | null }).tool_call_parse_error !== null).length;
      assert.equal((a['tool_parse_failures'] as unknown[]).length, Math.min(parseFailures, 100));

      const text = await renderTrajectory(live, someId.trajectory_id);
      assert.match(text, /\[prompt user\] What is/);
      assert.match(text, /--- turn 4 assistant/);
      assert.match(text, /mask: 1×16/);
    } finally {
      await live.close();
      await replayed.close();
    }
  });
}

test('a replay from a time or offset reads only its range; cancel stops a job', async () => {
  const store = await targets()[0]!.open('range');
  try {
    const mid = recorded.events[Math.floor(recorded.events.length / 2)]!.value as { time_ms: number };
    const job = ReplayJob.start({ log, serde, target: new TracesTarget(store, serde), topics: [TOPICS.trainSteps], from: parsePosition(new Date(mid.time_ms).toISOString(), '--from') });
    const end = await job.done;
    const steps = recorded.events.filter((e) => e.name === 'TrainStep' && (e.value as { time_ms: number }).time_ms >= mid.time_ms).length;
    assert.equal(end.total, steps);
    const byOffset = await ReplayJob.start({ log, serde, target: new TracesTarget(store, serde), topics: [TOPICS.trainSteps], from: parsePosition('2', '--from'), to: parsePosition('4', '--to') }).done;
    assert.equal(byOffset.read, 2);
    const cancelled = ReplayJob.start({ log, serde, target: new TracesTarget(store, serde) });
    cancelled.cancel();
    const c = await cancelled.done;
    assert.equal(c.state, 'cancelled');
    assert.ok(c.read < recorded.sent);
  } finally {
    await store.close();
  }
});

test('SFT export: one chat per successful trajectory (those with a malformed tool call counted apart), deterministic', async () => {
  const files = [join(dir, 'sft1.jsonl'), join(dir, 'sft2.jsonl')];
  const targets = files.map((f) => new JsonlTarget(f));
  for (const target of targets) assert.equal((await ReplayJob.start({ log, serde, target }).done).state, 'done');
  const text = readFileSync(files[0]!, 'utf8');
  assert.equal(text, readFileSync(files[1]!, 'utf8'));
  const lines = text.trim().split('\n').map((l) => JSON.parse(l) as { messages: { role: string; content: string; tool_call_id?: string; tool_calls?: unknown[] }[] });
  const correct = recorded.events.filter((e) => e.name === 'RewardedTrajectory' && (e.value as { reward: { correct: boolean } }).reward.correct).length;
  const malformed = new Set(recorded.events.filter((e) => e.name === 'TurnCompleted' && (e.value as { tool_call_parse_error: string | null }).tool_call_parse_error !== null).map((e) => (e.value as { trajectory_id: string }).trajectory_id));
  // The export takes the training problems only: held-out ones are counted apart (other_split) before any other reason.
  const train = (e: { value: unknown }) => (e.value as { trajectory: { dataset: { split: string } } }).trajectory.dataset.split === 'train';
  const correctMalformed = recorded.events.filter((e) => e.name === 'RewardedTrajectory' && train(e) && (e.value as { reward: { correct: boolean } }).reward.correct && malformed.has((e.value as { trajectory: { trajectory_id: string } }).trajectory.trajectory_id)).length;
  assert.ok(correctMalformed > 0, 'the recording has successful trajectories with a malformed call');
  assert.equal(targets[0]!.skipped.parse_error, correctMalformed);
  // The recording also marks some turns as tokenization mismatches: left out too, and counted.
  const skipped = Object.values(targets[0]!.skipped).reduce((a, b) => a + b, 0);
  assert.ok(skipped > correctMalformed);
  assert.equal(lines.length, correct - skipped);
  const m = lines[0]!.messages;
  assert.deepEqual(m.map((x) => x.role), ['system', 'user', 'assistant', 'tool', 'assistant', 'tool', 'assistant']);
  assert.match(m[m.length - 1]!.content, /The answer is/);
});

test('re-derived rewards and advantages into a new topic are deterministic across replays', async () => {
  const outputs: Buffer[][] = [];
  for (const topic of ['rewarded.v2.a', 'rewarded.v2.b']) {
    const t = await TopicTarget.open(log, topic, serde, { label: 'always_one', reward: { registry: new RewardRegistry(), fn: { name: 'always_one', fn: () => ({ score: 1, correct: true }) }, shaping: {} }, advantage: advantageStage({ estimator: 'grpo' }) });
    const end = await ReplayJob.start({ log, serde, target: t, topics: [TOPICS.rolloutEvents] }).done;
    assert.equal(end.state, 'done', end.error ?? '');
    // Held-out trajectories are evaluations: as in the run, they get no advantages.
    const heldout = recorded.events.filter((e) => e.name === 'TrajectoryCompleted' && (e.value as { trajectory: { dataset: { split: string } } }).trajectory.dataset.split === 'heldout').length;
    assert.ok(heldout > 0);
    // Counted by record, as the run's consumer counts them: a held-out record the recording sent twice counts twice.
    assert.ok(t.skippedNotTrain >= heldout, `${t.skippedNotTrain} held-out records skipped`);
    assert.equal(t.written, count('TrajectoryCompleted') - heldout);
    const consumer = await log.consumer({ groupId: `check-${topic}`, topics: [topic] });
    const recs: LogRecord[] = [];
    for (let i = 0; i < 20 && recs.length < t.written; i++) recs.push(...(await consumer.poll({ timeoutMs: 100 })));
    await consumer.close();
    outputs.push(recs.map((r) => r.value));
    const first = await serde.decode(recs[0]!.value);
    assert.equal(first.name, 'AdvantagedTrajectory');
    if (first.name === 'AdvantagedTrajectory') {
      assert.equal(first.value.reward.reward_fn, 'always_one');
      assert.ok(first.value.advantages.every((x) => x === 0), 'equal rewards give zero GRPO advantages');
    }
  }
  assert.deepEqual(outputs[0], outputs[1]);
});

test("re-derived advantages use the run's estimator options, not the defaults", async () => {
  const advantaged = async (topic: string, estimatorOptions?: { normByStd: boolean }): Promise<AdvantagedTrajectory[]> => {
    const t = await TopicTarget.open(log, topic, serde, { label: topic, advantage: advantageStage({ estimator: 'grpo', ...(estimatorOptions ? { options: estimatorOptions } : {}) }) });
    const end = await ReplayJob.start({ log, serde, target: t, topics: [TOPICS.rewarded] }).done;
    assert.equal(end.state, 'done', end.error ?? '');
    const consumer = await log.consumer({ groupId: `check-${topic}`, topics: [topic] });
    const out: AdvantagedTrajectory[] = [];
    for (let i = 0; i < 50 && out.length < t.written; i++) {
      for (const r of await consumer.poll({ timeoutMs: 100 })) {
        const e = await serde.decode(r.value);
        if (e.name === 'AdvantagedTrajectory') out.push(e.value);
      }
    }
    await consumer.close();
    assert.ok(out.length > 0 && out.length === t.written);
    return out;
  };
  const first = (a: AdvantagedTrajectory): number => a.advantages[a.trajectory.response_mask.indexOf(1)]!;
  // Dr.GRPO (norm_by_std: false): the advantage is the reward minus the group mean, not divided by the std.
  const drGrpo = await advantaged('advantaged.dr-grpo', { normByStd: false });
  for (const a of drGrpo) assert.ok(Math.abs(first(a) - (a.reward.score - a.group.reward_mean)) < 1e-5, a.trajectory.trajectory_id);
  const byId = new Map((await advantaged('advantaged.defaults')).map((a) => [a.trajectory.trajectory_id, a]));
  const spread = drGrpo.filter((a) => a.group.reward_std > 0 && Math.abs(a.group.reward_std - 1) > 0.05 && a.reward.score !== a.group.reward_mean);
  assert.ok(spread.length > 0, 'the recording has groups whose rewards differ');
  for (const a of spread) assert.notEqual(first(a), first(byId.get(a.trajectory.trajectory_id)!));
});

async function allRecords(l: EventLog): Promise<Map<string, LogRecord[]>> {
  const out = new Map<string, LogRecord[]>();
  for (const t of await l.listTopics()) {
    if (t.name === TOPICS.schemas) continue;
    const total = (await l.offsets(t.name)).reduce((a, p) => a + p.high - p.low, 0);
    const c = await l.consumer({ groupId: `dump-${Date.now()}-${Math.random()}`, topics: [t.name] });
    const recs: LogRecord[] = [];
    for (let i = 0; i < 200 && recs.length < total; i++) recs.push(...(await c.poll({ timeoutMs: 50 })));
    await c.close();
    recs.sort((a, b) => a.partition - b.partition || a.offset - b.offset);
    out.set(t.name, recs);
  }
  return out;
}

/** Each record of these topics is in `dst` at the same partition, offset, timestamp and key with the same bytes; `also` checks more per source record. */
async function assertCopied(src: EventLog, dst: EventLog, topics: string[], also?: (r: LogRecord, topic: string, index: number) => void): Promise<void> {
  const from = await allRecords(src);
  const to = await allRecords(dst);
  for (const t of topics) {
    const a = from.get(t)!;
    const b = to.get(t)!;
    assert.equal(b.length, a.length, t);
    a.forEach((r, i) => {
      const x = b[i]!;
      assert.deepEqual([x.partition, x.offset, x.timestamp, x.key?.toString('hex')], [r.partition, r.offset, r.timestamp, r.key?.toString('hex')]);
      assert.ok(x.value.equals(r.value), `${t} ${r.partition}/${r.offset} value identical`);
      also?.(r, t, i);
    });
  }
}

async function copyLog(from: { log: EventLog; registry: SchemaRegistry }, to: { log: EventLog; registry: SchemaRegistry }, topics: string[], rename?: (t: string) => string): Promise<void> {
  const target = new LogCopyTarget(from, { ...to, describe: 'test' }, rename);
  const end = await ReplayJob.start({ log: from.log, serde, target, topics }).done;
  assert.equal(end.state, 'done', end.error ?? '');
}

test('a log copied embedded → embedded (other schema ids) → embedded is byte-identical in its records', async () => {
  const topics = [TOPICS.rolloutEvents, TOPICS.rewarded, TOPICS.trainSteps];
  const mid = openEmbeddedLog({ dir: join(dir, 'mid'), fsync: 'none' });
  const back = openEmbeddedLog({ dir: join(dir, 'back'), fsync: 'none' });
  const midReg = await EmbeddedRegistry.open(mid);
  const backReg = await EmbeddedRegistry.open(back);
  try {
    // Shift the middle registry's ids so re-framing is exercised.
    await midReg.register('unrelated', JSON.stringify({ type: 'record', name: 'Unrelated', fields: [] }));
    await copyLog({ log, registry }, { log: mid, registry: midReg }, topics);
    await copyLog({ log: mid, registry: midReg }, { log: back, registry: backReg }, topics);
    const m = await allRecords(mid);
    await assertCopied(log, back, topics, (r, t, i) => {
      const y = m.get(t)![i]!;
      assert.notEqual(y.value.readUInt32BE(1), r.value.readUInt32BE(1), 'the middle log uses its own schema ids');
      assert.ok(y.value.subarray(5).equals(r.value.subarray(5)), 'Avro bodies identical');
    });
  } finally {
    await midReg.close();
    await backReg.close();
    await mid.close();
    await back.close();
  }
});

const brokers = process.env['KAFKA_BROKERS'];
const kafkaSkip = brokers || process.env['RLSTREAM_REQUIRE_SERVICES'] === '1' ? false : 'KAFKA_BROKERS is not set: embedded → Kafka → embedded copy skipped';

/** retention.ms and retention.bytes of these Kafka topics, as the broker reports them (kafkajs's admin client). */
async function retentionOf(brokers: string, topics: string[]): Promise<Record<string, string>[]> {
  // ConfigResourceTypes is on kafkajs's CommonJS exports object only (not among the names ESM sees).
  const { Kafka, logLevel, ConfigResourceTypes } = (await import('kafkajs')).default;
  const admin = new Kafka({ brokers: brokers.split(','), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const names = ['retention.ms', 'retention.bytes'];
    const { resources } = await admin.describeConfigs({ includeSynonyms: false, resources: topics.map((name) => ({ type: ConfigResourceTypes.TOPIC, name, configNames: names })) });
    return topics.map((t) => Object.fromEntries(resources.find((r) => r.resourceName === t)!.configEntries.map((e) => [e.configName, e.configValue])));
  } finally {
    await admin.disconnect();
  }
}

test('a log copied embedded → Kafka → embedded is byte-identical in its records', { skip: kafkaSkip, timeout: 120_000 }, async () => {
  assert.ok(brokers, 'KAFKA_BROKERS must be set');
  const kafka = await openLog({ kind: 'kafka', brokers: brokers.split(',') });
  // The Kafka side's registry: schemas are re-registered there and records re-framed with its ids.
  const kafkaRegistry = new MemoryRegistry();
  await kafkaRegistry.register('unrelated', JSON.stringify({ type: 'record', name: 'Shift', fields: [] }));
  const back = openEmbeddedLog({ dir: join(dir, 'from-kafka'), fsync: 'none' });
  const backReg = await EmbeddedRegistry.open(back);
  const prefix = `copy-${Date.now().toString(36)}-${Math.floor(Math.random() * 1e6)}-`;
  const topics = [TOPICS.rolloutEvents, TOPICS.trainSteps];
  try {
    await copyLog({ log, registry }, { log: kafka, registry: kafkaRegistry }, topics, (t) => prefix + t);
    // The run's records are weeks old (their timestamps are the run's): at the broker's default retention (a day
    // here) Kafka would delete them at its next check, minutes after the copy. The copy keeps what its source keeps.
    assert.deepEqual(await retentionOf(brokers, topics.map((t) => prefix + t)), topics.map(() => ({ 'retention.ms': '-1', 'retention.bytes': '-1' })));
    await copyLog({ log: kafka, registry: kafkaRegistry }, { log: back, registry: backReg }, topics.map((t) => prefix + t), (t) => t.slice(prefix.length));
    await assertCopied(log, back, topics);
  } finally {
    await backReg.close();
    await back.close();
    await kafka.close();
  }
});
