// Transactions that fail with a retriable error are run again instead of stopping the processor, and the outputs
// still arrive exactly once: on the embedded log with a fault injected into the real log's transactions, and on
// Kafka with back-to-back offsets-only transactions, which meet CONCURRENT_TRANSACTIONS from the coordinator
// (the previous transaction's markers are still being written; the reward consumer commits such transactions
// whenever a batch holds only events it skips).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RewardHandler } from '../../consumers/reward/consumer.ts';
import { RlstreamError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import { openLog } from '../../core/log/open.ts';
import type { EventLog, Producer, Transaction } from '../../core/log/types.ts';
import { StreamProcessor } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { RewardedTrajectory, TurnCompleted } from '../../schemas/generated/types.ts';
import { openTestKafkaLog, service } from '../kafka/services.ts';
import { completed, newSerde, tempDir, trajectory } from '../../testkit/events.ts';

type Fault = (op: 'sendOffsets' | 'commit') => RlstreamError | null | Promise<RlstreamError | null>;

/** The log itself, except that its producers' transactions first ask `fault` whether to fail an operation. */
function withFault(log: EventLog, fault: Fault): { log: EventLog; producersOpened: () => number } {
  let opened = 0;
  const tx = (t: Transaction): Transaction => ({
    send: (topic, records) => t.send(topic, records),
    sendOffsets: async (group, offsets) => {
      const e = await fault('sendOffsets');
      if (e) throw e;
      return t.sendOffsets(group, offsets);
    },
    commit: async () => {
      const e = await fault('commit');
      if (e) throw e;
      return t.commit();
    },
    abort: () => t.abort(),
  });
  const producer = (p: Producer): Producer => ({ send: (topic, records) => p.send(topic, records), transaction: async () => tx(await p.transaction()), close: () => p.close() });
  const wrapped = new Proxy(log, {
    get(target, prop) {
      if (prop === 'producer') {
        return async (...args: Parameters<EventLog['producer']>) => {
          opened++;
          return producer(await target.producer(...args));
        };
      }
      const v = Reflect.get(target, prop) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
  return { log: wrapped, producersOpened: () => opened };
}

async function readAll<T>(log: EventLog, serde: EventSerde, topic: string): Promise<T[]> {
  const c = await log.consumer({ groupId: `read-${newId()}`, topics: [topic], readCommitted: true });
  const out: T[] = [];
  for (let empty = 0; empty < 3; ) {
    const b = await c.poll({ maxRecords: 1000, timeoutMs: 200 });
    if (b.length === 0) empty++;
    for (const r of b) out.push((await serde.decode(r.value)).value as T);
  }
  await c.close();
  return out;
}

async function setup(log: EventLog, serde: EventSerde, trajectories: number): Promise<{ input: string; output: string }> {
  const s = newId().slice(0, 8);
  const topics = { input: `retry-in-${s}`, output: `retry-out-${s}` };
  for (const t of Object.values(topics)) await log.createTopic({ name: t, partitions: 2 });
  const p = await log.producer();
  await p.send(topics.input, Array.from({ length: trajectories }, (_, i) => {
    const t = trajectory({ groupId: `g${i >> 2}`, index: i & 3, groupSize: 4 });
    return { key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) };
  }));
  await p.close();
  return topics;
}

function rewardProcessor(log: EventLog, serde: EventSerde, topics: { input: string; output: string }, maxBatchRecords = 4): StreamProcessor {
  return new StreamProcessor({ id: `retry-${topics.input}`, log, serde, inputTopics: [topics.input], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.output }), maxBatchRecords, deadLetterTopic: `${topics.input}-dlq` });
}

/** Waits until the processor's lag is 0; on a failure it stops the processor first (left running, it keeps the file's process alive). */
async function waitDrained(p: StreamProcessor, running: Promise<void>, timeoutMs: number): Promise<void> {
  let failed: unknown = null;
  running.catch((err: unknown) => (failed = err));
  const until = Date.now() + timeoutMs;
  try {
    while ((await p.lag()) > 0) {
      if (failed) throw failed;
      if (Date.now() > until) throw new Error(`lag still ${await p.lag()} after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 25));
    }
    if (failed) throw failed;
  } catch (err) {
    await p.stop().catch(() => {});
    await running.catch(() => {});
    throw err;
  }
}

test('retriable transaction failures are retried with a new producer; every output once', async () => {
  const serde = await newSerde();
  const base = await openLog({ kind: 'embedded', dir: tempDir('retry') });
  let busy = 3;
  const { log, producersOpened } = withFault(base, (op) => (op === 'sendOffsets' && busy-- > 0 ? new RlstreamError('LOG_UNAVAILABLE', 'injected: coordinator busy', { retriable: true }) : null));
  const topics = await setup(base, serde, 20);
  const opened = producersOpened();
  const p = rewardProcessor(log, serde, topics);
  const running = p.run();
  await waitDrained(p, running, 30_000);
  await p.stop();
  await running;
  const m = p.metrics();
  assert.equal(m.retried, 3);
  assert.equal(m.aborted, 3);
  assert.equal(producersOpened() - opened, 1 + 3, 'the first producer and one per retry');
  const out = await readAll<RewardedTrajectory>(base, serde, topics.output);
  assert.equal(out.length, 20);
  assert.equal(new Set(out.map((o) => o.trajectory.trajectory_id)).size, 20, 'no duplicates');
  await base.close();
});

test('a commit whose outcome is unknown (not retriable) stops the processor with that error, committing nothing', async () => {
  const serde = await newSerde();
  const base = await openLog({ kind: 'embedded', dir: tempDir('retry') });
  const { log } = withFault(base, (op) => (op === 'commit' ? new RlstreamError('LOG_UNAVAILABLE', 'injected: outcome unknown', { retriable: false }) : null));
  const topics = await setup(base, serde, 8);
  const p = rewardProcessor(log, serde, topics);
  await assert.rejects(p.run(), /injected: outcome unknown/);
  assert.equal(p.metrics().retried, 0);
  assert.equal(await p.lag(), 8);
  assert.equal((await readAll<RewardedTrajectory>(base, serde, topics.output)).length, 0);
  await base.close();
});

test('no retry once the batch\u2019s partitions moved to another member: the processor stops, committing nothing', { timeout: 30_000 }, async () => {
  const serde = await newSerde();
  const base = await openLog({ kind: 'embedded', dir: tempDir('retry') });
  const topics = await setup(base, serde, 20);
  const id = `retry-${topics.input}`;
  let joined: Awaited<ReturnType<EventLog['consumer']>> | null = null;
  const { log } = withFault(base, async (op) => {
    if (op !== 'sendOffsets' || joined) return null;
    // While the transaction fails (once), a second member joins the group and takes one of the two partitions.
    joined = await base.consumer({ groupId: id, topics: [topics.input] });
    return new RlstreamError('LOG_UNAVAILABLE', 'injected: coordinator busy', { retriable: true });
  });
  const p = new StreamProcessor({ id, log, serde, inputTopics: [topics.input], accepts: ['TrajectoryCompleted'], handler: new RewardHandler('reward', { outputTopic: topics.output }), maxBatchRecords: 20 });
  await assert.rejects(p.run(), /injected: coordinator busy/);
  assert.equal(p.metrics().retried, 0);
  assert.equal((await readAll<RewardedTrajectory>(base, serde, topics.output)).length, 0);
  assert.equal(await p.lag(), 20);
  await joined!.close();
  await base.close();
});

const brokers = service('KAFKA_BROKERS', 'stream processor on Kafka through back-to-back offsets-only transactions');
if (brokers) {
  test('on Kafka, back-to-back offsets-only transactions (CONCURRENT_TRANSACTIONS) do not stop the processor', async () => {
    const serde = await newSerde();
    const log = await openTestKafkaLog(brokers);
    try {
      const topics = await setup(log, serde, 4);
      // Turns the reward consumer skips: each batch of one commits only its offset, right after the previous one.
      const turn = (i: number): TurnCompleted => ({
        event_id: `turn-${i}`, time_ms: 1, run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: i, role: 'assistant', token_ids: [1], logprobs: [-1], response_mask: [1],
        text: 'x', tool_calls: [], tool_call_parse_error: null, finish_reason: 'stop', policy_version: 0, latency_ms: 1, server: null, tokenization_mismatch: false,
      });
      const producer = await log.producer();
      await producer.send(topics.input, Array.from({ length: 30 }, (_, i) => ({ key: 'g', partition: 0, value: serde.encode('TurnCompleted', turn(i)) })));
      await producer.close();
      const p = rewardProcessor(log, serde, topics, 1);
      const running = p.run();
      await waitDrained(p, running, 120_000);
      await p.stop();
      await running;
      assert.equal(p.metrics().skipped, 30);
      const out = await readAll<RewardedTrajectory>(log, serde, topics.output);
      assert.equal(out.length, 4);
      assert.equal(new Set(out.map((o) => o.trajectory.trajectory_id)).size, 4);
    } finally {
      await log.close();
    }
  });

  test('on Kafka, the lag of an input written in transactions drains to 0 (commits pass the commit markers)', async () => {
    const serde = await newSerde();
    const log = await openTestKafkaLog(brokers);
    try {
      const topics = await setup(log, serde, 0);
      // Upstream roles write in transactions: every partition then ends with a commit marker, one offset past
      // its last record. Committing "last record + 1" left a lag of 1 per partition forever.
      const producer = await log.producer({ transactionalId: `retry-tx-${topics.input}` });
      for (let g = 0; g < 4; g++) {
        const tx = await producer.transaction();
        await tx.send(topics.input, Array.from({ length: 4 }, (_, i) => {
          const t = trajectory({ groupId: `tx${g}`, index: i, groupSize: 4 });
          return { key: t.group_id, value: serde.encode('TrajectoryCompleted', completed(t)) };
        }));
        await tx.commit();
      }
      await producer.close();
      const p = rewardProcessor(log, serde, topics);
      const running = p.run();
      await waitDrained(p, running, 60_000);
      await p.stop();
      await running;
      const out = await readAll<RewardedTrajectory>(log, serde, topics.output);
      assert.equal(out.length, 16);
      assert.equal(new Set(out.map((o) => o.trajectory.trajectory_id)).size, 16);
    } finally {
      await log.close();
    }
  });
}
