// Checksums of the embedded log that are combined rather than computed over the bytes: crc32Combine against
// node:zlib's crc32 of the concatenation, a batch's CRC against a pass over its buffer, and journal entries
// written with the batches' CRCs against the same entries checksummed byte by byte.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { crc32 } from 'node:zlib';
import { crc32Combine } from '../../core/log/embedded/crc32-combine.ts';
import { encodeEntry, type JournalEntry } from '../../core/log/embedded/journal.ts';
import { batchSize, encodeBatch, validFrames, type PlainRecord } from '../../core/log/embedded/record-format.ts';
import { checkFrames, nativeAvailable, sealFrames } from '../../native/index.ts';
import { rng } from '../../core/random.ts';

function bytes(random: () => number, n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = Math.floor(random() * 256);
  return b;
}

test('crc32Combine gives the CRC of the concatenation, for empty, short and long parts', () => {
  const random = rng(3);
  const sizes = [0, 1, 3, 7, 8, 64, 255, 4096, 8100, 65_537, 300_000];
  for (const a of sizes) for (const b of sizes) {
    const A = bytes(random, a);
    const B = bytes(random, b);
    assert.equal(crc32Combine(crc32(A), crc32(B), b), crc32(Buffer.concat([A, B])), `|A| ${a}, |B| ${b}`);
  }
});

function records(random: () => number, n: number): PlainRecord[] {
  return Array.from({ length: n }, (_, i): PlainRecord => ({
    key: i % 3 === 0 ? null : bytes(random, 1 + Math.floor(random() * 40)),
    value: bytes(random, Math.floor(random() * 20_000)),
    timestamp: 1_700_000_000_000 + i,
    headers: i % 4 === 0 ? { trace: bytes(random, 16), ü: Buffer.alloc(0) } : {},
  }));
}

test('a batch carries the CRC of its whole buffer, encoded fresh or into a given buffer', () => {
  const random = rng(5);
  for (const n of [0, 1, 2, 17, 200]) {
    const rs = records(random, n);
    const fresh = encodeBatch(rs, 1000);
    assert.equal(fresh.crc, crc32(fresh.buf), `${n} records`);
    const into = encodeBatch(rs, 1000, Buffer.alloc(batchSize(rs), 0xee));
    assert.ok(into.buf.equals(fresh.buf), `${n} records into a given buffer`);
    assert.equal(into.crc, fresh.crc);
  }
  assert.throws(() => encodeBatch(records(random, 3), 0, Buffer.alloc(1)), /batch buffer of 1 bytes/);
});

test('journal entries checksummed from the batches’ CRCs are byte for byte those checksummed over the bytes', () => {
  const random = rng(9);
  const batches = [records(random, 5), records(random, 1), records(random, 40)].map((rs, i) => encodeBatch(rs, i * 100));
  const parts = batches.map((b, i) => ({ topic: `t${i}`, partition: i, base: b.baseOffset, blob: b.buf }));
  const offsets = new Map([['g', [['t0', 0, 5] as [string, number, number]]]]);
  const entry = (withCrc: boolean): JournalEntry => ({ kind: 'txn', transactionalId: 'tx', offsets, parts: parts.map((p, i) => (withCrc ? { ...p, blobCrc: batches[i]!.crc } : p)) });
  const combined = encodeEntry(entry(true));
  assert.ok(combined.equals(encodeEntry(entry(false))));
  assert.equal(combined.readUInt32BE(4), crc32(combined.subarray(8)), 'the frame CRC covers the whole payload');
});

test('frames are checked and sealed natively when the addon is built, in JS when RLSTREAM_NATIVE=off, alike', () => {
  const off = process.env['RLSTREAM_NATIVE'] === 'off';
  assert.equal(nativeAvailable(), !off);
  const random = rng(7);
  const records = Array.from({ length: 50 }, (_, i): PlainRecord => {
    const headers: Record<string, Buffer> = i % 5 ? {} : { h: bytes(random, 3) };
    return { key: i % 3 ? bytes(random, 5) : null, value: bytes(random, 1 + ((i * 37) % 700)), timestamp: 1000 + i, headers };
  });
  const batch = encodeBatch(records, 0);
  // The path under test: null from the native calls means the JS path did the work.
  assert.equal(sealFrames(batch.buf, 0, batch.buf.length) === null, off);
  assert.equal(checkFrames(batch.buf, 0, batch.buf.length, Infinity, 26, 1 << 20) === null, off);
  assert.equal(batch.crc, crc32(batch.buf));
  assert.deepEqual(validFrames(batch.buf, 0, batch.buf.length, Infinity, 1 << 20), { end: batch.buf.length, records: 50 });
  // A flipped bit in record 30's value stops the check at record 30, on either path.
  const damaged = Buffer.from(batch.buf);
  damaged[batch.ends[29]! + 40]! ^= 0x10;
  assert.deepEqual(validFrames(damaged, 0, damaged.length, Infinity, 1 << 20), { end: batch.ends[29]!, records: 30 });
});
