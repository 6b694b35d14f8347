// A processor's checkpoint restore on the embedded log when the state topic's listed end cannot be reached (a log
// that lists an end past its last record, as a Kafka partition did whose position could not pass something): the
// restore that opted into an idle end (idleEndMs) ends as idle instead of failing at its deadline, says so in a
// warning, and returns the newest checkpoint it did read.
// (Reading past an open transaction on Kafka is test/kafka/checkpoint-restore.test.ts.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { readCheckpoints } from '../../core/processor.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { listingPastTheEnd } from '../../testkit/log-views.ts';

test('a restore that cannot reach the listed end warns that it stopped short and returns the newest checkpoint it read', { timeout: 30_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-restore-'));
  const log = openEmbeddedLog({ dir, fsync: 'none' });
  try {
    await log.createTopic({ name: 'state', partitions: 1 });
    const producer = await log.producer();
    await producer.send('state', [
      { key: 'in:0', value: Buffer.from(JSON.stringify({ c: 5, n: 7, p: [[6, 7]] })) },
      { key: 'in:0', value: Buffer.from(JSON.stringify({ c: 9, n: 9, p: [] })) },
    ]);
    await producer.close();
    const lines: Record<string, unknown>[] = [];
    const logger = jsonLogger({ level: 'info', write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) });

    const found = await readCheckpoints(listingPastTheEnd(log, 'state', 3), 'state', new Set(['in:0']), logger, { idleEndMs: 500 });
    assert.deepEqual(found.get('in:0'), { c: 9, n: 9, p: [] });
    const warned = lines.filter((l) => l['level'] === 'warn');
    assert.equal(warned.length, 1, JSON.stringify(warned));
    assert.match(String(warned[0]!['msg']), /stopped short/);
    assert.deepEqual(warned[0]!['positions'], [[0, 2, 5]], '[partition, position, listed end]');

    // Listed truthfully, the same read reaches the end and says nothing.
    lines.length = 0;
    assert.deepEqual((await readCheckpoints(log, 'state', new Set(['in:0']), logger, { idleEndMs: 500 })).get('in:0'), { c: 9, n: 9, p: [] });
    assert.deepEqual(lines.filter((l) => l['level'] === 'warn'), []);
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
