// RowBinary payloads → ClickHouse Native blocks, for the stores' inserts: the engine reads a Native column in
// bulk where RowBinary makes it parse each row and array item, so the same rows cost its insert threads about
// a third less CPU (native/src/native_block.h has the figures). The payload stays RowBinary up to here (the
// transcoders and the table codecs write rows one at a time, as rows arrive); the addon regroups it by column
// off the main thread (into the file chDB reads, or the server's request body). Without the addon, or for a
// column shape it does not handle, the stores send RowBinary.
import { nativeBlock, writeNativeBlock } from '../../native/codecs.ts';
import { inner, RowBinaryBuffer, scalarWidth, withoutTimeZone, type ColumnSpec, type TableCodec } from './rowbinary.ts';
import { quoteString } from './sql.ts';

const FIXED = 0, STRING = 1, NULLABLE = 1, ARRAY = 2;

/** LowCardinality(T) → T at any depth: the same bytes in RowBinary and in Native's plain columns. */
export function withoutLowCardinality(type: string): string {
  return type.replace(/LowCardinality\((.*?)\)/g, '$1');
}

/** [kind, width, flags] of a column type in RowBinary, or null for a shape the converter does not handle. */
function shapeOf(type: string): [number, number, number] | null {
  let t = withoutTimeZone(withoutLowCardinality(type));
  let flags = 0;
  const nullable = inner(t, 'Nullable');
  if (nullable !== null) [t, flags] = [nullable, NULLABLE];
  const array = inner(t, 'Array');
  if (array !== null) [t, flags] = [array, flags | ARRAY];
  if (flags === (NULLABLE | ARRAY)) return null;
  // The widths the table codecs write (a type they do not encode never reaches a block).
  const width = scalarWidth(t);
  if (width === null) return null;
  return width === 0 ? [STRING, 0, flags] : [FIXED, width, flags];
}

export interface NativeLayout {
  layout: Int32Array;
  heads: Uint8Array;
  headEnds: Int32Array;
  /** The sorting key's columns (index, kind), or empty: the rows keep their order. */
  keys: Int32Array;
}

const KEY_BYTES = 0, KEY_UNSIGNED = 1, KEY_SIGNED = 2;

/** How a sorting-key column's values compare, or null for a type the converter does not order by. */
function keyKindOf(type: string): number | null {
  const t = withoutTimeZone(withoutLowCardinality(type));
  if (t === 'String') return KEY_BYTES;
  if (/^(UInt(8|16|32|64)|DateTime)$/.test(t)) return KEY_UNSIGNED;
  if (/^(Int(8|16|32|64)|DateTime64\(\d\))$/.test(t)) return KEY_SIGNED;
  return null;
}

/**
 * The [column index, kind] pairs of a table's sorting key (`sorting_key` of system.tables, e.g. "run_id,
 * trajectory_id"), or an empty array when some part of it is not a plain column of these of a type the converter
 * orders by: the rows are then sent as they came, and the engine sorts them.
 */
export function sortingKeyOf(columns: readonly ColumnSpec[], sortingKey: string | undefined): Int32Array {
  const parts = (sortingKey ?? '').split(',').map((p) => p.trim().replace(/^`(.*)`$/, '$1')).filter((p) => p !== '');
  const out: number[] = [];
  for (const name of parts) {
    const i = columns.findIndex((c) => c.name === name);
    const kind = i < 0 ? null : keyKindOf(columns[i]!.type);
    if (kind === null) return new Int32Array(0);
    out.push(i, kind);
  }
  return Int32Array.from(out);
}

/**
 * The converter's description of these columns, each declared in the block as `headerType(column type)`, or
 * null when some column has a shape it does not handle (nested arrays, arrays of Nullable).
 */
export function nativeLayoutOf(columns: readonly ColumnSpec[], headerType: (type: string) => string, sortingKey?: string): NativeLayout | null {
  const layout = new Int32Array(columns.length * 3);
  const heads = new RowBinaryBuffer(256); // each column's name and type, as length-prefixed strings
  const headEnds = new Int32Array(columns.length);
  for (const [i, c] of columns.entries()) {
    const shape = shapeOf(c.type);
    if (!shape) return null;
    layout.set(shape, i * 3);
    heads.string(c.name);
    heads.string(headerType(c.type));
    headEnds[i] = heads.pos;
  }
  return { layout, heads: Buffer.from(heads.payload()), headEnds, keys: sortingKeyOf(columns, sortingKey) };
}

/**
 * Native blocks for one store: the layout of each table codec, worked out once. Columns declare plain String
 * where the table has LowCardinality(String) (the same bytes; the INSERT converts once), and rows go in the
 * table's sorting-key order once loadSortingKeys() has read it.
 */
export class NativeBlocks {
  private layouts = new WeakMap<TableCodec, NativeLayout | null>();
  /** Each table's sorting key, as system.tables gives it; a table missing here keeps its rows' order. */
  private sortingKeys = new Map<string, string>();

  /** Read each table's sorting key in `database` (ClickHouse 18.16 and current alike); call after migrating. */
  async loadSortingKeys(query: (sql: string) => Promise<{ rows: Record<string, unknown>[] }>, database: string): Promise<void> {
    const res = await query(`SELECT name, sorting_key FROM system.tables WHERE database = ${quoteString(database)}`);
    this.sortingKeys = new Map(res.rows.map((r) => [String(r['name']), String(r['sorting_key'] ?? '')]));
    this.layouts = new WeakMap(); // worked out with the keys known before
  }

  /**
   * Writes the Native block of a RowBinary payload of codec's columns to a new file at path (resolving with its
   * size), or returns null: no addon, or a column it cannot convert; the caller writes the RowBinary.
   */
  write(path: string, codec: TableCodec, payload: Buffer, rows: number): Promise<number> | null {
    const l = this.layoutOf(codec);
    return l && writeNativeBlock(path, payload, rows, l.layout, l.heads, l.headEnds, l.keys);
  }

  /** As write(), resolving with the block itself (a request body). */
  block(codec: TableCodec, payload: Buffer, rows: number): Promise<Buffer> | null {
    const l = this.layoutOf(codec);
    return l && nativeBlock(payload, rows, l.layout, l.heads, l.headEnds, l.keys);
  }

  private layoutOf(codec: TableCodec): NativeLayout | null {
    let layout = this.layouts.get(codec);
    if (layout === undefined) this.layouts.set(codec, (layout = nativeLayoutOf(codec.columns, withoutLowCardinality, this.sortingKeys.get(codec.table))));
    return layout;
  }
}
