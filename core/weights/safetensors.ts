// safetensors read/write in plain TypeScript: the weights format every policy version is published in.
// Layout: 8-byte little-endian header length N, N bytes of JSON header ({name: {dtype, shape, data_offsets}},
// optional "__metadata__"), then the raw tensor bytes. Reads F32, BF16 and F16 (converted to F32); writes F32.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { RlstreamError } from '../errors.ts';

export interface Tensor {
  shape: number[];
  data: Float32Array;
}

export type TensorMap = Map<string, Tensor>;

interface HeaderEntry {
  dtype: string;
  shape: number[];
  data_offsets: [number, number];
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const BYTES: Record<string, number> = { F32: 4, BF16: 2, F16: 2 };
// A header bigger than this is not a model we can load; the bound stops a corrupt length from allocating GiBs.
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

function bad(message: string, source: string): RlstreamError {
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

function decode(dtype: string, bytes: Uint8Array, count: number): Float32Array {
  const out = new Float32Array(count);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === 'F32' && LITTLE_ENDIAN) {
    new Uint8Array(out.buffer).set(bytes); // a copy also realigns data that is not 4-byte aligned in the file
  } else if (dtype === 'F32') {
    for (let i = 0; i < count; i++) out[i] = view.getFloat32(i * 4, true);
  } else if (dtype === 'BF16') {
    // bf16 is the top half of an f32: shift into place and reinterpret.
    const u32 = new Uint32Array(out.buffer);
    for (let i = 0; i < count; i++) u32[i] = view.getUint16(i * 2, true) << 16;
  } else {
    for (let i = 0; i < count; i++) out[i] = f16ToF32(view.getUint16(i * 2, true));
  }
  return out;
}

/** Parse safetensors bytes into F32 tensors (in header order). Throws WEIGHTS_FORMAT on anything malformed. */
export function parseSafetensors(buf: Uint8Array, source = 'safetensors'): { tensors: TensorMap; metadata: Record<string, string> } {
  if (buf.byteLength < 8) throw bad(`file of ${buf.byteLength} bytes is shorter than the 8-byte header length`, source);
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const headerLen = Number(view.getBigUint64(0, true));
  if (headerLen > MAX_HEADER_BYTES || 8 + headerLen > buf.byteLength) {
    throw bad(`header length ${headerLen} exceeds the file size ${buf.byteLength}`, source);
  }
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(buf.subarray(8, 8 + headerLen)));
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `${source}: header is not valid UTF-8 JSON`, { cause: err });
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) throw bad('header is not a JSON object', source);
  const dataStart = 8 + headerLen;
  const dataLen = buf.byteLength - dataStart;
  const tensors: TensorMap = new Map();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === '__metadata__') {
      metadata = (raw ?? {}) as Record<string, string>;
      continue;
    }
    const e = raw as Partial<HeaderEntry> | null;
    if (!e || typeof e.dtype !== 'string' || !Array.isArray(e.shape) || !Array.isArray(e.data_offsets) || e.data_offsets.length !== 2) {
      throw bad(`tensor '${name}' lacks dtype, shape or data_offsets`, source);
    }
    const width = BYTES[e.dtype];
    if (width === undefined) throw bad(`tensor '${name}' has unsupported dtype ${e.dtype} (F32, BF16, F16 are read)`, source);
    if (!e.shape.every((d) => Number.isInteger(d) && d >= 0)) throw bad(`tensor '${name}' has an invalid shape ${JSON.stringify(e.shape)}`, source);
    const count = e.shape.reduce((a, b) => a * b, 1);
    const [begin, end] = e.data_offsets;
    if (!Number.isInteger(begin) || !Number.isInteger(end) || begin < 0 || end < begin || end > dataLen) {
      throw bad(`tensor '${name}' data_offsets [${begin}, ${end}] fall outside the ${dataLen} data bytes`, source);
    }
    if (end - begin !== count * width) {
      throw bad(`tensor '${name}' has ${end - begin} bytes but shape ${JSON.stringify(e.shape)} of ${e.dtype} needs ${count * width}`, source);
    }
    tensors.set(name, { shape: [...e.shape], data: decode(e.dtype, buf.subarray(dataStart + begin, dataStart + end), count) });
  }
  return { tensors, metadata };
}

/** Encode F32 tensors as safetensors bytes (names sorted, as the Python library writes them). */
export function serializeSafetensors(tensors: TensorMap, metadata?: Record<string, string>): Uint8Array {
  const names = [...tensors.keys()].sort();
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) header['__metadata__'] = metadata;
  let offset = 0;
  for (const name of names) {
    const t = tensors.get(name)!;
    const count = t.shape.reduce((a, b) => a * b, 1);
    if (count !== t.data.length) throw bad(`tensor '${name}' has ${t.data.length} values but shape ${JSON.stringify(t.shape)}`, 'serialize');
    header[name] = { dtype: 'F32', shape: t.shape, data_offsets: [offset, offset + count * 4] };
    offset += count * 4;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  // Pad the header with spaces to a multiple of 8 so the data starts aligned (what HF's writer does).
  const pad = (8 - (json.length % 8)) % 8;
  if (pad) json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const out = new Uint8Array(8 + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  let at = 8 + json.length;
  for (const name of names) {
    const t = tensors.get(name)!;
    if (LITTLE_ENDIAN) out.set(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength), at);
    else {
      const v = new DataView(out.buffer, at, t.data.byteLength);
      for (let i = 0; i < t.data.length; i++) v.setFloat32(i * 4, t.data[i]!, true);
    }
    at += t.data.byteLength;
  }
  return out;
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

export async function writeSafetensors(path: string, tensors: TensorMap, metadata?: Record<string, string>): Promise<void> {
  await writeFile(path, serializeSafetensors(tensors, metadata));
}

/** sha256 of a file, lower-case hex (the PolicyVersion checksum). Streams, so big files do not sit in memory. */
export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}
