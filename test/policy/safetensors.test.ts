// safetensors read/write: round trips, HF layout details (aligned header, sorted names), BF16/F16 decoding,
// sha256, and malformed files rejected with WEIGHTS_FORMAT.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { sha256File } from '../../core/weights/checksum.ts';
import { parseSafetensors, readSafetensors, serializeSafetensors, writeSafetensors, type TensorMap } from '../../core/weights/safetensors.ts';

const dir = await mkdtemp(join(tmpdir(), 'rlstream-st-'));
after(() => rm(dir, { recursive: true, force: true }));

/** Build a file by hand, the way the spec describes it, for dtypes the writer does not produce. */
function handmade(header: object, data: Uint8Array): Uint8Array {
  const json = Buffer.from(JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

test('write then read returns the same tensors, shapes and values', async () => {
  const tensors: TensorMap = new Map([
    ['model.norm.weight', { shape: [3], data: new Float32Array([1, -2.5, 3.25]) }],
    ['a.matrix', { shape: [2, 3], data: new Float32Array([0.1, 0.2, 0.3, -1e-30, 1e30, Math.PI]) }],
    ['scalar', { shape: [], data: new Float32Array([7]) }],
    ['empty', { shape: [0, 4], data: new Float32Array(0) }],
  ]);
  const path = join(dir, 'rt.safetensors');
  await writeSafetensors(path, tensors, { format: 'pt' });
  const back = await readSafetensors(path);
  assert.deepEqual([...back.keys()].sort(), [...tensors.keys()].sort());
  for (const [name, t] of tensors) {
    assert.deepEqual(back.get(name)!.shape, t.shape, name);
    assert.deepEqual(Array.from(back.get(name)!.data), Array.from(t.data), name);
  }
});

test('the header is padded to 8 bytes, names are sorted, offsets are contiguous, metadata is kept', () => {
  const bytes = serializeSafetensors(
    new Map([
      ['b', { shape: [1], data: new Float32Array([2]) }],
      ['a', { shape: [2], data: new Float32Array([0, 1]) }],
    ]),
    { format: 'pt' },
  );
  const n = Number(new DataView(bytes.buffer).getBigUint64(0, true));
  assert.equal((8 + n) % 8, 0);
  const header = JSON.parse(Buffer.from(bytes.subarray(8, 8 + n)).toString('utf8'));
  assert.deepEqual(Object.keys(header), ['__metadata__', 'a', 'b']);
  assert.deepEqual(header.a, { dtype: 'F32', shape: [2], data_offsets: [0, 8] });
  assert.deepEqual(header.b, { dtype: 'F32', shape: [1], data_offsets: [8, 12] });
  assert.equal(bytes.length, 8 + n + 12);
  assert.deepEqual(parseSafetensors(bytes).metadata, { format: 'pt' });
});

test('BF16 and F16 tensors are converted to F32, at an even and an odd byte offset in the buffer', () => {
  const data = new Uint8Array(14);
  const v = new DataView(data.buffer);
  [0x3f80, 0xc020].forEach((h, i) => v.setUint16(i * 2, h, true)); // bf16: 1, -2.5
  [0x3c00, 0x3800, 0xc000, 0x7bff, 0x0001].forEach((h, i) => v.setUint16(4 + i * 2, h, true)); // f16: 1, 0.5, -2, 65504, 2^-24
  // a header one byte longer moves the data to the other parity: the aligned (Uint16Array) and unaligned (DataView)
  // decoders both run
  const offsets = new Set<number>();
  for (const pad of ['', ' ']) {
    const file = handmade(
      {
        x: { dtype: 'BF16', shape: [2], data_offsets: [0, 4] },
        y: { dtype: 'F16', shape: [5], data_offsets: [4, 14] },
        ...(pad ? { __metadata__: { p: pad } } : {}),
      },
      data,
    );
    offsets.add((file.length - data.length) % 2);
    const { tensors } = parseSafetensors(file);
    assert.deepEqual(Array.from(tensors.get('x')!.data), [1, -2.5]);
    assert.deepEqual(Array.from(tensors.get('y')!.data), [1, 0.5, -2, 65504, 2 ** -24]);
  }
  assert.deepEqual([...offsets].sort(), [0, 1], 'both parities of the data offset were read');
});

test('sha256File matches the digest of the bytes', async () => {
  const path = join(dir, 'sum.safetensors');
  await writeSafetensors(path, new Map([['w', { shape: [4], data: new Float32Array([1, 2, 3, 4]) }]]));
  assert.equal(await sha256File(path), createHash('sha256').update(await readFile(path)).digest('hex'));
});

test('malformed files are rejected with WEIGHTS_FORMAT and a precise message', async () => {
  const good = serializeSafetensors(new Map([['w', { shape: [2], data: new Float32Array([1, 2]) }]]));
  const cases: [string, Uint8Array, RegExp][] = [
    ['too short', new Uint8Array(5), /shorter than the 8-byte header length/],
    ['header length past the end', (() => { const b = good.slice(); new DataView(b.buffer).setBigUint64(0, 1n << 40n, true); return b; })(), /exceeds the file size/],
    ['header not JSON', handmade({}, new Uint8Array()).fill(0x7b, 8), /not valid UTF-8 JSON/],
    ['unsupported dtype', handmade({ w: { dtype: 'I64', shape: [1], data_offsets: [0, 8] } }, new Uint8Array(8)), /unsupported dtype I64/],
    ['offsets past the data', handmade({ w: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } }, new Uint8Array(4)), /fall outside the 4 data bytes/],
    ['size disagrees with the shape', handmade({ w: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, new Uint8Array(8)), /needs 12/],
    ['missing fields', handmade({ w: { dtype: 'F32' } }, new Uint8Array(0)), /lacks dtype, shape or data_offsets/],
    ['truncated data', good.subarray(0, good.length - 3), /fall outside/],
  ];
  for (const [label, bytes, message] of cases) {
    const path = join(dir, `bad-${label.replaceAll(' ', '-')}.safetensors`);
    await writeFile(path, bytes);
    await assert.rejects(readSafetensors(path), (err: unknown) => isRlstreamError(err, 'WEIGHTS_FORMAT') && message.test(err.message), label);
  }
  await assert.rejects(readSafetensors(join(dir, 'missing.safetensors')), (err: unknown) => isRlstreamError(err, 'WEIGHTS_FORMAT'));
});
