// Rows → a Parquet file with nested columns laid out as pyarrow lays them out (every field optional, lists
// as `<name> (LIST) { repeated group list { optional element } }`), so pandas, `datasets` and verl read it
// as they read a file that `datasets.Dataset.to_parquet` wrote. The column types are declared, never guessed
// from the data: a guessed type changes with the rows (an all-integer float column becomes INT32).
import { rename, rm } from 'node:fs/promises';
import { RlstreamError } from '../../core/errors.ts';

/** A column's type: a leaf, a list of one type, or a struct of named fields in order. */
export type ParquetType = 'string' | 'int64' | 'bool' | 'double' | { list: ParquetType } | { struct: readonly (readonly [string, ParquetType])[] };

interface SchemaElement {
  name: string;
  type?: 'BYTE_ARRAY' | 'INT64' | 'BOOLEAN' | 'DOUBLE';
  converted_type?: 'UTF8' | 'LIST';
  logical_type?: { type: 'STRING' };
  repetition_type?: 'OPTIONAL' | 'REPEATED' | 'REQUIRED';
  num_children?: number;
}

function elements(name: string, t: ParquetType, repetition: 'OPTIONAL' | 'REPEATED' = 'OPTIONAL'): SchemaElement[] {
  if (t === 'string') return [{ name, type: 'BYTE_ARRAY', converted_type: 'UTF8', logical_type: { type: 'STRING' }, repetition_type: repetition }];
  if (t === 'int64') return [{ name, type: 'INT64', repetition_type: repetition }];
  if (t === 'bool') return [{ name, type: 'BOOLEAN', repetition_type: repetition }];
  if (t === 'double') return [{ name, type: 'DOUBLE', repetition_type: repetition }];
  if ('list' in t) {
    return [
      { name, converted_type: 'LIST', repetition_type: repetition, num_children: 1 },
      { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
      ...elements('element', t.list),
    ];
  }
  return [{ name, repetition_type: repetition, num_children: t.struct.length }, ...t.struct.flatMap(([n, ft]) => elements(n, ft))];
}

/** Leaf values Parquet stores as INT64 must be bigint. */
function coerce(v: unknown, t: ParquetType): unknown {
  if (v === null || v === undefined) return null;
  if (t === 'int64') return typeof v === 'bigint' ? v : BigInt(v as number);
  if (typeof t === 'string') return v;
  if ('list' in t) return (v as unknown[]).map((x) => coerce(x, t.list));
  const o = v as Record<string, unknown>;
  return Object.fromEntries(t.struct.map(([n, ft]) => [n, coerce(o[n], ft)]));
}

/**
 * Write `rows` (objects keyed by column) to `path` with the given columns. The file appears whole or not at all:
 * it is written under a temporary name beside `path` and renamed into place.
 */
export async function writeParquetRows(path: string, columns: readonly (readonly [string, ParquetType])[], rows: readonly Record<string, unknown>[]): Promise<void> {
  const { parquetWriteFile } = await import('hyparquet-writer');
  const schema = [{ name: 'schema', num_children: columns.length, repetition_type: 'REQUIRED' as const }, ...columns.flatMap(([n, t]) => elements(n, t))];
  const columnData = columns.map(([n, t]) => ({ name: n, data: rows.map((r) => coerce(r[n], t)) }));
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    parquetWriteFile({ filename: tmp, columnData, schema: schema as never });
    await rename(tmp, path);
  } catch (cause) {
    await rm(tmp, { force: true });
    throw new RlstreamError('INPUT_INVALID', `cannot write ${path}: ${(cause as Error).message}`, { cause });
  }
}
