// Roles start together and each makes sure the run's topics exist: on a fresh broker several clients create
// the same topic at once. The losers of that race are told "already exists" while the metadata they read may
// not list the topic yet; they must wait for it, not fail LOG_UNKNOWN_TOPIC (seen in CI as a role exiting 1).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openKafkaLog } from '../../core/log/kafka/index.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { PrivateBroker } from '../../testkit/kafka-broker.ts';

test('several clients creating the same topics at once on a fresh broker all succeed, with the right partition counts', { timeout: 120_000 }, async (t) => {
  if (!PrivateBroker.libs()) {
    if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('Kafka jars are not installed (infra/setup.sh)');
    return t.skip('Kafka jars are not installed: run infra/setup.sh');
  }
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-topics-'));
  const broker = await PrivateBroker.start(dir);
  const logs = await Promise.all(Array.from({ length: 5 }, () => openKafkaLog({ brokers: [broker.brokers] }, silentLogger)));
  try {
    const names = Array.from({ length: 8 }, (_, i) => `race.topic-${i}`);
    const failures: string[] = [];
    for (const name of names) {
      const results = await Promise.allSettled(logs.map((l) => l.createTopic({ name, partitions: 3 })));
      for (const r of results) if (r.status === 'rejected') failures.push(`${name}: ${String(r.reason)}`);
    }
    // Then every client creates every topic of a second set at once, as roles starting together do: each
    // creation must wait until the broker serves the topic, whichever client won it.
    const more = Array.from({ length: 6 }, (_, i) => `race.burst-${i}`);
    const burst = await Promise.allSettled(logs.flatMap((l) => more.map((name) => l.createTopic({ name, partitions: 3 }).then(() => l.offsets(name)))));
    for (const r of burst) if (r.status === 'rejected') failures.push(`burst: ${String(r.reason)}`);
    names.push(...more);
    assert.deepEqual(failures, []);
    for (const l of logs) {
      const listed = new Map((await l.listTopics()).map((t) => [t.name, t.partitions]));
      for (const name of names) assert.equal(listed.get(name), 3, name);
    }
  } finally {
    for (const l of logs) await l.close();
    await broker.halt('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
