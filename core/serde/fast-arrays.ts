// Fast Avro codecs for the big numeric arrays of the hot events (token ids, masks, log-probs, advantages,
// per-token policy versions): array<int>, array<long> and array<float>. avsc walks such arrays item by item
// through a Tap (a method call and a bounds-checked Buffer write per item); these write and read the whole
// array in one loop. The bytes are exactly avsc's (one block of n items, then a 0 terminator; zig-zag
// varints; IEEE-754 little-endian floats), which test/serde/fast-arrays.test.ts checks on the fixtures and on
// random values. Plugged in through avsc's documented typeHook, so records, unions, defaults, validation
// (isValid) and schema resolution stay avsc's own.
import avro from 'avsc';
import { endianness } from 'node:os';

/** The parts of avsc's Tap these codecs use (avsc's own buffer cursor; pos past the end means "too small"). */
interface Tap {
  buf: Buffer;
  pos: number;
  readLong(): number;
  writeLong(n: number): void;
  skipLong(): void;
}

type ArrayTypeCtor = new (schema: avro.Schema, opts: avro.ForSchemaOptions) => avro.types.ArrayType;
const ArrayType = avro.types.ArrayType as unknown as ArrayTypeCtor;
const base = avro.types.ArrayType.prototype as unknown as {
  _read(this: unknown, tap: Tap): unknown[];
  _write(this: unknown, tap: Tap, v: unknown): void;
  _update(this: unknown, resolver: unknown, writer: avro.Type, opts: unknown): void;
  _check(this: unknown, val: unknown, flags: unknown, hook: unknown, path: unknown): boolean;
};
const baseUpdate = base._update;
const baseCheck = base._check;

// Float arrays go through an aligned scratch Float32Array so the double→float conversion and the byte copy
// are done natively; that gives the wire's little-endian layout only on little-endian hosts.
const LITTLE_ENDIAN = endianness() === 'LE';
let scratch = new Float32Array(1024);
let scratchBytes = new Uint8Array(scratch.buffer);

function scratchFor(n: number): void {
  if (scratch.length >= n) return;
  let size = scratch.length;
  while (size < n) size *= 2;
  scratch = new Float32Array(size);
  scratchBytes = new Uint8Array(scratch.buffer);
}

function invalid(val: unknown, type: unknown): never {
  // avsc's message shape, so errors read the same with or without the fast path.
  throw new Error(`invalid ${JSON.stringify((type as avro.Type).schema())}: ${JSON.stringify(val)}`);
}

// avsc's own bound for JS-number longs (one below 2^53 − 1, so zig-zag doubling stays exact).
const SAFE_LONG = 9007199254740990;

/** Whether an item is valid for the array's item type (avsc's own checks for int and long). */
function validItem(v: number, long: boolean): boolean {
  return long ? typeof v === 'number' && v % 1 === 0 && v >= -SAFE_LONG && v <= SAFE_LONG : v === (v | 0);
}

/** Bytes of the zig-zag varint of a valid item. */
function varintSize(v: number): number {
  if (v >= -1073741824 && v < 1073741824) {
    const m = v >= 0 ? v << 1 : (~v << 1) | 1;
    return m < 0x80 ? 1 : m < 0x4000 ? 2 : m < 0x200000 ? 3 : m < 0x10000000 ? 4 : 5;
  }
  let f = v >= 0 ? v * 2 : -v * 2 - 1;
  let n = 1;
  while (f >= 128) {
    f = Math.floor(f / 128);
    n++;
  }
  return n;
}

/**
 * Zig-zag varints, validated and written in one pass (an invalid item throws; what was written before it
 * does not matter since the encode fails). When the worst case (5 bytes an int, 10 a long) may not fit, the
 * exact size is computed first: if it does not fit either, the tap's position is advanced past the end by
 * exactly the bytes missing, which is avsc's overflow contract (its toBuffer allocates that size and writes
 * again).
 */
function writeVarints(tap: Tap, val: readonly number[], long: boolean, type: unknown): void {
  const n = val.length;
  if (n > 0) tap.writeLong(n);
  const buf = tap.buf;
  let pos = tap.pos;
  if (pos + n * (long ? 10 : 5) + 1 > buf.length) {
    let size = 1;
    for (let i = 0; i < n; i++) {
      const v = val[i]!;
      if (!validItem(v, long)) invalid(v, type);
      size += varintSize(v);
    }
    if (pos + size > buf.length) {
      tap.pos = pos + size;
      return;
    }
  }
  for (let i = 0; i < n; i++) {
    const v = val[i]!;
    if (v === (v | 0) && v >= -1073741824 && v < 1073741824) {
      // |v| < 2^30: the zig-zag value fits 31 bits, integer arithmetic is exact (most token ids take 1–2 bytes).
      let m = v >= 0 ? v << 1 : (~v << 1) | 1;
      while (m > 0x7f) {
        buf[pos++] = (m & 0x7f) | 0x80;
        m >>>= 7;
      }
      buf[pos++] = m;
      continue;
    }
    if (!validItem(v, long)) invalid(v, type);
    let f = v >= 0 ? v * 2 : -v * 2 - 1;
    while (f >= 128) {
      buf[pos++] = (f % 128) | 0x80;
      f = Math.floor(f / 128);
    }
    buf[pos++] = f;
  }
  buf[pos++] = 0;
  tap.pos = pos;
}

/**
 * The item count of the array block at the tap (0 ends the array). Avro lets a writer give a negative count
 * followed by the block's size in bytes, so a reader can skip the block; the items are read here either way.
 */
function blockCount(tap: Tap): number {
  const n = tap.readLong();
  if (n >= 0) return n;
  tap.skipLong();
  return -n;
}

/**
 * Reads an array's blocks into one array. readItems reads the n items of a block starting at pos into out from
 * index i and returns the position after them; a position past the end stops the read there, which is avsc's
 * "truncated" signal to the caller.
 */
function readBlocks(
  tap: Tap,
  minItemBytes: number,
  readItems: (buf: Buffer, pos: number, n: number, out: number[], i: number) => number,
): number[] {
  const buf = tap.buf;
  let out: number[] | undefined;
  let i = 0;
  for (;;) {
    const n = blockCount(tap);
    if (n === 0) break;
    if (n * minItemBytes > buf.length - tap.pos) {
      // A count beyond what the bytes left can hold is a truncated (or corrupt) record: no array of that size.
      tap.pos = buf.length + 1;
      break;
    }
    if (!out) out = new Array<number>(n);
    tap.pos = readItems(buf, tap.pos, n, out, i);
    i += n;
    if (tap.pos > buf.length) break;
  }
  return out ?? [];
}

/** n zig-zag varints from pos; stops past the end of buf on a truncated block. */
function varintItems(buf: Buffer, pos: number, n: number, out: number[], i: number): number {
  const end = buf.length;
  for (let k = 0; k < n; k++) {
    let b = buf[pos++]!;
    if (b < 0x80) {
      out[i++] = (b >>> 1) ^ -(b & 1);
      continue;
    }
    let m = b & 0x7f;
    let shift = 7;
    do {
      b = buf[pos++]!;
      m |= (b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80 && shift < 28);
    if (b & 0x80) {
      // Beyond 28 bits: float arithmetic, as avsc does, so longs up to 2^53 decode exactly.
      let f = m >>> 0;
      let scale = 268435456;
      do {
        b = buf[pos++]!;
        f += (b & 0x7f) * scale;
        scale *= 128;
      } while (b & 0x80 && pos <= end);
      out[i++] = (f % 2 ? -(f + 1) : f) / 2;
    } else {
      out[i++] = (m >>> 1) ^ -(m & 1);
    }
    if (pos > end) break;
  }
  return pos;
}

/** Reads blocks of zig-zag varints (every item takes at least one byte). */
function readVarints(tap: Tap): number[] {
  return readBlocks(tap, 1, varintItems);
}

/** Typed arrays an array<float> field may be given as (written like the same numbers in a plain array). */
export type FloatTypedArray = Float32Array | Float64Array;

function isFloatTypedArray(val: unknown): val is FloatTypedArray {
  return val instanceof Float32Array || val instanceof Float64Array;
}

function writeFloats(tap: Tap, val: readonly number[] | FloatTypedArray, type: unknown): void {
  const n = val.length;
  scratchFor(n);
  const f32 = scratch;
  if (isFloatTypedArray(val)) {
    // Every item is a number: the rounding to float32 is done natively, as the element-wise stores below do it.
    f32.set(val);
  } else {
    for (let i = 0; i < n; i++) {
      const v = val[i]!;
      if (typeof v !== 'number') invalid(v, type);
      f32[i] = v;
    }
  }
  if (n > 0) tap.writeLong(n);
  const buf = tap.buf;
  const pos = tap.pos;
  if (pos + n * 4 + 1 > buf.length) {
    // Overflow contract: advance as if written; the caller grows the buffer and encodes again.
    tap.pos = pos + n * 4 + 1;
    return;
  }
  buf.set(scratchBytes.subarray(0, n * 4), pos);
  buf[pos + n * 4] = 0;
  tap.pos = pos + n * 4 + 1;
}

/** n little-endian float32s from pos, converted natively through the scratch array. */
function floatItems(buf: Buffer, pos: number, n: number, out: number[], i: number): number {
  scratchFor(n);
  scratchBytes.set(buf.subarray(pos, pos + n * 4));
  for (let k = 0; k < n; k++) out[i++] = scratch[k]!;
  return pos + n * 4;
}

function readFloats(tap: Tap): number[] {
  return readBlocks(tap, 4, floatItems);
}

// When avsc resolves an older writer schema it calls the reader type's _read with `this` set to a resolver
// (whose items may be promoted, e.g. int → float); only a direct call on our own type takes the fast path.
class FastIntArrayType extends ArrayType {
  /** Resolving an older writer: int and long share the varint encoding, so long ← int stays fast too. */
  _update(resolver: { _read?: unknown }, writer: avro.Type, opts: unknown): void {
    baseUpdate.call(this, resolver, writer, opts);
    const w = writer instanceof FastIntArrayType ? (writer.itemsType as avro.Type).typeName : '';
    const r = (this.itemsType as avro.Type).typeName;
    if (w === r || (w === 'int' && r === 'long')) resolver._read = readVarints;
  }
  _write(tap: Tap, val: unknown): void {
    if (!Array.isArray(val)) return base._write.call(this, tap, val);
    writeVarints(tap, val as number[], false, this);
  }
  _read(tap: Tap): unknown[] {
    if (!(this instanceof FastIntArrayType)) return base._read.call(this, tap);
    return readVarints(tap);
  }
}

/** array<long>: the same varints, checked as safe longs (a subclass, since avsc freezes its type objects). */
class FastLongArrayType extends FastIntArrayType {
  override _write(tap: Tap, val: unknown): void {
    if (!Array.isArray(val)) return base._write.call(this, tap, val);
    writeVarints(tap, val as number[], true, this);
  }
}

/**
 * array<float>; besides plain arrays it takes a Float32Array or Float64Array (see Encodable in ./events.ts):
 * values computed in a typed array, such as advantages, are written without a copy into a plain array first.
 */
class FastFloatArrayType extends ArrayType {
  _update(resolver: { _read?: unknown }, writer: avro.Type, opts: unknown): void {
    baseUpdate.call(this, resolver, writer, opts);
    if (writer instanceof FastFloatArrayType) resolver._read = readFloats;
  }
  _check(val: unknown, flags: unknown, hook: unknown, path: unknown): boolean {
    return isFloatTypedArray(val) || baseCheck.call(this, val, flags, hook, path);
  }
  _write(tap: Tap, val: unknown): void {
    if (Array.isArray(val) || isFloatTypedArray(val)) return writeFloats(tap, val as number[] | FloatTypedArray, this);
    base._write.call(this, tap, val);
  }
  _read(tap: Tap): unknown[] {
    if (!(this instanceof FastFloatArrayType)) return base._read.call(this, tap);
    return readFloats(tap);
  }
}

function itemsName(schema: unknown): string | undefined {
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) return undefined;
  const s = schema as { type?: unknown; items?: unknown; logicalType?: unknown };
  if (s.type !== 'array' || s.logicalType !== undefined) return undefined;
  const items = s.items;
  if (typeof items === 'string') return items;
  if (typeof items === 'object' && items !== null && !Array.isArray(items)) {
    const i = items as { type?: unknown; logicalType?: unknown };
    if (typeof i.type === 'string' && i.logicalType === undefined && Object.keys(i).every((k) => k === 'type')) return i.type;
  }
  return undefined;
}

/** avsc typeHook: fast codecs for array<int>, array<long> and array<float>; avsc's own types otherwise. */
function fastArrayTypeHook(schema: avro.Schema, opts: avro.ForSchemaOptions): avro.Type | undefined {
  const items = itemsName(schema);
  if (items === 'int') return new FastIntArrayType(schema, opts) as unknown as avro.Type;
  if (items === 'long') return new FastLongArrayType(schema, opts) as unknown as avro.Type;
  if (items === 'float' && LITTLE_ENDIAN) return new FastFloatArrayType(schema, opts) as unknown as avro.Type;
  return undefined;
}

/** An avsc Type for a schema, with the fast array codecs. */
export function fastType(schema: avro.Schema): avro.Type {
  return avro.Type.forSchema(schema, { wrapUnions: false, typeHook: fastArrayTypeHook });
}
