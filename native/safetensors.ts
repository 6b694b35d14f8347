// safetensors reading and writing (8-byte little-endian header length, JSON header, raw little-endian tensors),
// streaming tensor by tensor so a model is never held twice in memory. F32 on write; F32, BF16, F16 on read.
import { fstatSync, openSync, readSync } from 'node:fs';
import { open, rename } from 'node:fs/promises';
import { RlstreamError } from '../core/errors.ts';

export interface TensorEntry {
  dtype: string;
  shape: number[];
  begin: number; // absolute byte offset in the file
  end: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, string>;
}

const DTYPE_BYTES: Record<string, number> = { F32: 4, BF16: 2, F16: 2, F64: 8, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1 };

function fail(path: string, msg: string): never {
  throw new RlstreamError('WEIGHTS_FORMAT', `${path}: ${msg}`);
}

export function readHeader(fd: number, path: string): SafetensorsHeader {
  const size = fstatSync(fd).size;
  if (size < 8) fail(path, `file of ${size} bytes is too short for a safetensors header`);
  const lenBuf = Buffer.alloc(8);
  readSync(fd, lenBuf, 0, 8, 0);
  const len = Number(lenBuf.readBigUInt64LE(0));
  if (len <= 0 || len > 100_000_000 || 8 + len > size) fail(path, `header length ${len} does not fit a file of ${size} bytes`);
  const hb = Buffer.alloc(len);
  readSync(fd, hb, 0, len, 8);
  let json: unknown;
  try {
    json = JSON.parse(hb.toString('utf8'));
  } catch (err) {
    fail(path, `header is not valid JSON (${(err as Error).message})`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) fail(path, 'header is not a JSON object');
  const dataStart = 8 + len;
  const tensors = new Map<string, TensorEntry>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      metadata = (raw ?? {}) as Record<string, string>;
      continue;
    }
    const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof e?.dtype !== 'string' || !Array.isArray(e.shape) || !Array.isArray(e.data_offsets) || e.data_offsets.length !== 2)
      fail(path, `tensor ${name}: malformed entry`);
    const [b, en] = e.data_offsets as number[];
    const shape = e.shape as number[];
    const numel = shape.reduce((a, d) => a * d, 1);
    const bytes = DTYPE_BYTES[e.dtype];
    if (bytes === undefined) fail(path, `tensor ${name}: unknown dtype ${e.dtype}`);
    if (typeof b !== 'number' || typeof en !== 'number' || en - b !== numel * bytes || dataStart + en > size)
      fail(path, `tensor ${name}: data_offsets [${b}, ${en}] do not match shape [${shape.join(', ')}] of ${e.dtype} within the file`);
    tensors.set(name, { dtype: e.dtype, shape, begin: dataStart + b, end: dataStart + en });
  }
  return { tensors, metadata };
}

/** Reads a tensor into `out` (float32), converting BF16/F16. */
export function readTensorInto(fd: number, path: string, name: string, e: TensorEntry, out: Float32Array): void {
  const numel = e.shape.reduce((a, d) => a * d, 1);
  if (numel !== out.length) fail(path, `tensor ${name}: ${numel} elements, expected ${out.length}`);
  const readAll = (buf: Uint8Array, pos: number): void => {
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, Math.min(buf.length - off, 1 << 30), pos + off);
      if (n <= 0) fail(path, `tensor ${name}: unexpected end of file`);
      off += n;
    }
  };
  if (e.dtype === 'F32') {
    readAll(new Uint8Array(out.buffer, out.byteOffset, out.byteLength), e.begin);
    return;
  }
  if (e.dtype !== 'BF16' && e.dtype !== 'F16') fail(path, `tensor ${name}: dtype ${e.dtype} is not supported (F32, BF16, F16)`);
  const raw = new Uint8Array(numel * 2);
  readAll(raw, e.begin);
  const h = new Uint16Array(raw.buffer, 0, numel);
  const u = new Uint32Array(out.buffer, out.byteOffset, numel);
  if (e.dtype === 'BF16') {
    for (let i = 0; i < numel; i++) u[i] = h[i]! << 16;
  } else {
    for (let i = 0; i < numel; i++) out[i] = halfToFloat(h[i]!);
  }
}

function halfToFloat(x: number): number {
  const s = x & 0x8000 ? -1 : 1;
  const e = (x >> 10) & 0x1f;
  const f = x & 0x3ff;
  if (e === 0) return s * f * 2 ** -24;
  if (e === 31) return f ? NaN : s * Infinity;
  return s * (1 + f / 1024) * 2 ** (e - 15);
}

/** Writes float32 tensors (in the given order) atomically: a temporary file renamed into place. Asynchronous, so
 * a large model does not block the event loop; the caller keeps the tensors unchanged until it settles. */
export async function writeSafetensors(
  path: string,
  tensors: Iterable<[string, { shape: number[]; data: Float32Array }]>,
  metadata: Record<string, string> = {},
  dtype: 'F32' | 'BF16' = 'F32',
): Promise<void> {
  const list = [...tensors];
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  const width = dtype === 'BF16' ? 2 : 4;
  let off = 0;
  for (const [name, t] of list) {
    header[name] = { dtype, shape: t.shape, data_offsets: [off, off + t.data.length * width] };
    off += t.data.length * width;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8); // data starts 8-byte aligned
  const hb = Buffer.from(json, 'utf8');
  const lenBuf = Buffer.alloc(8);
  lenBuf.writeBigUInt64LE(BigInt(hb.length));
  const tmp = `${path}.tmp-${process.pid}`;
  const fh = await open(tmp, 'w');
  try {
    await fh.write(lenBuf);
    await fh.write(hb);
    for (const [, t] of list) {
      const bytes = dtype === 'BF16' ? toBf16(t.data) : new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
      let w = 0;
      while (w < bytes.length) w += (await fh.write(bytes, w, Math.min(bytes.length - w, 1 << 30))).bytesWritten;
    }
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}

/** bf16 by round-to-nearest-even of the upper half of each float32 (NaN kept NaN). */
function toBf16(data: Float32Array): Uint8Array {
  const bits = new Uint32Array(data.buffer, data.byteOffset, data.length);
  const out = new Uint16Array(data.length);
  for (let i = 0; i < bits.length; i++) {
    const b = bits[i]!;
    out[i] = (b & 0x7fffffff) > 0x7f800000 ? (b >>> 16) | 0x40 : (b + 0x7fff + ((b >>> 16) & 1)) >>> 16;
  }
  return new Uint8Array(out.buffer);
}

export function openForRead(path: string): number {
  try {
    return openSync(path, 'r');
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `cannot open ${path}: ${(err as Error).message}`, { cause: err });
  }
}
