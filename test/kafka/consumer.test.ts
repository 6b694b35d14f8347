// Kafka consumer behaviour beyond the shared conformance suite: bounded buffering (kafkajs: a partition is
// paused when its unpolled records reach maxBufferedRecords, and resumed as poll drains it; librdkafka: the pump
// takes no more than that from librdkafka's queue) and compression, on each client; librdkafka's packed consume
// against the stock one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { silentLogger } from '../../core/telemetry.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import type { KafkaConsumer } from '../../core/log/kafka/consumer.ts';
import { loadRdKafka } from '../../core/log/kafka/librdkafka/binding.ts';
import type { RdKafkaConsumer } from '../../core/log/kafka/librdkafka/consumer.ts';
import type { Consumer, EventLog, LogRecord } from '../../core/log/types.ts';
import { pollUntil, uniqueName } from '../log/conformance.ts';
import { brokerList, kafkaClients, service } from './services.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const TOTAL = 3000;

/** A one-partition topic of TOTAL records of about 4 KiB, each value starting with its index. */
async function paddedTopic(log: EventLog, prefix: string): Promise<string> {
  const topic = uniqueName(prefix);
  await log.createTopic({ name: topic, partitions: 1 });
  const producer = await log.producer();
  const pad = randomBytes(4096).toString('hex').slice(0, 4096);
  for (let i = 0; i < TOTAL; i += 500) {
    await producer.send(topic, Array.from({ length: 500 }, (_, j) => ({ value: Buffer.from(`${i + j}:${pad}`) })));
  }
  await producer.close();
  return topic;
}

/** Poll the rest of paddedTopic's records after `got`; every record arrives once, in order. */
async function drainInOrder(consumer: Consumer, got: LogRecord[]): Promise<void> {
  while (got.length < TOTAL) {
    const batch = await consumer.poll({ maxRecords: 200, timeoutMs: 5000 });
    if (batch.length === 0) break;
    got.push(...batch);
  }
  assert.equal(got.length, TOTAL);
  got.forEach((r, i) => assert.equal(r.value.toString().split(':')[0], String(i)));
}

const brokers = service('KAFKA_BROKERS', 'Kafka consumer backpressure and compression');
if (brokers) {
  test('a consumer that is not polled stops fetching: its buffer stays bounded, then drains in order', async () => {
    const log = await openKafkaLog({ brokers: brokerList(brokers), client: 'kafkajs', maxBufferedRecords: 50 }, silentLogger);
    try {
      const topic = await paddedTopic(log, 'bp');
      const consumer = (await log.consumer({ groupId: uniqueName('g'), topics: [topic] })) as KafkaConsumer;
      const first = await pollUntil(consumer, 1, 20_000);
      const got = first.slice(0, 1);
      // Records beyond the first are buffered; stop polling and watch the buffer.
      const end = Date.now() + 10_000;
      while (consumer.pausedPartitions() === 0 && Date.now() < end) await sleep(50);
      assert.equal(consumer.pausedPartitions(), 1, 'the full partition was not paused');
      await sleep(300); // a fetch already in flight may still land
      const held = consumer.bufferedRecords();
      await sleep(1500);
      assert.equal(consumer.bufferedRecords(), held, 'a paused partition kept fetching');
      assert.ok(held + got.length < TOTAL, `the whole topic (${held}) was buffered despite maxBufferedRecords 50`);
      // Draining resumes the partition.
      got.push(...first.slice(1));
      await drainInOrder(consumer, got);
      await consumer.close();
    } finally {
      await log.close();
    }
  });

  test('gzip-compressed sends read back unchanged (kafkajs)', async () => {
    const log = await openKafkaLog({ brokers: brokerList(brokers), client: 'kafkajs', compression: 'gzip' }, silentLogger);
    try {
      const topic = uniqueName('gzip');
      await log.createTopic({ name: topic, partitions: 2 });
      const producer = await log.producer();
      const values = Array.from({ length: 200 }, (_, i) => Buffer.from(`record ${i} `.repeat(50)));
      const positions = await producer.send(topic, values.map((value, i) => ({ key: `k${i % 7}`, value })));
      assert.equal(positions.length, values.length);
      const consumer = await log.consumer({ groupId: uniqueName('g'), topics: [topic] });
      const got = await pollUntil(consumer, values.length, 20_000);
      assert.deepEqual(got.map((r) => r.value.toString()).sort(), values.map((v) => v.toString()).sort());
      await consumer.close();
      await producer.close();
      await assert.rejects(log.producer({ compression: 'zstd' }), (e: Error) => /zstd needs a codec/.test(e.message));
    } finally {
      await log.close();
    }
  });
}

for (const client of brokers ? kafkaClients('librdkafka consumer backpressure and compression').filter((c) => c === 'librdkafka') : []) {
  test(`a consumer that is not polled holds at most maxBufferedRecords, then drains in order (${client})`, async () => {
    const log = await openKafkaLog({ brokers: brokerList(brokers!), client, maxBufferedRecords: 50 }, silentLogger);
    try {
      const topic = await paddedTopic(log, 'bp-rd');
      const consumer = (await log.consumer({ groupId: uniqueName('g'), topics: [topic] })) as RdKafkaConsumer;
      const got = await pollUntil(consumer, 1, 20_000);
      const end = Date.now() + 10_000;
      while (consumer.bufferedRecords() < 50 && Date.now() < end) await sleep(50);
      await sleep(1500);
      assert.equal(consumer.bufferedRecords(), 50, 'the buffer is full and no larger');
      await drainInOrder(consumer, got);
      await consumer.close();
    } finally {
      await log.close();
    }
  });

  test(`records read as packed batches equal those the stock binding's consume gives one object each (${client})`, async () => {
    // infra/setup.sh builds the binding with consumeBatch (infra/kafka-native/binding-consume-batch.patch); a stock
    // install of the package has only consume, which the consumer then uses, as it does under
    // RLSTREAM_RDKAFKA_PACKED=0: the second consumer here.
    assert.equal(typeof loadRdKafka().KafkaConsumer.prototype.consumeBatch, 'function', 'this build of the binding has no consumeBatch: run bash infra/setup.sh --kafka-native');
    const log = await openKafkaLog({ brokers: brokerList(brokers!), client }, silentLogger);
    try {
      const topic = uniqueName('packed');
      await log.createTopic({ name: topic, partitions: 3 });
      const producer = await log.producer();
      const sent = Array.from({ length: 600 }, (_, i) => ({
        key: i % 5 === 0 ? null : i % 5 === 1 ? Buffer.from([0, 255, i & 255]) : `key-${i % 13}`,
        value: i % 50 === 0 ? Buffer.alloc(0) : randomBytes(1 + ((i * 37) % 3000)),
        headers: i % 3 === 0 ? { trace: Buffer.from(`t${i}`), 'content-type': Buffer.from('avro'), empty: Buffer.alloc(0) } : undefined,
        timestamp: 1_700_000_000_000 + i,
      }));
      for (let i = 0; i < sent.length; i += 150) await producer.send(topic, sent.slice(i, i + 150));
      await producer.close();
      const read = async (packed: boolean): Promise<LogRecord[]> => {
        process.env['RLSTREAM_RDKAFKA_PACKED'] = packed ? '1' : '0';
        try {
          const consumer = await log.consumer({ groupId: uniqueName('g'), topics: [topic] });
          const got = await pollUntil(consumer, sent.length, 20_000);
          await consumer.close();
          return got.sort((a, b) => a.partition - b.partition || a.offset - b.offset);
        } finally {
          delete process.env['RLSTREAM_RDKAFKA_PACKED'];
        }
      };
      const viaBatch = await read(true);
      const viaObjects = await read(false);
      assert.equal(viaBatch.length, sent.length);
      // the LogRecord's fields (the stock path's records also carry the binding's own, such as size and leaderEpoch)
      const plain = (r: LogRecord) => ({
        topic: r.topic,
        partition: r.partition,
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key && [...r.key],
        value: [...r.value],
        headers: Object.fromEntries(Object.entries(r.headers).map(([k, v]) => [k, [...v]])),
      });
      assert.deepEqual(viaBatch.map(plain), viaObjects.map(plain));
      assert.ok(viaBatch.some((r) => Object.keys(r.headers).length === 3) && viaBatch.some((r) => r.key === null) && viaBatch.some((r) => r.value.length === 0));
      // the stock path's records are the binding's message objects (size is one of their own fields); packed ones are not
      assert.ok('size' in viaObjects[0]! && !('size' in viaBatch[0]!), 'each read went through the path it was meant to');
    } finally {
      await log.close();
    }
  });

  test(`gzip-, snappy- and lz4-compressed sends read back unchanged; zstd is refused naming the codecs (${client})`, async () => {
    const log = await openKafkaLog({ brokers: brokerList(brokers!), client, compression: 'gzip' }, silentLogger);
    try {
      const topic = uniqueName('codecs');
      await log.createTopic({ name: topic, partitions: 2 });
      const values = Array.from({ length: 300 }, (_, i) => Buffer.from(`record ${i} `.repeat(50)));
      for (const [k, compression] of (['gzip', 'snappy', 'lz4'] as const).entries()) {
        const producer = await log.producer({ compression });
        const part = values.slice(k * 100, (k + 1) * 100);
        assert.equal((await producer.send(topic, part.map((value, i) => ({ key: `k${i % 7}`, value })))).length, part.length);
        await producer.close();
      }
      const consumer = await log.consumer({ groupId: uniqueName('g'), topics: [topic] });
      const got = await pollUntil(consumer, values.length, 20_000);
      assert.deepEqual(got.map((r) => r.value.toString()).sort(), values.map((v) => v.toString()).sort());
      await consumer.close();
      await assert.rejects(log.producer({ compression: 'zstd' }), (e: Error) => /zstd is not built into this librdkafka/.test(e.message));
    } finally {
      await log.close();
    }
  });
}
