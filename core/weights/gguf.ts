// GGUF reading (the llama.cpp model format) in plain TypeScript: header, metadata, tensor infos, and tensors
// dequantized to float32 one at a time, so a file is never held whole in memory.
// Layout (little-endian, versions 2 and 3): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count
// entries {string key, u32 value type, value}; tensor_count infos {string name, u32 n_dims, u64 ne[n_dims],
// u32 ggml type, u64 offset}; then the data, starting at the next multiple of `general.alignment` (default 32),
// each tensor at data start + offset. A string is a u64 byte length and UTF-8 bytes; an array is a u32 element
// type, a u64 count and the elements. ne[0] is the fastest-varying dimension, so the row-major shape is ne reversed.
import { closeSync, fstatSync, openSync, readSync } from 'node:fs';
import { RlstreamError } from '../errors.ts';
import { ggmlType, READABLE_TYPES, type GgmlType } from './gguf-quants.ts';

export type GgufValue = number | bigint | boolean | string | GgufValue[];

export interface GgufTensorInfo {
  name: string;
  type: GgmlType;
  /** Row-major shape (ggml's ne reversed), as the tensor has in a Hugging Face checkpoint. */
  shape: number[];
  count: number;
  /** Absolute byte offset in the file. */
  offset: number;
  byteLength: number;
}

/** Where the bytes come from: a file (read on demand) or a buffer (tests). */
interface ByteSource {
  size: number;
  read(pos: number, len: number): Uint8Array;
  close(): void;
}

const MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
const DEFAULT_ALIGNMENT = 32;
const VALUE_TYPES = ['UINT8', 'INT8', 'UINT16', 'INT16', 'UINT32', 'INT32', 'FLOAT32', 'BOOL', 'STRING', 'ARRAY', 'UINT64', 'INT64', 'FLOAT64'] as const;
const FIXED_WIDTH: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const MAX_DIMS = 4; // GGML_MAX_DIMS

function fail(source: string, message: string): never {
  throw new RlstreamError('WEIGHTS_FORMAT', `${source}: ${message}`);
}

function fileSource(path: string): ByteSource {
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (err) {
    throw new RlstreamError('WEIGHTS_FORMAT', `cannot open ${path}: ${(err as Error).message}`, { cause: err });
  }
  const size = fstatSync(fd).size;
  return {
    size,
    read(pos, len) {
      const buf = new Uint8Array(len);
      let off = 0;
      while (off < len) {
        const n = readSync(fd, buf, off, Math.min(len - off, 1 << 30), pos + off);
        if (n <= 0) fail(path, `unexpected end of file at byte ${pos + off}`);
        off += n;
      }
      return buf;
    },
    close: () => closeSync(fd),
  };
}

function bufferSource(bytes: Uint8Array): ByteSource {
  return { size: bytes.byteLength, read: (pos, len) => bytes.subarray(pos, pos + len), close: () => undefined };
}

/** Sequential reads through a window of the source; every read is bounds-checked against the file size. */
class Cursor {
  pos = 0;
  private window: Uint8Array = new Uint8Array(0);
  private windowStart = 0;
  private view: DataView = new DataView(new ArrayBuffer(0));

  constructor(
    private readonly src: ByteSource,
    private readonly source: string,
  ) {}

  private take(n: number, what: string): number {
    if (this.pos + n > this.src.size)
      fail(this.source, `truncated: ${what} at byte ${this.pos} needs ${n} bytes, the file has ${this.src.size}`);
    if (this.pos < this.windowStart || this.pos + n > this.windowStart + this.window.byteLength) {
      this.windowStart = this.pos;
      this.window = this.src.read(this.pos, Math.min(Math.max(n, 1 << 20), this.src.size - this.pos));
      this.view = new DataView(this.window.buffer, this.window.byteOffset, this.window.byteLength);
    }
    const at = this.pos - this.windowStart;
    this.pos += n;
    return at;
  }

  u32(what: string): number {
    const at = this.take(4, what);
    return this.view.getUint32(at, true);
  }

  /** A u64 that must fit a JS number (counts, lengths, offsets). */
  size(what: string): number {
    const at = this.take(8, what);
    const v = this.view.getBigUint64(at, true);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) fail(this.source, `${what} at byte ${this.pos - 8} is ${v}, beyond any file`);
    return Number(v);
  }

  string(what: string): string {
    const len = this.size(`length of ${what}`);
    if (len > this.src.size - this.pos) fail(this.source, `truncated: ${what} at byte ${this.pos} claims ${len} bytes, the file has ${this.src.size}`);
    const at = this.take(len, what);
    return new TextDecoder('utf-8').decode(this.window.subarray(at, at + len));
  }

  value(type: number, what: string): GgufValue {
    // take() may move the window, so the view is read after it.
    const at = (n: number): number => this.take(n, what);
    switch (type) {
      case 0: { const i = at(1); return this.view.getUint8(i); }
      case 1: { const i = at(1); return this.view.getInt8(i); }
      case 2: { const i = at(2); return this.view.getUint16(i, true); }
      case 3: { const i = at(2); return this.view.getInt16(i, true); }
      case 4: { const i = at(4); return this.view.getUint32(i, true); }
      case 5: { const i = at(4); return this.view.getInt32(i, true); }
      case 6: { const i = at(4); return this.view.getFloat32(i, true); }
      case 7: { const i = at(1); return this.view.getUint8(i) !== 0; }
      case 8: return this.string(what);
      case 10: { const i = at(8); return safe(this.view.getBigUint64(i, true)); }
      case 11: { const i = at(8); return safe(this.view.getBigInt64(i, true)); }
      case 12: { const i = at(8); return this.view.getFloat64(i, true); }
      case 9: {
        const elemType = this.u32(`element type of ${what}`);
        const count = this.size(`length of ${what}`);
        if (elemType === 9) fail(this.source, `${what}: arrays of arrays are not supported`);
        if (VALUE_TYPES[elemType] === undefined) fail(this.source, `${what}: unknown array element type ${elemType}`);
        // A corrupt count must not allocate: every element takes at least one byte (a string at least eight).
        const minBytes = FIXED_WIDTH[elemType] ?? 8;
        if (count * minBytes > this.src.size - this.pos)
          fail(this.source, `truncated: ${what} at byte ${this.pos} claims ${count} elements, more than the file holds`);
        const out: GgufValue[] = new Array<GgufValue>(count);
        for (let i = 0; i < count; i++) out[i] = this.value(elemType, what);
        return out;
      }
      default:
        return fail(this.source, `${what}: unknown metadata value type ${type}`);
    }
  }
}

function safe(v: bigint): number | bigint {
  return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
}

/** An open GGUF file: metadata and tensor infos parsed; tensors read on demand. Close it when done. */
export class GgufFile {
  private constructor(
    readonly source: string,
    readonly version: number,
    readonly alignment: number,
    readonly metadata: ReadonlyMap<string, GgufValue>,
    readonly tensors: readonly GgufTensorInfo[],
    private readonly src: ByteSource,
  ) {}

  /** Opens and parses a GGUF file; throws WEIGHTS_FORMAT naming the file and what is wrong. */
  static open(path: string): GgufFile {
    const src = fileSource(path);
    try {
      return GgufFile.parse(src, path);
    } catch (err) {
      src.close();
      throw err;
    }
  }

  /** Parses GGUF bytes held in memory. */
  static fromBytes(bytes: Uint8Array, source = 'gguf'): GgufFile {
    return GgufFile.parse(bufferSource(bytes), source);
  }

  private static parse(src: ByteSource, source: string): GgufFile {
    if (src.size < 4) fail(source, `not a GGUF file: ${src.size} bytes is shorter than the magic`);
    const c = new Cursor(src, source);
    const magic = c.u32('magic');
    if (magic !== MAGIC) {
      const text = new TextDecoder('latin1').decode(new Uint8Array(new Uint32Array([magic]).buffer));
      fail(source, `not a GGUF file: it starts with ${JSON.stringify(text)} instead of "GGUF"`);
    }
    const version = c.u32('version');
    if (version !== 2 && version !== 3) fail(source, `GGUF version ${version} is not supported (2 and 3 are)`);
    const tensorCount = c.size('tensor count');
    const kvCount = c.size('metadata count');
    const metadata = new Map<string, GgufValue>();
    for (let i = 0; i < kvCount; i++) {
      const key = c.string(`metadata key ${i}`);
      const type = c.u32(`type of metadata ${key}`);
      metadata.set(key, c.value(type, `metadata ${key}`));
    }
    const alignValue = metadata.get('general.alignment') ?? DEFAULT_ALIGNMENT;
    if (typeof alignValue !== 'number' || !Number.isInteger(alignValue) || alignValue <= 0 || (alignValue & (alignValue - 1)) !== 0)
      fail(source, `general.alignment must be a power of two, got ${String(alignValue)}`);
    const raw: { name: string; type: GgmlType; shape: number[]; count: number; rel: number }[] = [];
    for (let i = 0; i < tensorCount; i++) {
      const name = c.string(`name of tensor ${i}`);
      const nDims = c.u32(`dimension count of tensor ${name}`);
      if (nDims < 1 || nDims > MAX_DIMS) fail(source, `tensor ${name} has ${nDims} dimensions (1 to ${MAX_DIMS} allowed)`);
      const ne: number[] = [];
      for (let d = 0; d < nDims; d++) ne.push(c.size(`dimension ${d} of tensor ${name}`));
      const typeId = c.u32(`type of tensor ${name}`);
      const type = ggmlType(typeId);
      if (!type) fail(source, `tensor ${name} has unknown ggml type ${typeId}`);
      const rel = c.size(`offset of tensor ${name}`);
      const count = ne.reduce((a, b) => a * b, 1);
      if (!Number.isSafeInteger(count)) fail(source, `tensor ${name} has ${ne.join(' x ')} elements, too many`);
      if (ne[0]! % type.blockSize !== 0)
        fail(source, `tensor ${name}: its rows of ${ne[0]} elements are not whole ${type.name} blocks of ${type.blockSize}`);
      raw.push({ name, type, shape: ne.reverse(), count, rel });
    }
    const dataStart = Math.ceil(c.pos / alignValue) * alignValue;
    const tensors: GgufTensorInfo[] = [];
    const names = new Set<string>();
    for (const t of raw) {
      if (names.has(t.name)) fail(source, `tensor ${t.name} appears twice`);
      names.add(t.name);
      if (t.rel % alignValue !== 0) fail(source, `tensor ${t.name}: offset ${t.rel} is not a multiple of the alignment ${alignValue}`);
      const byteLength = (t.count / t.type.blockSize) * t.type.blockBytes;
      const offset = dataStart + t.rel;
      if (offset + byteLength > src.size)
        fail(source, `truncated: tensor ${t.name} needs bytes ${offset} to ${offset + byteLength}, the file has ${src.size}`);
      tensors.push({ name: t.name, type: t.type, shape: t.shape, count: t.count, offset, byteLength });
    }
    return new GgufFile(source, version, alignValue, metadata, tensors, src);
  }

  tensor(name: string): GgufTensorInfo | undefined {
    return this.tensors.find((t) => t.name === name);
  }

  /** The tensor's values as float32, in row-major order of `info.shape`. */
  readTensor(info: GgufTensorInfo): Float32Array {
    const dq = info.type.dequantize;
    if (!dq)
      fail(this.source, `tensor ${info.name} has type ${info.type.name}, which cannot be dequantized here (readable: ${READABLE_TYPES.join(', ')})`);
    const out = new Float32Array(info.count);
    dq(this.src.read(info.offset, info.byteLength), out, info.count);
    return out;
  }

  /** A metadata value, or undefined; `expect` checks its JS type and throws WEIGHTS_FORMAT naming the key. */
  get(key: string, expect: 'number'): number | undefined;
  get(key: string, expect: 'string'): string | undefined;
  get(key: string, expect: 'boolean'): boolean | undefined;
  get(key: string, expect: 'array'): GgufValue[] | undefined;
  get(key: string, expect: 'number' | 'string' | 'boolean' | 'array'): GgufValue | undefined {
    const v = this.metadata.get(key);
    if (v === undefined) return undefined;
    const kind = Array.isArray(v) ? 'array' : typeof v;
    if (kind !== expect) fail(this.source, `metadata ${key} should be a ${expect}, it is a ${kind}`);
    return v;
  }

  close(): void {
    this.src.close();
  }
}
