// Row sources from files: JSONL (one row per line) and Parquet (via hyparquet; nested columns such as
// prompt: list<struct> come back as plain objects). Both validate every row and name it in errors.
import { existsSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { extname } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { readJsonlFile } from '../../core/jsonl.ts';
import { validateRow, type DatasetRow } from './types.ts';

export async function* readJsonlRows(path: string): AsyncGenerator<DatasetRow> {
  if (!existsSync(path)) throw new RlstreamError('INPUT_INVALID', `dataset file not found: ${path}`);
  for await (const { value, where } of readJsonlFile(path)) yield validateRow(value, where);
}

/** Parquet values that JSON-ify badly (bigint, typed arrays) turned into plain JSON values. */
function plain(v: unknown): unknown {
  if (typeof v === 'bigint') return Number(v);
  if (ArrayBuffer.isView(v) && !(v instanceof DataView)) return Array.from(v as unknown as ArrayLike<number>);
  if (Array.isArray(v)) return v.map(plain);
  if (v !== null && typeof v === 'object' && !(v instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = plain(x);
    return out;
  }
  return v;
}

/** Columns stored as JSON text (a common way to keep free-form dicts in Parquet) are parsed back. */
function parseJsonColumns(row: Record<string, unknown>): Record<string, unknown> {
  for (const key of ['prompt', 'reward_model', 'extra_info']) {
    const v = row[key];
    if (typeof v === 'string' && /^[[{]/.test(v.trim())) {
      try {
        row[key] = JSON.parse(v);
      } catch {
        // left as is: validateRow names the field
      }
    }
  }
  return row;
}

export async function* readParquetRows(path: string, options: { batchRows?: number } = {}): AsyncGenerator<DatasetRow> {
  if (!existsSync(path)) throw new RlstreamError('INPUT_INVALID', `dataset file not found: ${path}`);
  const { parquetMetadataAsync, parquetReadObjects } = await import('hyparquet');
  const handle = await open(path, 'r');
  try {
    const { size } = await handle.stat();
    const file = {
      byteLength: size,
      async slice(start: number, end?: number): Promise<ArrayBuffer> {
        const stop = end ?? size;
        const buf = Buffer.alloc(stop - start);
        await handle.read(buf, 0, buf.length, start);
        return buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length);
      },
    };
    let metadata;
    try {
      metadata = await parquetMetadataAsync(file);
    } catch (cause) {
      throw new RlstreamError('INPUT_INVALID', `${path}: not a Parquet file (${(cause as Error).message})`, { cause });
    }
    const total = Number(metadata.num_rows);
    const batch = options.batchRows ?? 1024;
    for (let start = 0; start < total; start += batch) {
      const rows = await parquetReadObjects({ file, metadata, rowStart: start, rowEnd: Math.min(total, start + batch) });
      for (let k = 0; k < rows.length; k++) {
        yield validateRow(parseJsonColumns(plain(rows[k]) as Record<string, unknown>), `${path} row ${start + k}`);
      }
    }
  } finally {
    await handle.close();
  }
}

/** By extension: .jsonl / .json → JSONL, .parquet → Parquet. */
export function readRows(path: string): AsyncGenerator<DatasetRow> {
  const ext = extname(path).toLowerCase();
  if (ext === '.parquet') return readParquetRows(path);
  if (ext === '.jsonl' || ext === '.json' || ext === '.ndjson') return readJsonlRows(path);
  throw new RlstreamError('INPUT_INVALID', `dataset ${path}: unknown format (expected .jsonl or .parquet)`);
}
