// safetensors, the weights format every policy version and checkpoint is written in: the one reader and writer.
// Layout: 8-byte little-endian header length N, N bytes of JSON header ({name: {dtype, shape, data_offsets}},
// optional "__metadata__"), then the raw little-endian tensor bytes. Reads F32, BF16 and F16 (converted to F32);
// writes F32 or BF16. Two ways to read: a whole buffer (parseSafetensors, readSafetensors) for the policy, and
// tensor by tensor from a file descriptor into memory the caller owns (readHeader, readTensorInto) for the
// native model, so a model is never held twice in memory. Writes are streamed to a temporary file renamed into
// place, so a reader never sees half a file.
import { fstatSync, openSync, readSync } from 'node:fs';
import { open, readFile, rename } from 'node:fs/promises';
import { RlstreamError } from '../errors.ts';

export interface Tensor {
  shape: number[];
  data: Float32Array;
}

export type TensorMap = Map<string, Tensor>;

/** One tensor of a header: `begin` and `end` are absolute byte offsets in the file. */
export interface TensorEntry {
  dtype: string;
  shape: number[];
  begin: number;
  end: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, TensorEntry>;
  metadata: Record<string, string>;
}

export type WriteDtype = 'F32' | 'BF16';

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
// Widths of the dtypes a header may name (for checking offsets); only F32, BF16 and F16 are decoded.
const DTYPE_BYTES: Record<string, number> = { F32: 4, BF16: 2, F16: 2, F64: 8, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1 };
const READABLE = new Set(['F32', 'BF16', 'F16']);
// A header bigger than this is not a model we can load; the bound stops a corrupt length from allocating GiBs.
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

function bad(source: string, message: string): RlstreamError {
  return new RlstreamError('WEIGHTS_FORMAT', `${source}: ${message}`);
}

function f16ToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 0x1f) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

function unsupported(source: string, name: string, dtype: string): RlstreamError {
  return bad(source, `tensor '${name}' has unsupported dtype ${dtype} (F32, BF16, F16 are read)`);
}

/** Decode `bytes` of `dtype` into `out` (float32). */
function decodeInto(dtype: string, bytes: Uint8Array, out: Float32Array): void {
  const n = out.length;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'F32' && LITTLE_ENDIAN) {
    // A byte copy also realigns data that is not 4-byte aligned in the file.
    new Uint8Array(out.buffer, out.byteOffset, out.byteLength).set(bytes);
  } else if (dtype === 'F32') {
    for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
  } else if (LITTLE_ENDIAN && bytes.byteOffset % 2 === 0) {
    // 2-byte aligned: a Uint16Array view reads each half twice as fast as DataView's getUint16 (a 7B bf16 model's
    // 15 GB are converted on every load)
    const u16 = new Uint16Array(bytes.buffer, bytes.byteOffset, n);
    if (dtype === 'BF16') {
      // bf16 is the top half of an f32: shift into place and reinterpret.
      const u32 = new Uint32Array(out.buffer, out.byteOffset, n);
      for (let i = 0; i < n; i++) u32[i] = u16[i]! << 16;
    } else {
      for (let i = 0; i < n; i++) out[i] = f16ToF32(u16[i]!);
    }
  } else if (dtype === 'BF16') {
    const u32 = new Uint32Array(out.buffer, out.byteOffset, n);
    for (let i = 0; i < n; i++) u32[i] = view.getUint16(i * 2, true) << 16;
  } else {
    for (let i = 0; i < n; i++) out[i] = f16ToF32(view.getUint16(i * 2, true));
  }
}

/** The header length from the first 8 bytes, checked against the file size. */
function headerLength(first8: Uint8Array, size: number, source: string): number {
  if (size < 8) throw bad(source, `file of ${size} bytes is shorter than the 8-byte header length`);
  const len = Number(new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true));
  if (len > MAX_HEADER_BYTES || 8 + len > size) throw bad(source, `header length ${len} exceeds the file size ${size}`);
  return len;
}

/** Parse and check the JSON header (`json` holds its bytes) of a file of `size` bytes. */
function parseHeader(json: Uint8Array, size: number, source: string): SafetensorsHeader {
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(json));
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `${source}: header is not valid UTF-8 JSON`, { cause: err });
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) throw bad(source, 'header is not a JSON object');
  const dataStart = 8 + json.byteLength;
  const dataLen = size - dataStart;
  const tensors = new Map<string, TensorEntry>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      metadata = (raw ?? {}) as Record<string, string>;
      continue;
    }
    const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown } | null;
    if (!e || typeof e.dtype !== 'string' || !Array.isArray(e.shape) || !Array.isArray(e.data_offsets) || e.data_offsets.length !== 2) {
      throw bad(source, `tensor '${name}' lacks dtype, shape or data_offsets`);
    }
    const width = DTYPE_BYTES[e.dtype];
    if (width === undefined) throw unsupported(source, name, e.dtype);
    const shape = e.shape as unknown[];
    if (!shape.every((d) => Number.isInteger(d) && (d as number) >= 0)) throw bad(source, `tensor '${name}' has an invalid shape ${JSON.stringify(shape)}`);
    const count = (shape as number[]).reduce((a, b) => a * b, 1);
    const [begin, end] = e.data_offsets as unknown[];
    if (!Number.isInteger(begin) || !Number.isInteger(end) || (begin as number) < 0 || (end as number) < (begin as number) || (end as number) > dataLen) {
      throw bad(source, `tensor '${name}' data_offsets [${String(begin)}, ${String(end)}] fall outside the ${dataLen} data bytes`);
    }
    if ((end as number) - (begin as number) !== count * width) {
      throw bad(source, `tensor '${name}' has ${(end as number) - (begin as number)} bytes but shape ${JSON.stringify(shape)} of ${e.dtype} needs ${count * width}`);
    }
    tensors.set(name, { dtype: e.dtype, shape: [...(shape as number[])], begin: dataStart + (begin as number), end: dataStart + (end as number) });
  }
  return { tensors, metadata };
}

// ---- whole buffers ---------------------------------------------------------------------------------------

/** Parse safetensors bytes into F32 tensors (in header order). Throws WEIGHTS_FORMAT on anything malformed. */
export function parseSafetensors(buf: Uint8Array, source = 'safetensors'): { tensors: TensorMap; metadata: Record<string, string> } {
  const len = headerLength(buf, buf.byteLength, source);
  const header = parseHeader(buf.subarray(8, 8 + len), buf.byteLength, source);
  const tensors: TensorMap = new Map();
  for (const [name, e] of header.tensors) {
    if (!READABLE.has(e.dtype)) throw unsupported(source, name, e.dtype);
    const data = new Float32Array(e.shape.reduce((a, b) => a * b, 1));
    decodeInto(e.dtype, buf.subarray(e.begin, e.end), data);
    tensors.set(name, { shape: e.shape, data });
  }
  return { tensors, metadata: header.metadata };
}

export async function readSafetensors(path: string): Promise<TensorMap> {
  let buf: Buffer;
  try {
    buf = await readFile(path);
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `cannot read weights file ${path}`, { cause: err });
  }
  return parseSafetensors(buf, path).tensors;
}

// ---- tensor by tensor from a file ------------------------------------------------------------------------

export function openForRead(path: string): number {
  try {
    return openSync(path, 'r');
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `cannot open ${path}: ${(err as Error).message}`, { cause: err });
  }
}

function readFully(fd: number, buf: Uint8Array, pos: number, source: string, what: string): void {
  let off = 0;
  while (off < buf.length) {
    const n = readSync(fd, buf, off, Math.min(buf.length - off, 1 << 30), pos + off);
    if (n <= 0) throw bad(source, `${what}: unexpected end of file`);
    off += n;
  }
}

/** The header of an open file; tensors are then read one at a time with readTensorInto. */
export function readHeader(fd: number, path: string): SafetensorsHeader {
  const size = fstatSync(fd).size;
  const first8 = new Uint8Array(8);
  if (size >= 8) readFully(fd, first8, 0, path, 'header length');
  const len = headerLength(first8, size, path);
  const json = new Uint8Array(len);
  readFully(fd, json, 8, path, 'header');
  return parseHeader(json, size, path);
}

/** Reads one tensor into `out` (float32, the caller's memory), converting BF16 / F16. */
export function readTensorInto(fd: number, path: string, name: string, e: TensorEntry, out: Float32Array): void {
  const numel = e.shape.reduce((a, d) => a * d, 1);
  if (numel !== out.length) throw bad(path, `tensor ${name}: ${numel} elements, expected ${out.length}`);
  if (!READABLE.has(e.dtype)) throw unsupported(path, name, e.dtype);
  if (e.dtype === 'F32' && LITTLE_ENDIAN) {
    readFully(fd, new Uint8Array(out.buffer, out.byteOffset, out.byteLength), e.begin, path, `tensor ${name}`);
    return;
  }
  const raw = new Uint8Array(e.end - e.begin);
  readFully(fd, raw, e.begin, path, `tensor ${name}`);
  decodeInto(e.dtype, raw, out);
}

// ---- writing ---------------------------------------------------------------------------------------------

/** bf16 by round-to-nearest-even of the upper half of each float32 (NaN kept NaN). */
function toBf16(data: Float32Array): Uint8Array {
  const out = new Uint8Array(data.length * 2);
  const bitsOf = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const v = new DataView(out.buffer);
  for (let i = 0; i < data.length; i++) {
    const b = bitsOf.getUint32(i * 4, LITTLE_ENDIAN);
    v.setUint16(i * 2, (b & 0x7fffffff) > 0x7f800000 ? (b >>> 16) | 0x40 : ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff, true);
  }
  return out;
}

/** The tensor's data as little-endian bytes of `dtype`. */
function tensorBytes(data: Float32Array, dtype: WriteDtype): Uint8Array {
  if (dtype === 'BF16') return toBf16(data);
  if (LITTLE_ENDIAN) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const out = new Uint8Array(data.byteLength);
  const v = new DataView(out.buffer);
  for (let i = 0; i < data.length; i++) v.setFloat32(i * 4, data[i]!, true);
  return out;
}

/**
 * The 8-byte length and the JSON header of a file holding `tensors` (names sorted, as the Python library writes
 * them; the header padded with spaces so the data starts 8-byte aligned, as HF's writer does).
 */
function layout(tensors: Iterable<[string, Tensor]>, metadata: Record<string, string>, dtype: WriteDtype): { head: Uint8Array; list: [string, Tensor][]; dataBytes: number } {
  const list = [...tensors].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const width = dtype === 'BF16' ? 2 : 4;
  const header: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) header['__metadata__'] = metadata;
  let offset = 0;
  for (const [name, t] of list) {
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) throw bad('serialize', `tensor '${name}' has ${t.data.length} values but shape ${JSON.stringify(t.shape)}`);
    header[name] = { dtype, shape: t.shape, data_offsets: [offset, offset + count * width] };
    offset += count * width;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (json.length % 8)) % 8;
  if (pad) json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const head = new Uint8Array(8 + json.length);
  new DataView(head.buffer).setBigUint64(0, BigInt(json.length), true);
  head.set(json, 8);
  return { head, list, dataBytes: offset };
}

/** Encode tensors as safetensors bytes in memory. */
export function serializeSafetensors(tensors: Iterable<[string, Tensor]>, metadata: Record<string, string> = {}, dtype: WriteDtype = 'F32'): Uint8Array {
  const { head, list, dataBytes } = layout(tensors, metadata, dtype);
  const out = new Uint8Array(head.length + dataBytes);
  out.set(head, 0);
  let at = head.length;
  for (const [, t] of list) {
    const bytes = tensorBytes(t.data, dtype);
    out.set(bytes, at);
    at += bytes.length;
  }
  return out;
}

/**
 * Write tensors to `path`, streamed tensor by tensor into a temporary file that is renamed into place.
 * Asynchronous, so a large model does not block the event loop; the caller keeps the tensors unchanged until it
 * settles.
 */
export async function writeSafetensors(path: string, tensors: Iterable<[string, Tensor]>, metadata: Record<string, string> = {}, dtype: WriteDtype = 'F32'): Promise<void> {
  const { head, list } = layout(tensors, metadata, dtype);
  const tmp = `${path}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`;
  const fh = await open(tmp, 'w');
  try {
    await fh.write(head);
    for (const [, t] of list) {
      const bytes = tensorBytes(t.data, dtype);
      let w = 0;
      while (w < bytes.length) w += (await fh.write(bytes, w, Math.min(bytes.length - w, 1 << 30))).bytesWritten;
    }
  } finally {
    await fh.close();
  }
  await rename(tmp, path);
}
