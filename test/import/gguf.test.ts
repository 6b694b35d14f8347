// The GGUF reader: metadata of every value type, tensor placement under an alignment, each quant type
// dequantized to the values its block definition gives, and clear errors for files that are not right.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';
import { GgufFile } from '../../core/weights/gguf.ts';
import { concat, GGML, packF16, packF32, packQ4_0, packQ4_1, packQ4_K, packQ6_K, packQ8_0, writeGguf, type RawTensor } from './gguf-writer.ts';

const ints = (r: () => number, n: number, lo: number, hi: number): number[] => Array.from({ length: n }, () => lo + Math.floor(r() * (hi - lo + 1)));

function read(tensor: RawTensor, alignment?: number): Float32Array {
  const f = GgufFile.fromBytes(writeGguf({ metadata: [], tensors: [tensor], alignment }));
  const info = f.tensor(tensor.name)!;
  assert.deepEqual(info.shape, tensor.shape);
  return f.readTensor(info);
}

function assertFormat(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => isRlstreamError(err, 'WEIGHTS_FORMAT') && pattern.test(err.message));
}

test('metadata of every value type reads back, u64 beyond 2^53 as a bigint', () => {
  const f = GgufFile.fromBytes(
    writeGguf({
      tensors: [],
      metadata: [
        { key: 'a.u8', kind: 'u8', value: 250 },
        { key: 'a.i8', kind: 'i8', value: -7 },
        { key: 'a.u16', kind: 'u16', value: 65000 },
        { key: 'a.i16', kind: 'i16', value: -300 },
        { key: 'a.u32', kind: 'u32', value: 4_000_000_000 },
        { key: 'a.i32', kind: 'i32', value: -2_000_000_000 },
        { key: 'a.f32', kind: 'f32', value: 0.5 },
        { key: 'a.bool', kind: 'bool', value: true },
        { key: 'a.str', kind: 'str', value: 'héllo' },
        { key: 'a.u64', kind: 'u64', value: 2n ** 60n },
        { key: 'a.i64', kind: 'i64', value: -5 },
        { key: 'a.f64', kind: 'f64', value: 1e-300 },
        { key: 'a.arr', kind: 'arr', elem: 'str', value: ['x', 'y z', ''] },
        { key: 'a.ints', kind: 'arr', elem: 'i32', value: [1, -2, 3] },
      ],
    }),
  );
  assert.deepEqual(Object.fromEntries(f.metadata), {
    'a.u8': 250, 'a.i8': -7, 'a.u16': 65000, 'a.i16': -300, 'a.u32': 4_000_000_000, 'a.i32': -2_000_000_000, 'a.f32': 0.5,
    'a.bool': true, 'a.str': 'héllo', 'a.u64': 2n ** 60n, 'a.i64': -5, 'a.f64': 1e-300, 'a.arr': ['x', 'y z', ''], 'a.ints': [1, -2, 3],
  });
  assert.equal(f.get('a.str', 'string'), 'héllo');
  assertFormat(() => f.get('a.str', 'number'), /a\.str should be a number, it is a string/);
});

test('tensors are found at their offsets under general.alignment, and shapes are ne reversed', () => {
  const a = [1, 2, 3];
  const b = Array.from({ length: 6 }, (_, i) => i - 2.5);
  for (const alignment of [32, 64, 8]) {
    const bytes = writeGguf({ metadata: [], alignment, tensors: [{ name: 'a', type: GGML.F32, shape: [3], data: packF32(a) }, { name: 'b', type: GGML.F32, shape: [2, 3], data: packF32(b) }] });
    const f = GgufFile.fromBytes(bytes);
    assert.equal(f.alignment, alignment);
    for (const t of f.tensors) assert.equal(t.offset % alignment, 0);
    assert.deepEqual([...f.readTensor(f.tensor('a')!)], a);
    assert.deepEqual(f.tensor('b')!.shape, [2, 3]);
    assert.deepEqual([...f.readTensor(f.tensor('b')!)], b);
  }
});

test('F16 and BF16 decode to the values their bits stand for', () => {
  assert.deepEqual([...read({ name: 'h', type: GGML.F16, shape: [4], data: packF16([1, -2, 0.333251953125, 65504]) })], [1, -2, 0.333251953125, 65504]);
  // bf16 is the top half of a float32: 0x3f80 = 1, 0xc040 = -3, 0x3eaa = 0.33203125
  const bf = new Uint8Array(new Uint16Array([0x3f80, 0xc040, 0x3eaa]).buffer);
  assert.deepEqual([...read({ name: 'b', type: GGML.BF16, shape: [3], data: bf })], [1, -3, 0.33203125]);
});

test('Q8_0, Q4_0 and Q4_1 blocks dequantize to d*q, d*(q-8) and d*q+m', () => {
  const r = rng(1);
  const q8 = [ints(r, 32, -127, 127), ints(r, 32, -127, 127)];
  const got8 = read({ name: 'q8', type: GGML.Q8_0, shape: [64], data: concat([packQ8_0(0.015625, q8[0]!), packQ8_0(-3, q8[1]!)]) });
  assert.deepEqual([...got8], [...q8[0]!.map((q) => 0.015625 * q), ...q8[1]!.map((q) => -3 * q)]);

  const q40 = ints(r, 32, 0, 15);
  assert.deepEqual([...read({ name: 'q40', type: GGML.Q4_0, shape: [32], data: packQ4_0(0.5, q40) })], q40.map((q) => 0.5 * (q - 8)));

  // Two rows of one block each: a row is a whole number of blocks, and rows follow each other.
  const q41 = [ints(r, 32, 0, 15), ints(r, 32, 0, 15)];
  const got41 = read({ name: 'q41', type: GGML.Q4_1, shape: [2, 32], data: concat([packQ4_1(0.0625, -0.5, q41[0]!), packQ4_1(1.5, 2, q41[1]!)]) });
  assert.deepEqual([...got41], [...q41[0]!.map((q) => Math.fround(0.0625 * q - 0.5)), ...q41[1]!.map((q) => 1.5 * q + 2)]);
});

test('Q4_K super-blocks dequantize to d*sc*q - dmin*m with 6-bit scales and mins', () => {
  const r = rng(2);
  const sc = [1, 7, 15, 63, 16, 33, 47, 62]; // sub-blocks 4..7 need the split high bits
  const mn = [0, 5, 63, 9, 48, 17, 31, 60];
  const q = ints(r, 256, 0, 15);
  const got = read({ name: 'k4', type: GGML.Q4_K, shape: [256], data: packQ4_K(0.25, 0.125, sc, mn, q) });
  assert.deepEqual([...got], q.map((v, e) => Math.fround(0.25 * sc[e >> 5]! * v - 0.125 * mn[e >> 5]!)));
});

test('Q6_K super-blocks dequantize to d*sc*(q-32) with signed 8-bit scales', () => {
  const r = rng(3);
  const sc = ints(r, 16, -128, 127);
  const q = ints(r, 256, 0, 63);
  const got = read({ name: 'k6', type: GGML.Q6_K, shape: [256], data: packQ6_K(0.0078125, sc, q) });
  assert.deepEqual([...got], q.map((v, e) => Math.fround(0.0078125 * sc[e >> 4]! * (v - 32))));
});

test('a file that is not GGUF, a truncated one, and an unreadable tensor type fail naming the problem', () => {
  assertFormat(() => GgufFile.fromBytes(new TextEncoder().encode('PK\x03\x04 a zip file'), 'model.zip'), /model\.zip: not a GGUF file: it starts with "PK\\u0003\\u0004"/);
  assertFormat(() => GgufFile.fromBytes(new Uint8Array([0x47, 0x47])), /not a GGUF file: 2 bytes/);
  assertFormat(() => GgufFile.fromBytes(writeGguf({ metadata: [], tensors: [], version: 1 })), /GGUF version 1 is not supported/);

  const whole = writeGguf({
    metadata: [{ key: 'tokenizer.ggml.tokens', kind: 'arr', elem: 'str', value: Array.from({ length: 100 }, (_, i) => `token${i}`) }],
    tensors: [{ name: 'w', type: GGML.F32, shape: [64], data: packF32(new Float32Array(64)) }],
  });
  GgufFile.fromBytes(whole); // the whole file reads
  assertFormat(() => GgufFile.fromBytes(whole.subarray(0, 600)), /truncated: .*tokenizer\.ggml\.tokens.* at byte \d+/);
  assertFormat(() => GgufFile.fromBytes(whole.subarray(0, whole.length - 10)), /truncated: tensor w needs bytes \d+ to \d+, the file has \d+/);

  const q5 = GgufFile.fromBytes(writeGguf({ metadata: [], tensors: [{ name: 'blk.0.ffn_up.weight', type: GGML.Q5_K, shape: [256], data: new Uint8Array(176) }] }));
  assertFormat(() => q5.readTensor(q5.tensors[0]!), /tensor blk\.0\.ffn_up\.weight has type Q5_K, which cannot be dequantized here \(readable: F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, BF16\)/);
  assertFormat(() => GgufFile.fromBytes(writeGguf({ metadata: [], tensors: [{ name: 'x', type: 99, shape: [4], data: new Uint8Array(16) }] })), /tensor x has unknown ggml type 99/);
  assertFormat(() => GgufFile.fromBytes(writeGguf({ metadata: [], tensors: [{ name: 'x', type: GGML.Q8_0, shape: [2, 16], data: new Uint8Array(34) }] })), /rows of 16 elements are not whole Q8_0 blocks of 32/);
});

test('GgufFile.open reads a file from disk and reports a missing one', () => {
  const dir = mkdtempSync(join(tmpdir(), 'gguf-'));
  try {
    const path = join(dir, 'm.gguf');
    writeFileSync(path, writeGguf({ metadata: [{ key: 'general.name', kind: 'str', value: 'm' }], tensors: [{ name: 'w', type: GGML.F32, shape: [2], data: packF32([4, 5]) }] }));
    const f = GgufFile.open(path);
    try {
      assert.equal(f.get('general.name', 'string'), 'm');
      assert.deepEqual([...f.readTensor(f.tensor('w')!)], [4, 5]);
    } finally {
      f.close();
    }
    assertFormat(() => GgufFile.open(join(dir, 'absent.gguf')), /cannot open .*absent\.gguf/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
