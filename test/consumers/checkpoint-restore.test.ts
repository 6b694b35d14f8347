// A processor's checkpoint restore on the embedded log when the state topic's listed end cannot be reached (a log
// that lists an end past its last record, as a Kafka partition did whose position could not pass something): the
// restore never returns what it read so far (an older checkpoint is stale state to a processor that resumes from
// it); it fails retriably at its deadline, naming the positions, and the processor's role restarts. Listed
// truthfully, the same read reaches the end and returns the newest checkpoint.
// (Reading past an open transaction on Kafka is test/kafka/checkpoint-restore.test.ts.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { readCheckpoints } from '../../core/processor.ts';
import { rng } from '../../core/random.ts';
import { listingPastTheEnd } from '../../testkit/log-views.ts';

test('a restore that cannot reach the listed end fails retriably at its deadline; listed truthfully it returns the newest checkpoint', { timeout: 60_000 }, async () => {
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

    // Generated stalls (1-5 records past the end) and the smallest one by hand.
    const rand = rng(71);
    const extras = [1, ...Array.from({ length: 3 }, () => 1 + Math.floor(rand() * 5))];
    for (const extra of extras) {
      const t0 = Date.now();
      await assert.rejects(
        readCheckpoints(listingPastTheEnd(log, 'state', extra), 'state', new Set(['in:0']), { timeoutMs: 1_000 }),
        (e: unknown) =>
          isRlstreamError(e) && e.code === 'LOG_UNAVAILABLE' && e.retriable === true && /checkpoint restore/.test(e.message) && e.message.includes(`[[0,2,${2 + extra}]]`),
        `listed ${extra} past the end`,
      );
      assert.ok(Date.now() - t0 >= 1_000, 'failed at its deadline, not before');
    }

    // Listed truthfully, the same read reaches the end and takes the newest checkpoint.
    assert.deepEqual((await readCheckpoints(log, 'state', new Set(['in:0']), { timeoutMs: 1_000 })).get('in:0'), { c: 9, n: 9, p: [] });
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
