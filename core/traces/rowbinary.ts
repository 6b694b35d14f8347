// Rows → ClickHouse RowBinary, compiled per table from its columns (DESCRIBE TABLE). The bulk insert format of
// both stores: no text to parse on the engine side and no JSON to build here; token, log-prob and mask arrays
// become packed little-endian numbers (≈ 4 bytes per token instead of ≈ 10–20 characters of JSON).
// Value rules match what JSONEachRow did with the same rows, so the two paths store the same thing:
// times are epoch ms (DateTime64(3) as ms ticks, DateTime as whole seconds), a missing/null value or a
// non-finite number (JSON null) becomes NULL in a Nullable column and the type's default elsewhere, booleans
// are 1/0. A type this encoder does not know makes compile return null: the store then keeps JSONEachRow.
import { RlstreamError } from '../errors.ts';
import type { Row } from './store.ts';

export interface ColumnSpec {
  name: string;
  type: string;
}

class Writer {
  buf = Buffer.allocUnsafe(1 << 20);
  pos = 0;
  ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = Buffer.allocUnsafe(size);
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }
  varuint(n: number): void {
    this.ensure(10);
    while (n >= 0x80) {
      this.buf[this.pos++] = (n & 0x7f) | 0x80;
      n = Math.floor(n / 128);
    }
    this.buf[this.pos++] = n;
  }
  string(s: string): void {
    // A 1-byte length prefix when even 3 bytes per UTF-16 unit fit under 128 (no second pass over the text).
    if (s.length < 42) {
      this.ensure(1 + s.length * 3);
      const n = this.buf.write(s, this.pos + 1, 'utf8');
      this.buf[this.pos] = n;
      this.pos += 1 + n;
      return;
    }
    const n = Buffer.byteLength(s, 'utf8');
    this.varuint(n);
    this.ensure(n);
    this.pos += this.buf.write(s, this.pos, n, 'utf8');
  }
}

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

function int(lo: number, hi: number, bytes: 1 | 2 | 4, signed: boolean): Encode {
  return (w, v) => {
    const n = num(v) ?? 0;
    if (!Number.isInteger(n) || n < lo || n > hi) throw new ValueError(`expects an integer in [${lo}, ${hi}], got ${n}`);
    w.ensure(bytes);
    if (bytes === 1) w.buf[w.pos] = n & 0xff;
    else if (bytes === 2) w.buf.writeUInt16LE(n & 0xffff, w.pos);
    else if (signed) w.buf.writeInt32LE(n, w.pos);
    else w.buf.writeUInt32LE(n, w.pos);
    w.pos += bytes;
  };
}

function int64(signed: boolean, scale = 1): Encode {
  return (w, v) => {
    let big: bigint;
    if (typeof v === 'bigint') big = v;
    else {
      const n = num(v) ?? 0;
      big = BigInt(scale === 1 ? Math.trunc(n) : Math.floor(n / scale));
    }
    w.ensure(8);
    if (signed) w.buf.writeBigInt64LE(big, w.pos);
    else if (big < 0n) throw new ValueError(`expects an unsigned integer, got ${big}`);
    else w.buf.writeBigUInt64LE(big, w.pos);
    w.pos += 8;
  };
}

const float32: Encode = (w, v) => {
  w.ensure(4);
  w.buf.writeFloatLE((num(v) ?? 0) + 0, w.pos); // + 0: −0 becomes 0, as JSON writes it
  w.pos += 4;
};

const float64: Encode = (w, v) => {
  w.ensure(8);
  w.buf.writeDoubleLE((num(v) ?? 0) + 0, w.pos);
  w.pos += 8;
};

const string: Encode = (w, v) => {
  if (typeof v === 'string') return w.string(v);
  if (v === null || v === undefined) return w.string('');
  if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return w.string(String(v));
  throw new ValueError(`expects a string, got ${JSON.stringify(v)?.slice(0, 80)}`);
};

/** DateTime: epoch ms in, whole seconds (UInt32) out. */
const dateTime: Encode = (w, v) => {
  const ms = num(v) ?? 0;
  const s = Math.floor(ms / 1000);
  if (s < 0 || s > 0xffffffff) throw new ValueError(`time ${ms} ms is outside DateTime's range`);
  w.ensure(4);
  w.buf.writeUInt32LE(s, w.pos);
  w.pos += 4;
};

function inner(type: string, wrapper: string): string | null {
  return type.startsWith(wrapper + '(') && type.endsWith(')') ? type.slice(wrapper.length + 1, -1) : null;
}

function compileType(type: string): Encode | null {
  const lc = inner(type, 'LowCardinality');
  if (lc !== null) return compileType(lc);
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
    const e = compileType(arr);
    if (!e) return null;
    return (w, v) => {
      if (v === null || v === undefined) return w.varuint(0);
      if (!Array.isArray(v)) throw new ValueError(`expects an array, got ${typeof v}`);
      w.varuint(v.length);
      for (let i = 0; i < v.length; i++) e(w, v[i]);
    };
  }
  switch (type) {
    case 'String':
      return string;
    case 'UInt8':
      return int(0, 0xff, 1, false);
    case 'Int8':
      return int(-0x80, 0x7f, 1, true);
    case 'UInt16':
      return int(0, 0xffff, 2, false);
    case 'Int16':
      return int(-0x8000, 0x7fff, 2, true);
    case 'UInt32':
      return int(0, 0xffffffff, 4, false);
    case 'Int32':
      return int(-0x80000000, 0x7fffffff, 4, true);
    case 'UInt64':
      return int64(false);
    case 'Int64':
      return int64(true);
    case 'Float32':
      return float32;
    case 'Float64':
      return float64;
    case 'DateTime':
      return dateTime;
    case 'DateTime64(3)':
      return int64(true);
    default:
      return null;
  }
}

export type RowBinaryEncoder = (rows: readonly Row[]) => Buffer;

/** An encoder of rows for these columns (in table order), or null if some column type is not supported. */
export function compileRowBinary(table: string, columns: readonly ColumnSpec[]): RowBinaryEncoder | null {
  const encoders: Encode[] = [];
  for (const c of columns) {
    const e = compileType(c.type.replace(/^DateTime\('[^']*'\)$/, 'DateTime'));
    if (!e) return null;
    encoders.push(e);
  }
  const names = columns.map((c) => c.name);
  const w = new Writer();
  return (rows) => {
    w.pos = 0;
    for (const row of rows) {
      for (let i = 0; i < encoders.length; i++) {
        try {
          encoders[i]!(w, row[names[i]!]);
        } catch (err) {
          if (!(err instanceof ValueError) && !(err instanceof RangeError)) throw err;
          throw new RlstreamError('TRACE_STORE', `insert into ${table}: column ${names[i]} ${err.message}`);
        }
      }
    }
    // A copy: the writer's buffer is reused by the next call while an insert may still hold this one.
    return Buffer.from(w.buf.subarray(0, w.pos));
  };
}

/** Columns an INSERT writes (DESCRIBE TABLE rows): MATERIALIZED, ALIAS and EPHEMERAL ones are not sent. */
export function insertableColumns(describe: readonly Row[]): ColumnSpec[] {
  return describe
    .filter((r) => !['MATERIALIZED', 'ALIAS', 'EPHEMERAL'].includes(String(r['default_type'] ?? '')))
    .map((r) => ({ name: String(r['name']), type: String(r['type']) }));
}

export interface TableCodec {
  columns: ColumnSpec[];
  encode: RowBinaryEncoder;
}

/** Per-table encoders, compiled on first use from DESCRIBE TABLE; reset after migrations change tables. */
export class RowBinaryCodecs {
  private readonly cache = new Map<string, Promise<TableCodec | null>>();

  constructor(private readonly describe: (table: string) => Promise<readonly Row[]>) {}

  /** The table's codec, or null when it has a column type without a RowBinary encoder here. */
  get(table: string): Promise<TableCodec | null> {
    let p = this.cache.get(table);
    if (!p) {
      p = this.describe(table).then((rows) => {
        const columns = insertableColumns(rows);
        const encode = columns.length > 0 ? compileRowBinary(table, columns) : null;
        return encode ? { columns, encode } : null;
      });
      this.cache.set(table, p);
      // A failed DESCRIBE (a table not created yet) is asked again next time.
      p.catch(() => this.cache.delete(table));
    }
    return p;
  }

  reset(): void {
    this.cache.clear();
  }
}
