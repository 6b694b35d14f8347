// The trace sink on Kafka (the distributed shape's `traces` worker): its group's lag reaches 0 on partitions
// written in transactions, whose last offset is a commit marker and no record, and stop() resolves only after
// the final commit (run() with it); the records' values go through the native transcoders. On each Kafka client.
// Real broker, registry and ClickHouse server; topic and group are random.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { HttpSchemaRegistry } from '../../core/serde/http-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { TraceSink } from '../../consumers/traces/sink.ts';
import { fixtureValue } from '../../schemas/snapshot.ts';
import type { TrajectoryStarted } from '../../schemas/generated/types.ts';
import { uniqueName } from '../log/conformance.ts';
import { kafkaClients, openTestKafkaLog, service } from '../kafka/services.ts';
import { targets } from './targets.ts';

const brokers = service('KAFKA_BROKERS', 'trace sink on Kafka');
const registryUrl = brokers ? service('SCHEMA_REGISTRY_URL', 'trace sink on Kafka') : null;
const server = targets().find((t) => t.name === 'server')!;
for (const client of brokers && registryUrl ? kafkaClients('trace sink on Kafka') : []) {
  test(`sink on Kafka: the lag reaches 0 on transactional partitions, and stop() returns after the final commit (${client})`, { timeout: 90_000, skip: server.skip ?? false }, async () => {
    const log = await openTestKafkaLog(brokers!, client);
    const serde = await new EventSerde(new HttpSchemaRegistry({ url: registryUrl! })).init();
    const store = await server.open('sink_kafka');
    const topic = uniqueName('rlstream.test.traces');
    const groupId = uniqueName('rlstream.test.traces-group');
    try {
      await log.createTopic({ name: topic, partitions: 2 });
      const producer = await log.producer({ transactionalId: uniqueName('rlstream.test.tx') });
      const started = fixtureValue('TrajectoryStarted') as TrajectoryStarted;
      const send = async (from: number, n: number) => {
        const tx = await producer.transaction();
        const records = Array.from({ length: n }, (_, i) => {
          const id = `t-${from + i}`;
          return { key: id, value: serde.encode('TrajectoryStarted', { ...started, trajectory_id: id, group_id: id }) };
        });
        await tx.send(topic, records);
        await tx.commit();
      };
      await send(0, 6);
      await send(6, 6);
      const ends = await log.offsets(topic);
      const sink = new TraceSink({ log, serde, store, groupId, topics: [topic], maxDelayMs: 100 });
      const running = sink.run();
      // While it runs, the committed positions reach the ends (markers included), not one short of them.
      const lagOf = async () => (await log.lag(groupId, topic)).reduce((n, l) => n + l.lag, 0);
      let lag = -1;
      const by = Date.now() + 30_000;
      while (Date.now() < by && (lag = await lagOf()) !== 0) await sleep(250);
      assert.equal(lag, 0, `lag while running, with the ends at ${JSON.stringify(ends)}`);
      // More transactions while it runs: caught up again. The sink must have read them first: right after a
      // commit the group's lag can still read 0 (the new records not yet counted), which says nothing.
      await send(12, 5);
      const by2 = Date.now() + 30_000;
      while (Date.now() < by2 && sink.stats.records < 17) await sleep(50);
      while (Date.now() < by2 && (lag = await lagOf()) !== 0) await sleep(250);
      assert.equal(lag, 0, 'lag after more transactions');
      let settled = false;
      void running.then(() => (settled = true));
      await sink.stop();
      await Promise.resolve();
      assert.ok(settled, 'run() settles with stop(), after the final commit');
      assert.equal(await lagOf(), 0);
      assert.equal(sink.stats.records, 17);
      assert.equal(sink.stats.transcoded, 17, 'every value went through its native transcoder');
      await producer.close();
    } finally {
      await store.close();
      await serde.registry.close();
      await log.close();
    }
  });
}
