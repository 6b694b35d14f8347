// A processor's checkpoint restore reads its state topic to the end listed before the read. A transaction
// left open on that topic (a processor killed mid-commit, until the broker times the transaction out) must
// neither stall the restore nor hide the committed checkpoint: the end the log lists is the last stable
// offset, which a read-committed consumer reaches, not the high watermark past the open records.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readCheckpoints } from '../../core/processor.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { uniqueName } from '../log/conformance.ts';
import { brokerList, service } from './services.ts';

const brokers = service('KAFKA_BROKERS', 'checkpoint restore past an open transaction on Kafka');
if (brokers) {
  test('an open transaction on the state topic neither stalls a restore nor hides the committed checkpoint', { timeout: 120_000 }, async () => {
    const log = await openKafkaLog({ brokers: brokerList(brokers) }, silentLogger);
    const stateTopic = uniqueName('state');
    await log.createTopic({ name: stateTopic, partitions: 1 });
    const plain = await log.producer();
    await plain.send(stateTopic, [{ key: 'in:0', value: Buffer.from(JSON.stringify({ c: 5, n: 7, p: [[6, 7]] })) }]);
    await plain.close();
    const producer = await log.producer({ transactionalId: uniqueName('state-tx') });
    const open = await producer.transaction();
    try {
      await open.send(stateTopic, [{ key: 'in:0', value: Buffer.from(JSON.stringify({ c: 9, n: 9, p: [] })) }]);
      // The listed end stops before the open transaction's record.
      assert.deepEqual((await log.offsets(stateTopic)).map((o) => o.high), [1]);
      // Read to its end within a deadline shorter than a Kafka transaction timeout (a read that cannot reach its
      // end fails instead of returning).
      const found = await readCheckpoints(log, stateTopic, new Set(['in:0']), { timeoutMs: 20_000 });
      assert.deepEqual(found.get('in:0'), { c: 5, n: 7, p: [[6, 7]] });
      await open.commit();
      // Committed, the newer checkpoint is the one a restore finds.
      assert.deepEqual((await readCheckpoints(log, stateTopic, new Set(['in:0']))).get('in:0'), { c: 9, n: 9, p: [] });
    } finally {
      await producer.close().catch(() => undefined);
      await log.close();
    }
  });
}
