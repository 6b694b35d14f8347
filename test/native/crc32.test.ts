// The native CRC-32 (carry-less multiplication, native/src/frames.cpp) against node:zlib's on every length up to
// past the folding thresholds (64 bytes, then 16-byte steps), at unaligned starts, continued from a CRC, and on
// megabytes; and the log's native frame sealing and checking that use it, against the JS frame check on good
// and damaged frames.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { crc32 } from 'node:zlib';
import { isRlstreamError } from '../../core/errors.ts';
import { checkFrames, nativeAvailable, nativeCrc32, sealFrames, transcodeRecords } from '../../native/index.ts';
import { encodeBatch, frameProblem } from '../../core/log/embedded/record-format.ts';

const skip = nativeAvailable() ? false : 'native addon not built';

test('native CRC-32 equals zlib on every length, alignment and start value', { skip }, () => {
  const data = randomBytes((4 << 20) + 64);
  let compared = 0;
  for (let n = 0; n <= 1100; n++) {
    for (const offset of [0, 1, 7, 13]) {
      const b = data.subarray(offset, offset + n);
      assert.equal(nativeCrc32(b), crc32(b), `length ${n} at offset ${offset}`);
      assert.equal(nativeCrc32(b, 0xdeadbeef), crc32(b, 0xdeadbeef), `length ${n} at offset ${offset}, continued`);
      compared += 2;
    }
  }
  assert.equal(nativeCrc32(data.subarray(3)), crc32(data.subarray(3)), 'megabytes');
  // Continuing from a part's CRC gives the CRC of the whole.
  assert.equal(nativeCrc32(data.subarray(1000, 5000), nativeCrc32(data.subarray(0, 1000))), crc32(data.subarray(0, 5000)));
  assert.ok(compared > 8000);
});

test('native frame check stops where the JS frame check finds the first problem', { skip }, () => {
  const records = Array.from({ length: 50 }, (_, i) => ({ key: i % 3 ? Buffer.from(`k${i}`) : null, value: randomBytes(i * 37), timestamp: 1_700_000_000_000 + i, headers: (i % 2 ? { h: Buffer.from('x') } : {}) as Record<string, Buffer> }));
  const { buf, ends, crc } = encodeBatch(records, 0);
  // encodeBatch seals the frames natively: every frame passes the JS check, and the batch CRC is the buffer's.
  assert.equal(jsEndOf(buf), buf.length);
  assert.equal(crc, crc32(buf));
  function jsEndOf(b: Buffer): number {
    return jsEnd(b, b.length);
  }
  function jsEnd(b: Buffer, limit: number): number {
    let p = 0;
    while (p < limit && frameProblem(b, p, limit, 1 << 20) === null) p += 8 + b.readUInt32BE(p);
    return p;
  }
  const whole = checkFrames(buf, 0, buf.length, Infinity, 26, 1 << 20)!;
  assert.deepEqual(whole, { end: buf.length, records: 50 });
  assert.deepEqual(checkFrames(buf, 0, buf.length, 7, 26, 1 << 20), { end: ends[6], records: 7 }, 'at most maxRecords');
  for (const at of [0, 5, ends[10]! + 3, ends[20]! + 9, buf.length - 1]) {
    const bad = Buffer.from(buf);
    bad[at] = bad[at]! ^ 0x40;
    const r = checkFrames(bad, 0, bad.length, Infinity, 26, 1 << 20)!;
    assert.equal(r.end, jsEnd(bad, bad.length), `a flipped bit at byte ${at}`);
    assert.ok(r.end < buf.length);
  }
  const cut = ends[30]! - 5;
  assert.deepEqual(checkFrames(buf, 0, cut, Infinity, 26, 1 << 20), { end: ends[29], records: 30 }, 'a truncated frame');
});

test('the frame and transcode calls reject bad arguments with a clear error instead of reading out of bounds', { skip }, () => {
  const buf = Buffer.alloc(64);
  const rejects = (fn: () => unknown, pattern: RegExp) => assert.throws(fn, (e: unknown) => isRlstreamError(e, 'NATIVE_INVALID_ARGUMENT') && pattern.test(e.message));
  rejects(() => checkFrames(buf, 10, 100, 5, 26, 1 << 20), /out of range/);
  const cut = Buffer.alloc(64);
  cut.writeUInt32BE(100, 0); // a frame claiming 100 body bytes in a 64-byte range
  rejects(() => sealFrames(cut, 0, 64), /do not tile/);
  const state = new Float64Array(2);
  const status = new Uint8Array(1);
  const args = (program: Int32Array, starts: number[], lengths: number[]) =>
    transcodeRecords(program, Buffer.alloc(0), buf, new Float64Array(starts), new Int32Array(lengths), 0, 1, 5, Buffer.alloc(16), state, status);
  rejects(() => args(new Int32Array([1, 2, 3]), [0], [8]), /not a transcoder program/);
  // A program whose sections point past its end.
  const bogus = new Int32Array(11);
  bogus[0] = 0x52425431;
  bogus[1] = 11;
  bogus[2] = 1000;
  rejects(() => args(bogus, [0], [8]), /nodes section is out of range/);
  // A record said to lie past the end of its buffer.
  const empty = new Int32Array(11);
  empty[0] = 0x52425431;
  for (let i = 1; i < 11; i += 2) empty[i] = 11;
  rejects(() => args(empty, [60], [8]), /outside base/);
});
