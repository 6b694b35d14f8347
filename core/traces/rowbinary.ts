// Rows → ClickHouse RowBinary, compiled per table from its columns (DESCRIBE TABLE). The bulk insert format of
// both stores: no text to parse on the engine side and no JSON to build here; token, log-prob and mask arrays
// become packed little-endian numbers (≈ 4 bytes per token instead of ≈ 10–20 characters of JSON).
// Value rules match what JSONEachRow did with the same rows, so the two paths store the same thing:
// times are epoch ms (DateTime64(3) as ms ticks, DateTime as whole seconds), a missing/null value or a
// non-finite number (JSON null) becomes NULL in a Nullable column and the type's default elsewhere, booleans
// are 1/0. A type this encoder does not know makes compile return null: the store then keeps JSONEachRow.
//
// Speed (the sink's insert path spends most of its CPU here): one growing buffer written through a DataView,
// numeric arrays encoded by one loop per array with a fast path for plain numbers (anything else takes the
// scalar rules above), 64-bit integers as two 32-bit halves instead of BigInt, ASCII strings copied by hand,
// and a row function generated per table so every column is read with a constant property name (a keyed
// read with a varying name is megamorphic and costs more than encoding the value).
import { RlstreamError } from '../errors.ts';
import { keyChecker, type ColumnCache, type ColumnSpec } from './columns.ts';
import type { Row } from './store.ts';

export type { ColumnSpec } from './columns.ts';

/**
 * Buffer's own UTF-8 writer, without Buffer.prototype.write's argument handling (which cost as much as the
 * copy for the ids and texts here). Not part of Node's documented API, so write() stands in if it is gone.
 */
type Utf8Write = (this: Buffer, s: string, offset: number, maxLength: number) => number;
const nodeUtf8Write = (Buffer.prototype as unknown as { utf8Write?: Utf8Write }).utf8Write;
const utf8Write: Utf8Write =
  typeof nodeUtf8Write === 'function'
    ? nodeUtf8Write
    : function (this: Buffer, s: string, offset: number, maxLength: number) {
        return this.write(s, offset, maxLength, 'utf8');
      };

const TWO_32 = 4294967296;
const TWO_63 = 9223372036854775808;

/**
 * A growing RowBinary payload: rows are appended one at a time (the trace writer encodes each row as it
 * arrives, while its values are still in cache) and the bytes are handed to an INSERT as they are.
 */
export class RowBinaryBuffer {
  buf: Buffer;
  view: DataView;
  pos = 0;
  /** Rows appended since the last reset. */
  rows = 0;

  constructor(capacity = 1 << 20) {
    this.buf = Buffer.allocUnsafe(capacity);
    this.view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.length);
  }

  get bytes(): number {
    return this.pos;
  }

  /** The encoded rows (a view: valid until the next append or reset). */
  payload(): Buffer {
    return this.buf.subarray(0, this.pos);
  }

  reset(): void {
    this.pos = 0;
    this.rows = 0;
  }

  /** Appends another buffer's rows (encoded with the same codec). */
  appendFrom(other: RowBinaryBuffer): void {
    this.ensure(other.pos);
    other.buf.copy(this.buf, this.pos, 0, other.pos);
    this.pos += other.pos;
    this.rows += other.rows;
  }

  ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = Buffer.allocUnsafe(size);
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
    this.view = new DataView(next.buffer, next.byteOffset, next.length);
  }

  /** Caller ensured 10 bytes. */
  varuint(n: number): void {
    while (n >= 0x80) {
      this.buf[this.pos++] = (n & 0x7f) | 0x80;
      n = Math.floor(n / 128);
    }
    this.buf[this.pos++] = n;
  }

  /** Caller ensured 8 bytes. A safe integer, or any double with |n| < 2^63 (as BigInt(n) would write it). */
  int64(n: number): void {
    if ((n | 0) === n) {
      this.view.setInt32(this.pos, n, true);
      this.view.setInt32(this.pos + 4, n >> 31, true);
    } else {
      const hi = Math.floor(n / TWO_32);
      this.view.setUint32(this.pos, n - hi * TWO_32, true);
      this.view.setInt32(this.pos + 4, hi, true);
    }
    this.pos += 8;
  }

  string(s: string): void {
    const len = s.length;
    if (len <= 16) {
      // Short ASCII (roles, names, splits): copied by hand, cheaper than a call into the UTF-8 encoder.
      this.ensure(1 + len);
      const buf = this.buf;
      const start = this.pos + 1;
      let i = 0;
      for (; i < len; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) break;
        buf[start + i] = c;
      }
      if (i === len) {
        buf[this.pos] = len;
        this.pos = start + len;
        return;
      }
    }
    if (len < 43) {
      // At most 3 bytes per UTF-16 unit: under 128 bytes, so a 1-byte length goes in front, written after.
      this.ensure(1 + 3 * len);
      const n = utf8Write.call(this.buf, s, this.pos + 1, 3 * len);
      this.buf[this.pos] = n;
      this.pos += 1 + n;
      return;
    }
    const n = Buffer.byteLength(s, 'utf8');
    this.ensure(10 + n);
    this.varuint(n);
    this.pos += utf8Write.call(this.buf, s, this.pos, n);
  }
}

type Writer = RowBinaryBuffer;

type Encode = (w: Writer, v: unknown) => void;

class ValueError extends Error {}

/** A number from a JSON-able value, or null where JSON would have carried null. */
function num(v: unknown): number | null {
  if (typeof v === 'number') return Number.isFinite(v) ? v : null;
  if (typeof v === 'boolean') return v ? 1 : 0;
  if (typeof v === 'bigint') return Number(v);
  if (typeof v === 'string' && v.trim() !== '') {
    const n = Number(v);
    if (Number.isFinite(n)) return n;
  }
  if (v === null || v === undefined) return null;
  throw new ValueError(`expects a number, got ${JSON.stringify(v)?.slice(0, 80)}`);
}

/** An integer column's value (the type's default for null), or a ValueError naming the range. */
function intValue(v: unknown, lo: number, hi: number): number {
  const n = typeof v === 'number' && Number.isInteger(v) ? v : (num(v) ?? 0);
  if (!Number.isInteger(n) || n < lo || n > hi) throw new ValueError(`expects an integer in [${lo}, ${hi}], got ${n}`);
  return n;
}

interface Scalar {
  /** Most bytes one value takes (arrays reserve length × this up front); 0 for variable-length. */
  width: number;
  /** Writes one value; the caller ensured `width` bytes when width > 0. */
  put: Encode;
}

function intScalar(lo: number, hi: number, bytes: 1 | 2 | 4): Scalar {
  const put: Encode =
    bytes === 1
      ? (w, v) => {
          w.buf[w.pos++] = intValue(v, lo, hi) & 0xff;
        }
      : bytes === 2
        ? (w, v) => {
            w.view.setUint16(w.pos, intValue(v, lo, hi) & 0xffff, true);
            w.pos += 2;
          }
        : lo < 0
          ? (w, v) => {
              w.view.setInt32(w.pos, intValue(v, lo, hi), true);
              w.pos += 4;
            }
          : (w, v) => {
              w.view.setUint32(w.pos, intValue(v, lo, hi), true);
              w.pos += 4;
            };
  return { width: bytes, put };
}

function int64Scalar(signed: boolean): Scalar {
  return {
    width: 8,
    put: (w, v) => {
      if (typeof v === 'bigint') {
        if (!signed && v < 0n) throw new ValueError(`expects an unsigned integer, got ${v}`);
        if (signed) w.view.setBigInt64(w.pos, BigInt.asIntN(64, v) === v ? v : outOfRange(v), true);
        else w.view.setBigUint64(w.pos, BigInt.asUintN(64, v) === v ? v : outOfRange(v), true);
        w.pos += 8;
        return;
      }
      const n = Math.trunc(num(v) ?? 0) + 0;
      if (!signed && n < 0) throw new ValueError(`expects an unsigned integer, got ${n}`);
      if (signed ? n < -TWO_63 || n >= TWO_63 : n >= 2 * TWO_63) outOfRange(n);
      if (!signed && n >= TWO_63) {
        // Above Int64's range the halves are unsigned.
        const hi = Math.floor(n / TWO_32);
        w.view.setUint32(w.pos, n - hi * TWO_32, true);
        w.view.setUint32(w.pos + 4, hi, true);
        w.pos += 8;
      } else w.int64(n);
    },
  };
}

function outOfRange(v: number | bigint): never {
  throw new ValueError(`${v} is outside the 64-bit integer range`);
}

const float32: Scalar = {
  width: 4,
  put: (w, v) => {
    w.view.setFloat32(w.pos, (num(v) ?? 0) + 0, true); // + 0: −0 becomes 0, as JSON writes it
    w.pos += 4;
  },
};

const float64: Scalar = {
  width: 8,
  put: (w, v) => {
    w.view.setFloat64(w.pos, (num(v) ?? 0) + 0, true);
    w.pos += 8;
  },
};

const string: Scalar = {
  width: 0,
  put: (w, v) => {
    if (typeof v === 'string') return w.string(v);
    if (v === null || v === undefined) return w.string('');
    if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return w.string(String(v));
    throw new ValueError(`expects a string, got ${JSON.stringify(v)?.slice(0, 80)}`);
  },
};

/** DateTime: epoch ms in, whole seconds (UInt32) out. */
const dateTime: Scalar = {
  width: 4,
  put: (w, v) => {
    const ms = num(v) ?? 0;
    const s = Math.floor(ms / 1000);
    if (s < 0 || s > 0xffffffff) throw new ValueError(`time ${ms} ms is outside DateTime's range`);
    w.view.setUint32(w.pos, s, true);
    w.pos += 4;
  },
};

/** Arrays of a scalar: the general rules element by element (the generated row code has the fast loops). */
function arrayOf(element: Scalar): Encode {
  return (w, v) => {
    if (v === null || v === undefined) {
      w.ensure(1);
      return w.varuint(0);
    }
    if (!Array.isArray(v)) throw new ValueError(`expects an array, got ${typeof v}`);
    w.ensure(10 + v.length * element.width);
    w.varuint(v.length);
    // Fixed-width elements fit in what was reserved; strings reserve their own bytes.
    for (let i = 0; i < v.length; i++) element.put(w, v[i]);
  };
}

/** The argument of a type wrapper (`inner('Array(UInt8)', 'Array')` is 'UInt8'), or null when `type` is not one. */
export function inner(type: string, wrapper: string): string | null {
  return type.startsWith(wrapper + '(') && type.endsWith(')') ? type.slice(wrapper.length + 1, -1) : null;
}

/**
 * Bytes one value of a scalar column type takes in RowBinary (and in Native, which lays values out the same):
 * its width for a number or time, 0 for String (length-prefixed), null for a type the codecs do not encode.
 */
export function scalarWidth(type: string): number | null {
  return scalarType(type)?.width ?? null;
}

function scalarType(type: string): Scalar | null {
  switch (type) {
    case 'String':
      return string;
    case 'UInt8':
      return intScalar(0, 0xff, 1);
    case 'Int8':
      return intScalar(-0x80, 0x7f, 1);
    case 'UInt16':
      return intScalar(0, 0xffff, 2);
    case 'Int16':
      return intScalar(-0x8000, 0x7fff, 2);
    case 'UInt32':
      return intScalar(0, 0xffffffff, 4);
    case 'Int32':
      return intScalar(-0x80000000, 0x7fffffff, 4);
    case 'UInt64':
      return int64Scalar(false);
    case 'Int64':
    case 'DateTime64(3)':
      return int64Scalar(true);
    case 'Float32':
      return float32;
    case 'Float64':
      return float64;
    case 'DateTime':
      return dateTime;
    default:
      return null;
  }
}

/** DateTime('Europe/Paris') as DateTime: the zone changes how values print, not their RowBinary. */
export function withoutTimeZone(type: string): string {
  return type.replace(/^DateTime\('[^']*'\)$/, 'DateTime');
}

/** The element type of a column without LowCardinality wrappers. */
export function bare(type: string): string {
  const lc = inner(type, 'LowCardinality');
  return lc !== null ? bare(lc) : type;
}

function compileType(type: string): Encode | null {
  type = bare(type);
  const nullable = inner(type, 'Nullable');
  if (nullable !== null) {
    const e = compileType(nullable);
    if (!e) return null;
    return (w, v) => {
      const isNull = v === null || v === undefined || (typeof v === 'number' && !Number.isFinite(v));
      w.ensure(1);
      w.buf[w.pos++] = isNull ? 1 : 0;
      if (!isNull) e(w, v);
    };
  }
  const arr = inner(type, 'Array');
  if (arr !== null) {
    const el = bare(arr);
    const scalar = inner(el, 'Array') === null && inner(el, 'Nullable') === null ? scalarType(el) : null;
    if (scalar) return arrayOf(scalar);
    // Nested arrays and arrays of Nullable: element by element through the general encoder.
    const e = compileType(el);
    if (!e) return null;
    return (w, v) => {
      if (v === null || v === undefined) {
        w.ensure(1);
        return w.varuint(0);
      }
      if (!Array.isArray(v)) throw new ValueError(`expects an array, got ${typeof v}`);
      w.ensure(10);
      w.varuint(v.length);
      for (let i = 0; i < v.length; i++) e(w, v[i]);
    };
  }
  const s = scalarType(type);
  if (!s) return null;
  if (s.width === 0) return s.put;
  const { width, put } = s;
  return (w, v) => {
    w.ensure(width);
    put(w, v);
  };
}

type RowEncode = (w: Writer, row: Row) => void;

/**
 * The common case of a fixed-width number, inline: a test that the value needs no conversion, and the write
 * of value `x` at `p` through DataView `v` / bytes `b`, which advances `p` (an assignable expression: `w.pos`
 * for a scalar column, a local in array loops, so a token array is written without a property store a token).
 * Anything else (null, a numeric string, a value out of range, a non-finite float) goes to the general
 * encoder of the type, which applies the rules above or throws.
 */
interface FastNumber {
  width: number;
  test: (x: string) => string;
  write: (x: string, v: string, b: string, p: string) => string;
}

/** A safe integer as two 32-bit halves (as w.int64 writes it). */
const int64Source = (x: string, v: string, p: string): string =>
  `if ((${x} | 0) === ${x}) { ${v}.setInt32(${p}, ${x}, true); ${v}.setInt32(${p} + 4, ${x} >> 31, true); } ` +
  `else { const hi = Math.floor(${x} / ${TWO_32}); ${v}.setUint32(${p}, ${x} - hi * ${TWO_32}, true); ${v}.setInt32(${p} + 4, hi, true); } ${p} += 8;`;

const FAST: Record<string, FastNumber> = {
  UInt8: { width: 1, test: (x) => `(${x} & 0xff) === ${x}`, write: (x, _v, b, p) => `${b}[${p}++] = ${x};` },
  UInt32: { width: 4, test: (x) => `${x} >>> 0 === ${x}`, write: (x, v, _b, p) => `${v}.setUint32(${p}, ${x}, true); ${p} += 4;` },
  Int32: { width: 4, test: (x) => `(${x} | 0) === ${x}`, write: (x, v, _b, p) => `${v}.setInt32(${p}, ${x}, true); ${p} += 4;` },
  Int64: { width: 8, test: (x) => `Number.isSafeInteger(${x})`, write: (x, v, _b, p) => int64Source(x, v, p) },
  'DateTime64(3)': { width: 8, test: (x) => `Number.isSafeInteger(${x})`, write: (x, v, _b, p) => int64Source(x, v, p) },
  UInt64: { width: 8, test: (x) => `Number.isSafeInteger(${x}) && ${x} >= 0`, write: (x, v, _b, p) => int64Source(x, v, p) },
  Float32: { width: 4, test: (x) => `${x} - ${x} === 0`, write: (x, v, _b, p) => `${v}.setFloat32(${p}, ${x} + 0, true); ${p} += 4;` },
  Float64: { width: 8, test: (x) => `${x} - ${x} === 0`, write: (x, v, _b, p) => `${v}.setFloat64(${p}, ${x} + 0, true); ${p} += 8;` },
};

/**
 * Source of the statement that encodes value `x` of a column of type `type`. `general` names the column's
 * general encoder (`g[i]`), `element` the general encoder of one array element (`a[i]`).
 */
function columnSource(type: string, general: string, element: string): string {
  const fast = FAST[type];
  if (fast) return `if (typeof x === 'number' && ${fast.test('x')}) { w.ensure(${fast.width}); ${fast.write('x', 'w.view', 'w.buf', 'w.pos')} } else ${general}(w, x);`;
  if (type === 'String') return `if (typeof x === 'string') w.string(x); else ${general}(w, x);`;
  const nullable = inner(type, 'Nullable');
  if (nullable !== null) {
    const body = columnSource(bare(nullable), `${general}_inner`, element);
    return `if (x === null || x === undefined || (typeof x === 'number' && !Number.isFinite(x))) { w.ensure(1); w.buf[w.pos++] = 1; } else { w.ensure(1); w.buf[w.pos++] = 0; ${body} }`;
  }
  const arr = inner(type, 'Array');
  if (arr !== null) {
    const el = bare(arr);
    const f = FAST[el];
    if (f) {
      // Plain numbers through locals until the first value that needs the general rules; the rest, if any,
      // element by element.
      return `if (Array.isArray(x)) { const n = x.length; w.ensure(10 + n * ${f.width}); w.varuint(n);
  const v = w.view, b = w.buf; let p = w.pos, j = 0;
  for (; j < n; j++) { const y = x[j]; if (typeof y === 'number' && ${f.test('y')}) { ${f.write('y', 'v', 'b', 'p')} } else break; }
  w.pos = p;
  for (; j < n; j++) ${element}(w, x[j]);
} else ${general}(w, x);`;
    }
    if (el === 'String') {
      return `if (Array.isArray(x)) { const n = x.length; w.ensure(10); w.varuint(n);
  for (let j = 0; j < n; j++) { const y = x[j]; if (typeof y === 'string') w.string(y); else ${element}(w, y); }
} else ${general}(w, x);`;
    }
  }
  return `${general}(w, x);`;
}

/**
 * One function per table, generated from its column types: every column read with a constant property name
 * and encoded by code of its own, so each table's reads and number tests see one shape and one type (shared
 * encoder closures see every table's values and get slow). Names are embedded as JSON string literals, so any
 * column name is safe in the source.
 */
function rowFunction(columns: readonly { name: string; type: string }[], general: readonly Encode[], elements: readonly (Encode | null)[]): RowEncode {
  const inners: Record<string, Encode> = {};
  const statements = columns.map((c, i) => {
    const type = bare(c.type);
    const nullable = inner(type, 'Nullable');
    if (nullable !== null) inners[`g${i}_inner`] = compileType(nullable)!;
    return `x = row[${JSON.stringify(c.name)}];\n${columnSource(type, `g${i}`, `a${i}`)}`;
  });
  const names = [...general.map((_, i) => `g${i}`), ...elements.map((_, i) => `a${i}`), ...Object.keys(inners)];
  const values = [...general, ...elements, ...Object.values(inners)];
  const source = `"use strict"; return function encodeRow(w, row) {\nlet x;\n${statements.join('\n')}\n};`;
  return new Function(...names, source)(...values) as RowEncode;
}

export interface TableCodec {
  table: string;
  /** The columns a payload carries, in order (INSERT names them). */
  columns: ColumnSpec[];
  /**
   * Appends one row; a key that is not one of `columns` throws INPUT_INVALID naming it (columns.ts), a bad value a
   * TRACE_STORE error naming the column; either leaves `out` unchanged.
   */
  append(out: RowBinaryBuffer, row: Row): void;
  /** Encodes rows into a new Buffer; throws as append does (naming the row) before returning anything. */
  encode(rows: readonly Row[]): Buffer;
}

/**
 * A codec for these columns (in table order), or null if some column type is not supported. `computed`: the
 * table's columns an INSERT does not write (name → kind), named when a row carries one.
 */
export function compileRowBinary(table: string, columns: readonly ColumnSpec[], computed: ReadonlyMap<string, string> = new Map()): TableCodec | null {
  const encoders: Encode[] = [];
  for (const c of columns) {
    const e = compileType(withoutTimeZone(c.type));
    if (!e) return null;
    encoders.push(e);
  }
  const names = columns.map((c) => c.name);
  const elements = columns.map((c) => {
    const arr = inner(bare(c.type), 'Array');
    const scalar = arr === null ? null : scalarType(bare(arr));
    return scalar ? scalar.put : null;
  });
  const encodeRow = rowFunction(columns, encoders, elements);
  const checkKeys = keyChecker({ table, insertable: [...columns], computed });
  const append = (out: RowBinaryBuffer, row: Row, index?: number): void => {
    checkKeys(row, index);
    const start = out.pos;
    try {
      encodeRow(out, row);
      out.rows++;
    } catch (err) {
      out.pos = start;
      if (!(err instanceof ValueError) && !(err instanceof RangeError)) throw err;
      // Find the column that failed (rare path): encode the row again one column at a time.
      try {
        for (let i = 0; i < encoders.length; i++) {
          try {
            encoders[i]!(out, row[names[i]!]);
          } catch (e) {
            if (!(e instanceof ValueError) && !(e instanceof RangeError)) throw e;
            throw new RlstreamError('TRACE_STORE', `insert into ${table}: column ${names[i]} ${e.message}`);
          }
        }
      } finally {
        out.pos = start;
      }
      throw new RlstreamError('TRACE_STORE', `insert into ${table}: ${err.message}`);
    }
  };
  const scratch = new RowBinaryBuffer();
  return {
    table,
    columns: [...columns],
    append,
    encode: (rows) => {
      scratch.reset();
      for (let i = 0; i < rows.length; i++) append(scratch, rows[i]!, i);
      // A copy: the scratch buffer is reused by the next call while an insert may still hold this one.
      return Buffer.from(scratch.payload());
    },
  };
}

/** Per-table encoders, compiled on first use from the table's columns as the engine reports them (ColumnCache). */
export class RowBinaryCodecs {
  private readonly cache = new Map<string, Promise<TableCodec | null>>();

  constructor(private readonly columns: ColumnCache) {}

  /** The table's codec, or null when it has a column type without a RowBinary encoder here. */
  get(table: string): Promise<TableCodec | null> {
    let p = this.cache.get(table);
    if (!p) {
      p = this.columns.get(table).then((c) => (c.insertable.length > 0 ? compileRowBinary(table, c.insertable, c.computed) : null));
      this.cache.set(table, p);
      // A failed DESCRIBE (a table not created yet) is asked again next time.
      p.catch(() => this.cache.delete(table));
    }
    return p;
  }

  /** After migrations changed tables (reset the ColumnCache too). */
  reset(): void {
    this.cache.clear();
  }
}
