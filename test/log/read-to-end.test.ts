// readToEnd (restores and audits): reads every record up to the listed end and stops there; a position that
// cannot reach its end fails the read retriably at the deadline (a restore never resumes from a partial read);
// a partition never assigned fails retriably at the deadline. On the embedded log (the Kafka side of positions
// passing transaction markers is in the conformance suite).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isRlstreamError } from '../../core/errors.ts';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import type { LogRecord } from '../../core/log/types.ts';

test('readToEnd stops exactly at the listed end, fails a stalled read at the deadline, and fails when unassigned', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-read-to-end-'));
  const log = openEmbeddedLog({ dir });
  try {
    await log.createTopic({ name: 't', partitions: 2 });
    const producer = await log.producer();
    await producer.send('t', Array.from({ length: 30 }, (_, i) => ({ partition: i % 2, value: Buffer.from(`v${i}`) })));
    const ends = new Map((await log.offsets('t')).map((p) => [p.partition, p.high]));
    // Written after the ends were listed: not part of this read.
    await producer.send('t', [{ partition: 0, value: Buffer.from('later') }]);

    const got: LogRecord[] = [];
    const c1 = await log.consumer({ groupId: 'a', topics: ['t'] });
    await readToEnd(c1, 't', ends, (rs) => void got.push(...rs), { what: 'test' });
    await c1.close();
    assert.equal(got.filter((r) => r.value.toString() !== 'later').length, 30);

    // A stall is never the end: the read fails retriably at its deadline, having read what there was, and says
    // how long it had not moved.
    const c4 = await log.consumer({ groupId: 'd', topics: ['t'] });
    let seen = 0;
    const t1 = Date.now();
    await assert.rejects(readToEnd(c4, 't', new Map([[0, 1000]]), (rs) => void (seen += rs.length), { what: 'test', timeoutMs: 1500 }), (e: unknown) => isRlstreamError(e) && e.code === 'LOG_UNAVAILABLE' && e.retriable === true && /without movement/.test(e.message) && /\[\[0,16,1000\]\]/.test(e.message));
    assert.ok(Date.now() - t1 >= 1500);
    assert.equal(seen, 31); // everything there was, on both partitions
    await c4.close();

    const c3 = await log.consumer({ groupId: 'c', topics: ['t'] });
    await assert.rejects(readToEnd(c3, 't', new Map([[7, 10]]), () => {}, { what: 'test', timeoutMs: 300 }), (e: unknown) => isRlstreamError(e) && e.code === 'LOG_UNAVAILABLE' && e.retriable === true);
    await c3.close();
    await producer.close();
  } finally {
    await log.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
