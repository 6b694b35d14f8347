// Embedded-log behaviour beyond the shared contract: persistence across reopen, crash recovery (torn
// segment and journal tails, half-applied transactions), the directory lock, segment roll and retention,
// record size limits, and consumers woken by appends rather than by polling.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { appendFileSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openEmbeddedLog } from '../../core/log/embedded/index.ts';
import { repairLog } from '../../core/log/embedded/repair.ts';
import { isRlstreamError } from '../../core/errors.ts';
import { copiedRecord } from '../../core/log/embedded/record-format.ts';
import { FrameChunk } from '../../core/log/embedded/chunk.ts';
import type { LogRecord, RecordChunk } from '../../core/log/types.ts';
import { jsonLogger } from '../../core/telemetry.ts';
import { pollUntil } from './conformance.ts';

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'rlstream-embedded-'));
}

function segmentFiles(dir: string, topic: string, partition: number): string[] {
  return readdirSync(join(dir, 'topics', topic, String(partition))).filter((f) => f.endsWith('.log')).sort();
}

test('records, topics and committed offsets survive close and reopen', async () => {
  const dir = tempDir();
  try {
    let log = openEmbeddedLog({ dir, segmentBytes: 4096 });
    await log.createTopic({ name: 't', partitions: 2 });
    const p = await log.producer();
    await p.send('t', Array.from({ length: 100 }, (_, i) => ({ key: `k${i}`, value: Buffer.alloc(100, i) })));
    const c = await log.consumer({ groupId: 'g', topics: ['t'] });
    await pollUntil(c, 100, 5000);
    await c.commit();
    await log.close();
    log = openEmbeddedLog({ dir, segmentBytes: 4096 });
    assert.deepEqual((await log.listTopics()).map((t) => [t.name, t.partitions]), [['t', 2]]);
    assert.equal((await log.offsets('t')).reduce((n, o) => n + o.high, 0), 100);
    assert.deepEqual((await log.lag('g', 't')).map((l) => l.lag), [0, 0]);
    const all = await pollUntil(await log.consumer({ groupId: 'other', topics: ['t'] }), 100, 5000);
    assert.equal(all.length, 100);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a torn tail of the active segment and of the journal is cut on open', async () => {
  const dir = tempDir();
  try {
    let log = openEmbeddedLog({ dir });
    await log.createTopic({ name: 't', partitions: 1 });
    const p = await log.producer();
    await p.send('t', Array.from({ length: 10 }, (_, i) => ({ value: Buffer.from(`r${i}`) })));
    const c = await log.consumer({ groupId: 'g', topics: ['t'] });
    await c.commit([{ topic: 't', partition: 0, offset: 4 }]);
    await log.close();
    const seg = join(dir, 'topics', 't', '0', segmentFiles(dir, 't', 0)[0]!);
    const size = statSync(seg).size;
    // A partially written record: its length field promises more bytes than the file holds.
    appendFileSync(seg, Buffer.from([0, 0, 0, 60, 1, 2, 3, 4, 5, 6]));
    // A last record whose bytes were damaged: the CRC catches it.
    const journal = readdirSync(dir).find((f) => f.startsWith('journal-'))!;
    appendFileSync(join(dir, journal), Buffer.from([0, 0, 0, 30, 9, 9]));
    log = openEmbeddedLog({ dir });
    assert.equal(statSync(seg).size, size);
    assert.equal((await log.offsets('t'))[0]?.high, 10);
    assert.deepEqual(await log.committed('g', 't'), [{ topic: 't', partition: 0, offset: 4 }]);
    await (await log.producer()).send('t', [{ value: Buffer.from('after') }]);
    const all = await pollUntil(await log.consumer({ groupId: 'x', topics: ['t'] }), 11, 5000);
    assert.deepEqual(all.map((r) => r.value.toString()).slice(-2), ['r9', 'after']);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a corrupt record is detected by its CRC on open of the active segment', async () => {
  const dir = tempDir();
  try {
    let log = openEmbeddedLog({ dir });
    await log.createTopic({ name: 't', partitions: 1 });
    await (await log.producer()).send('t', Array.from({ length: 5 }, (_, i) => ({ value: Buffer.alloc(50, i) })));
    await log.close();
    const seg = join(dir, 'topics', 't', '0', segmentFiles(dir, 't', 0)[0]!);
    const size = statSync(seg).size;
    // Flip the last record's last byte: after a clean close that is a loss, not a torn tail; the 4 records
    // before it are kept and offset 4 is not given out again.
    const { openSync, readSync, writeSync, closeSync } = await import('node:fs');
    const fd = openSync(seg, 'r+');
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, size - 1);
    b[0] = b[0]! ^ 0xff;
    writeSync(fd, b, 0, 1, size - 1);
    closeSync(fd);
    assert.throws(() => openEmbeddedLog({ dir }), (e) => isRlstreamError(e, 'LOG_CORRUPT') && /CRC mismatch[^]*offset 4 of t\/0 are lost/.test(e.message));
    assert.deepEqual(
      (await repairLog(dir)).foundNow.map((d) => [d.fromOffset, d.toOffset]),
      [[4, 5]],
    );
    log = openEmbeddedLog({ dir });
    assert.deepEqual(await log.offsets('t'), [{ partition: 0, low: 0, high: 5 }]);
    assert.equal((await pollUntil(await log.consumer({ groupId: 'r', topics: ['t'] }), 4, 5000)).length, 4);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a transaction journaled but only partly applied is completed on open (all-or-nothing)', async () => {
  const dir = tempDir();
  try {
    let log = openEmbeddedLog({ dir });
    await log.createTopic({ name: 'a', partitions: 1 });
    await log.createTopic({ name: 'b', partitions: 1 });
    // What a writer that crashes from here on leaves as its manifest: the entries of its last layout change.
    const crashed = readFileSync(join(dir, 'manifest.json'));
    const tp = await log.producer({ transactionalId: 'tx' });
    const txn = await tp.transaction();
    await txn.send('a', [{ value: Buffer.from('a0') }, { value: Buffer.from('a1') }]);
    await txn.send('b', [{ value: Buffer.from('b0') }]);
    await txn.sendOffsets('g', [{ topic: 'a', partition: 0, offset: 1 }]);
    await txn.commit();
    await log.close();
    // Simulate a crash after the journal entry but before partition b got its record, and with a's second
    // record torn in half: the writer never closed, so its manifest is the one it wrote before the transaction.
    writeFileSync(join(dir, 'manifest.json'), crashed);
    const segA = join(dir, 'topics', 'a', '0', segmentFiles(dir, 'a', 0)[0]!);
    truncateSync(segA, statSync(segA).size - 3);
    truncateSync(join(dir, 'topics', 'b', '0', segmentFiles(dir, 'b', 0)[0]!), 0);
    log = openEmbeddedLog({ dir });
    assert.equal((await log.offsets('a'))[0]?.high, 2);
    assert.equal((await log.offsets('b'))[0]?.high, 1);
    const got = await pollUntil(await log.consumer({ groupId: 'r', topics: ['a', 'b'] }), 3, 5000);
    assert.deepEqual(got.map((r) => r.value.toString()).sort(), ['a0', 'a1', 'b0']);
    assert.deepEqual(await log.committed('g', 'a'), [{ topic: 'a', partition: 0, offset: 1 }]);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a journaled transaction whose earlier records were lost is kept, at the next offsets, key and headers included', async () => {
  const dir = tempDir();
  try {
    let log = openEmbeddedLog({ dir, fsync: 'none' });
    await log.createTopic({ name: 'a', partitions: 1 });
    const crashed = readFileSync(join(dir, 'manifest.json'));
    const plain = await log.producer();
    await plain.send('a', [{ value: Buffer.from('p0') }, { value: Buffer.from('p1') }]);
    const txn = await (await log.producer({ transactionalId: 'tx' })).transaction();
    await txn.send('a', [{ key: 'k', value: Buffer.from('t0'), headers: { h: Buffer.from('x') } }]);
    await txn.commit();
    await log.close();
    // A machine crash with fsync 'none': the segment lost everything, the journal kept the transaction, and the
    // manifest is the one written before the records (the close that wrote the last one never happened).
    writeFileSync(join(dir, 'manifest.json'), crashed);
    truncateSync(join(dir, 'topics', 'a', '0', segmentFiles(dir, 'a', 0)[0]!), 0);
    const warnings: string[] = [];
    log = openEmbeddedLog({ dir, fsync: 'none' }, jsonLogger({ level: 'warn', write: (l) => warnings.push(String((JSON.parse(l) as { msg: string }).msg)) }));
    assert.deepEqual(warnings, ['embedded log: transaction replayed at a lower offset']);
    assert.deepEqual((await log.offsets('a')).map((o) => [o.low, o.high]), [[0, 1]]);
    const [r] = await pollUntil(await log.consumer({ groupId: 'r', topics: ['a'] }), 1, 5000);
    assert.deepEqual([r?.offset, r?.key?.toString(), r?.value.toString(), r?.headers['h']?.toString()], [0, 'k', 't0', 'x']);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the directory lock refuses a second opener and names the holder pid', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir });
    assert.throws(() => openEmbeddedLog({ dir }), (e) => isRlstreamError(e, 'LOG_LOCKED'));
    const script = `import { openEmbeddedLog } from ${JSON.stringify(join(import.meta.dirname, '../../core/log/embedded/index.ts'))};
      try { openEmbeddedLog({ dir: ${JSON.stringify(dir)} }); process.stdout.write('opened'); } catch (e) { process.stdout.write(e.code + ' ' + e.message); }`;
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise((r) => child.on('exit', r));
    assert.match(out, new RegExp(`^LOG_LOCKED .*process ${process.pid}`));
    await log.close();
    // A lock left by a dead process (here: a pid that cannot exist) is taken over.
    writeFileSync(join(dir, 'LOCK'), '2147483646\n');
    const again = openEmbeddedLog({ dir });
    await again.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('segments roll by size; retention deletes whole old segments by size and by age', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir, segmentBytes: 2048, retentionCheckMs: 0 });
    await log.createTopic({ name: 'sz', partitions: 1, retention: { maxBytes: 8192 } });
    await log.createTopic({ name: 'age', partitions: 1, retention: { maxAgeMs: 60_000 } });
    const p = await log.producer();
    for (let i = 0; i < 100; i++) await p.send('sz', [{ value: Buffer.alloc(200, i) }]);
    const files = segmentFiles(dir, 'sz', 0);
    assert.ok(files.length >= 4 && files.length <= 6, `segments: ${files.length}`);
    const [o] = await log.offsets('sz');
    assert.ok(o && o.low > 0 && o.high === 100, JSON.stringify(o));
    // Reading from 0 starts at the first retained record.
    const c = await log.consumer({ groupId: 'g', topics: ['sz'] });
    const got = await pollUntil(c, 100 - o.low, 5000);
    assert.equal(got[0]?.offset, o.low);

    const old = Date.now() - 3_600_000;
    for (let i = 0; i < 30; i++) await p.send('age', [{ value: Buffer.alloc(200), timestamp: old + i }]);
    for (let i = 0; i < 3; i++) await p.send('age', [{ value: Buffer.alloc(200) }]);
    log.applyRetention();
    const [a] = await log.offsets('age');
    assert.ok(a && a.low > 0 && a.high === 33, JSON.stringify(a));
    assert.ok((await log.offsetsForTimestamp('age', Date.now() - 60_000))[0]!.offset >= 30);

    // null is no limit: the same hour-old records and more bytes than 'sz' keeps all stay, across a reopen
    // (the spec is read back from meta.json), where a null read as a number would have deleted every old segment.
    await log.createTopic({ name: 'keep', partitions: 1, retention: { maxAgeMs: null, maxBytes: null } });
    for (let i = 0; i < 100; i++) await p.send('keep', [{ value: Buffer.alloc(200), timestamp: old + i }]);
    await log.close();
    const reopened = openEmbeddedLog({ dir, segmentBytes: 2048, retentionCheckMs: 0 });
    reopened.applyRetention();
    assert.deepEqual(await reopened.offsets('keep'), [{ partition: 0, low: 0, high: 100 }]);
    assert.deepEqual((await reopened.listTopics()).find((t) => t.name === 'keep')?.retention, { maxAgeMs: null, maxBytes: null });
    await reopened.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('seek by timestamp across many segments uses the time index', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir, segmentBytes: 4096, indexIntervalBytes: 256 });
    await log.createTopic({ name: 't', partitions: 1 });
    const p = await log.producer();
    const base = 1_700_000_000_000;
    await p.send('t', Array.from({ length: 500 }, (_, i) => ({ value: Buffer.alloc(100), timestamp: base + i * 10 })));
    await log.close();
    const again = openEmbeddedLog({ dir, segmentBytes: 4096, indexIntervalBytes: 256 });
    for (const i of [0, 1, 37, 250, 499]) assert.equal((await again.offsetsForTimestamp('t', base + i * 10 - 5))[0]?.offset, i);
    assert.equal((await again.offsetsForTimestamp('t', base + 10_000))[0]?.offset, 500);
    await again.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('oversized records and unknown partitions are refused with typed errors', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir, maxRecordBytes: 10_000 });
    await log.createTopic({ name: 't', partitions: 2 });
    const p = await log.producer();
    await assert.rejects(p.send('t', [{ value: Buffer.alloc(20_000) }]), (e) => isRlstreamError(e, 'LOG_RECORD_TOO_LARGE'));
    await assert.rejects(p.send('t', [{ value: Buffer.alloc(1), partition: 5 }]), (e) => isRlstreamError(e, 'LOG_UNKNOWN_PARTITION'));
    await assert.rejects(p.send('nope', [{ value: Buffer.alloc(1) }]), (e) => isRlstreamError(e, 'LOG_UNKNOWN_TOPIC'));
    assert.equal((await log.offsets('t')).reduce((n, o) => n + o.high, 0), 0, 'a refused batch writes nothing');
    await log.close();
    await assert.rejects(p.send('t', [{ value: Buffer.alloc(1) }]), (e) => isRlstreamError(e, 'LOG_CLOSED'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a waiting consumer is woken by an append within milliseconds', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir });
    await log.createTopic({ name: 't', partitions: 1 });
    const c = await log.consumer({ groupId: 'g', topics: ['t'] });
    const p = await log.producer();
    const pending = c.poll({ timeoutMs: 10_000 });
    const t0 = Date.now();
    setTimeout(() => void p.send('t', [{ value: Buffer.from('x') }]), 20);
    const got = await pending;
    assert.equal(got.length, 1);
    assert.ok(Date.now() - t0 < 2000, `woken after ${Date.now() - t0} ms`);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('pollChunks hands over, as frames in place, exactly the records poll gives, across segments, and moves the same positions', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir, segmentBytes: 4096 });
    await log.createTopic({ name: 't', partitions: 2 });
    const p = await log.producer();
    await p.send('t', Array.from({ length: 300 }, (_, i) => ({ key: i % 4 ? `k${i}` : null, value: Buffer.alloc(20 + (i % 90), i), timestamp: 1000 + i, headers: (i % 3 ? {} : { h: Buffer.from(`v${i}`) }) as Record<string, Buffer> })));
    const byPoll = await pollUntil(await log.consumer({ groupId: 'a', topics: ['t'] }), 300, 5000);
    const chunked = await log.consumer({ groupId: 'b', topics: ['t'] });
    const seen: unknown[] = [];
    for (let empty = 0; seen.length < 300 && empty < 50; ) {
      const chunks = await chunked.pollChunks!({ maxRecords: 37, timeoutMs: 20 });
      if (chunks.length === 0) empty++;
      for (const c of chunks) {
        for (let i = 0; i < c.count; i++) {
          const r = c.record(i);
          assert.equal(r.offset, c.firstOffset + i);
          // The value lies where the chunk says.
          assert.deepEqual(c.buf.subarray(c.valueStart(i), c.valueStart(i) + c.valueLength(i)), r.value);
          seen.push(r);
        }
        // head(n) keeps the first n records only.
        const head = c.head(1);
        assert.equal(head.count, Math.min(1, c.count));
        assert.equal(head.firstOffset, c.firstOffset);
      }
    }
    const key = (r: { partition: number; offset: number }) => r.partition * 1e6 + r.offset;
    const order = (rs: unknown[]) => [...(rs as LogRecord[])].sort((x, y) => key(x) - key(y));
    assert.deepEqual(order(seen), order(byPoll));
    await chunked.commit();
    assert.deepEqual((await log.lag('b', 't')).map((l) => l.lag), [0, 0]);
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('released chunks are read into again: copied records stay intact; unreleased chunks and poll() records are never read into', async () => {
  const dir = tempDir();
  try {
    const log = openEmbeddedLog({ dir });
    await log.createTopic({ name: 't', partitions: 1 });
    const p = await log.producer();
    const valueOf = (i: number) => Buffer.from(`value ${i} `.repeat(3 + (i % 5)));
    await p.send('t', Array.from({ length: 200 }, (_, i) => ({ value: valueOf(i), headers: { h: Buffer.from(`h${i}`) } })));
    const c = await log.consumer({ groupId: 'g', topics: ['t'] });
    // Records as views into the chunks' bytes (as the consumer's own poll builds them), to see what a reuse overwrites.
    const records = (chunks: RecordChunk[]) => chunks.flatMap((ch) => Array.from({ length: ch.count }, (_, i) => (ch as FrameChunk).recordInPlace(i)));
    const first = await c.pollChunks!({ maxRecords: 50, timeoutMs: 100 });
    const inPlace = records(first)[0]!;
    const copied = copiedRecord(inPlace);
    c.releaseChunks!(first);
    c.releaseChunks!(first); // twice: still lent out once only
    const second = await c.pollChunks!({ maxRecords: 50, timeoutMs: 100 });
    assert.equal(second[0]!.buf.buffer, first[0]!.buf.buffer, 'the released buffer is read into again');
    assert.deepEqual(records(second).map((r) => [r.offset, r.value.toString()]), Array.from({ length: 50 }, (_, i) => [50 + i, valueOf(50 + i).toString()]));
    // The view into the first read now shows other bytes; the copy does not.
    assert.notDeepEqual(inPlace.value, valueOf(0));
    assert.deepEqual([copied.offset, copied.value, copied.headers['h']], [0, valueOf(0), Buffer.from('h0')]);
    const third = await c.pollChunks!({ maxRecords: 50, timeoutMs: 100 });
    assert.notEqual(third[0]!.buf.buffer, second[0]!.buf.buffer, 'a chunk still held is not read into');
    assert.deepEqual(records(second).map((r) => r.offset)[0], 50, 'and what it holds is unchanged');
    // poll()'s records are the caller's to keep: their buffers are never lent, so even handed to releaseChunks
    // they are not read into again.
    const other = await log.consumer({ groupId: 'h', topics: ['t'] });
    const kept = await other.poll({ maxRecords: 10, timeoutMs: 100 });
    other.releaseChunks!([new FrameChunk('t', 0, 0, kept[0]!.value, new Int32Array(0))]);
    await other.pollChunks!({ maxRecords: 100, timeoutMs: 100 });
    assert.deepEqual(kept.map((r) => r.value), Array.from({ length: 10 }, (_, i) => valueOf(i)));
    await log.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('processes opening one log directory at the same moment each open it or get LOG_LOCKED, never another error', { timeout: 60_000 }, async () => {
  const dir = tempDir();
  try {
    await openEmbeddedLog({ dir }).close();
    const script = `import { openEmbeddedLog } from ${JSON.stringify(join(import.meta.dirname, '../../core/log/embedded/index.ts'))};
      const start = Number(process.argv[1]);
      while (Date.now() < start) {}
      try { const log = openEmbeddedLog({ dir: ${JSON.stringify(dir)} }); await new Promise((r) => setTimeout(r, 50)); await log.close(); process.stdout.write('opened'); }
      catch (e) { process.stdout.write(String(e.code) + ' ' + e.message); }`;
    for (let round = 0; round < 3; round++) {
      // Started together, after their imports: the opens race within a millisecond or two.
      const start = Date.now() + 3000;
      const outs = await Promise.all(
        Array.from({ length: 5 }, async () => {
          const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, String(start)], { stdio: ['ignore', 'pipe', 'pipe'] });
          let out = '';
          child.stdout.on('data', (d: Buffer) => (out += d.toString()));
          child.stderr.on('data', (d: Buffer) => (out += d.toString()));
          await new Promise((r) => child.on('exit', r));
          return out;
        }),
      );
      for (const out of outs) assert.match(out, /^(opened|LOG_LOCKED log directory .* is locked by process \d+: process \d+ .* has the log open)$/, `round ${round}`);
      assert.ok(outs.includes('opened'), `round ${round}: someone opened the log`);
      assert.deepEqual(readdirSync(dir).filter((f) => f.startsWith('LOCK')), [], 'no lock or temporary file left behind');
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
