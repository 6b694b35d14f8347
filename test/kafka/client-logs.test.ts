// librdkafka's own log lines reach the role's log: log.client_debug names its debug contexts, and each line comes
// through the Logger with the facility and which client said it. Without debug contexts, nothing below the
// client's log level arrives. On the services' broker.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { jsonLogger } from '../../core/telemetry.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { pollUntil, uniqueName } from '../log/conformance.ts';
import { brokerList, kafkaClients, service } from './services.ts';

interface Line {
  level: string;
  msg: string;
  fac?: string;
  client?: string;
}

/** A transaction (produce, offsets, commit) and a group consumer reading it, on a log that logs into `lines`. */
async function transactAndConsume(brokers: string, options: Record<string, unknown>, lines: Line[]): Promise<void> {
  const log = await openKafkaLog({ brokers: brokerList(brokers), client: 'librdkafka', ...options }, jsonLogger({ level: 'debug', write: (l) => lines.push(JSON.parse(l) as Line) }));
  try {
    const topic = uniqueName('client-logs');
    await log.createTopic({ name: topic, partitions: 1 });
    const group = uniqueName('g');
    const producer = await log.producer({ transactionalId: uniqueName('tx') });
    const tx = await producer.transaction();
    await tx.send(topic, [{ value: Buffer.from('one') }]);
    await tx.sendOffsets(group, [{ topic, partition: 0, offset: 0 }]);
    await tx.commit();
    await producer.close();
    const consumer = await log.consumer({ groupId: group, topics: [topic] });
    assert.equal((await pollUntil(consumer, 1, 30_000)).length, 1);
    await consumer.close();
  } finally {
    await log.close();
  }
}

const brokers = service('KAFKA_BROKERS', "librdkafka's log lines in the role's log");
if (brokers && kafkaClients("librdkafka's log lines in the role's log").includes('librdkafka')) {
  test("log.clientDebug: librdkafka's transaction and group lines come through the Logger, naming the client", { timeout: 120_000 }, async () => {
    const lines: Line[] = [];
    await transactAndConsume(brokers, { clientDebug: 'eos,cgrp' }, lines);
    const rd = lines.filter((l) => l.fac !== undefined);
    const producerLines = rd.filter((l) => l.level === 'debug' && /^producer tx-/.test(l.client ?? ''));
    const groupLines = rd.filter((l) => l.level === 'debug' && /^consumer of group g-/.test(l.client ?? ''));
    assert.ok(producerLines.some((l) => /send_offsets_to_transaction|commit_transaction/.test(l.msg)), `no transaction line from the producer among ${rd.length}`);
    assert.ok(groupLines.some((l) => /^CGRP|ASSIGN|JOIN/.test(l.fac!)), `no group line from the consumer among ${rd.length}: ${[...new Set(rd.map((l) => l.fac))].join(' ')}`);
  });

  test("without debug contexts, librdkafka's lines below the client's log level do not arrive", { timeout: 120_000 }, async () => {
    const lines: Line[] = [];
    await transactAndConsume(brokers, {}, lines);
    const rd = lines.filter((l) => l.fac !== undefined);
    assert.deepEqual(rd.filter((l) => l.level === 'debug' || l.level === 'info').map((l) => `${l.fac} ${l.msg}`), []);
  });
}
