// The benchmarks' Kafka cleanup (bench/kafka-topics.ts) deletes this process's run's topics only: a topic of the
// same families made by another benchmark on the cluster, made while this one runs, stays; a prefix narrows it
// to one benchmark's topics; RLSTREAM_BENCH_KEEP_TOPICS=1 keeps them. Real broker.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { BENCH_TOPIC, deleteRunTopics, KEEP_TOPICS_ENV, runTopic } from '../../bench/kafka-topics.ts';
import { brokerList, service } from '../kafka/services.ts';

test('run topics, their processors’ state topics included, carry the run tag and match BENCH_TOPIC', () => {
  const a = runTopic('bench', 'in-x');
  const b = runTopic('pipe', 'in-x');
  assert.match(a, /^bench-[0-9a-f]{8}-in-x$/);
  assert.equal(b.slice('pipe'.length), a.slice('bench'.length), 'one tag for the whole process');
  for (const t of [a, b, `_state.${a}`, `_state.${b}`]) assert.match(t, BENCH_TOPIC);
});

const brokers = service('KAFKA_BROKERS', 'benchmark topic cleanup');
if (brokers) {
  test('deleteRunTopics: only this run’s topics go, a prefix narrows them, the keep switch keeps them', { timeout: 180_000 }, async () => {
    const list = brokerList(brokers);
    const { Kafka, logLevel } = await import('kafkajs');
    const admin = new Kafka({ brokers: list, logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    const other = randomBytes(4).toString('hex');
    const s = randomBytes(4).toString('hex');
    const traces = runTopic('bench', `traces-${s}-`);
    const mine = [runTopic('bench', `in-${s}`), `_state.${runTopic('bench', `adv-${s}`)}`, runTopic('pipe', `in-${s}`)];
    const copy = [`${traces}rollout.events`, `${traces}rewarded`];
    // Another benchmark's topics: same families, another tag.
    const foreign = [`bench-${other}-in-${s}`, `_state.bench-${other}-adv-${s}`, `pipe-${other}-in-${s}`];
    const names = async () => new Set(await admin.listTopics());
    // A deletion the controller has committed reaches the broker's metadata a moment later.
    const gone = async (topics: string[]) => {
      for (let end = Date.now() + 30_000; ; await new Promise((r) => setTimeout(r, 200))) {
        const now = await names();
        if (topics.every((t) => !now.has(t)) || Date.now() > end) return now;
      }
    };
    const keep = process.env[KEEP_TOPICS_ENV];
    try {
      await admin.createTopics({ topics: [...mine, ...copy, ...foreign].map((topic) => ({ topic, numPartitions: 1 })) });
      process.env[KEEP_TOPICS_ENV] = '1';
      await deleteRunTopics(list);
      let now = await names();
      for (const t of [...mine, ...copy, ...foreign]) assert.ok(now.has(t), `${t} kept`);
      delete process.env[KEEP_TOPICS_ENV];
      await deleteRunTopics(list, traces);
      now = await gone(copy);
      for (const t of copy) assert.ok(!now.has(t), `${t} deleted under its prefix`);
      for (const t of [...mine, ...foreign]) assert.ok(now.has(t), `${t} not under the prefix: kept`);
      await deleteRunTopics(list);
      now = await gone(mine);
      for (const t of mine) assert.ok(!now.has(t), `${t} deleted`);
      for (const t of foreign) assert.ok(now.has(t), `${t}, another run's, kept`);
    } finally {
      if (keep === undefined) delete process.env[KEEP_TOPICS_ENV];
      else process.env[KEEP_TOPICS_ENV] = keep;
      const left = [...(await names())].filter((t) => [...mine, ...copy, ...foreign].includes(t));
      if (left.length > 0) await admin.deleteTopics({ topics: left });
      await admin.disconnect();
    }
  });
}
