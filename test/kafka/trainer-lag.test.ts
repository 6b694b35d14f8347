// The trainer on Kafka, reading groups written in transactions (as the advantage consumer writes them): each
// transaction leaves a commit marker after its records, and the trainer's committed offsets must pass those
// markers, or its group's lag never reaches 0 even when every sample has been trained on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { EmbeddedRegistry } from '../../core/serde/embedded-registry.ts';
import { EventSerde } from '../../core/serde/events.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';
import { syntheticGroup, tinyTrainer, writeInitialWeights } from '../trainer/fixtures/synthetic.ts';

test('trainer on Kafka: after training on every transactional group, its committed offsets pass the markers (lag 0)', { timeout: 180_000 }, async (t) => {
  if (!PrivateBroker.libs()) {
    if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('Kafka jars are not installed (infra/setup.sh)');
    return t.skip('Kafka jars are not installed: run infra/setup.sh');
  }
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-trainer-lag-'));
  const broker = await PrivateBroker.start(join(dir, 'broker'));
  const log = await openKafkaLog({ brokers: [broker.brokers] }, silentLogger);
  try {
    for (const name of [TOPICS.advantaged, TOPICS.trainSteps, TOPICS.policyVersions, TOPICS.control]) await log.createTopic({ name, partitions: name === TOPICS.advantaged ? 2 : 1 });
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const producer = await log.producer({ transactionalId: 'advantage-test' });
    const GROUPS = 4;
    for (let g = 0; g < GROUPS; g++) {
      const tx = await producer.transaction();
      await tx.send(TOPICS.advantaged, syntheticGroup('lag-test', g, 2, 0, 'train').map((e) => ({ key: e.trajectory.group_id, value: serde.encode('AdvantagedTrajectory', e) })));
      await tx.commit();
    }
    await producer.close();
    const weights = join(dir, 'init.safetensors');
    await writeInitialWeights(weights);

    const trainer = tinyTrainer({ log, serde, runId: 'lag-test', dataDir: join(dir, 'data'), weights }, { max_steps: 2, threads: 1, groups_per_step: 2 });
    await trainer.start();
    await trainer.run();
    await trainer.close();
    assert.equal(trainer.counters.consumed, GROUPS * 2, 'every sample consumed');
    const lag = await log.lag('lag-test.trainer', TOPICS.advantaged);
    assert.deepEqual(lag.map((l) => l.lag), [0, 0], `lag per partition: ${JSON.stringify(lag)}`);
  } finally {
    await log.close();
    await broker.halt('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
