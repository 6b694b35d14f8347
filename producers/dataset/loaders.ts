// Dataset loaders by name (`dataset.loader`), or chosen by the file's extension: a loader turns a path into
// rows in verl's shape. Built-ins: jsonl, parquet; `registerDatasetLoader(name, fn)` adds one.
import { extname } from 'node:path';
import { functionShape, Registry } from '../../core/config/registry.ts';
import { RlstreamError } from '../../core/errors.ts';
import { readJsonlRows, readParquetRows } from './files.ts';
import type { DatasetRow } from './types.ts';

export type DatasetLoader = (path: string) => AsyncIterable<DatasetRow>;

export const datasetLoaders = new Registry<DatasetLoader>('dataset loader', functionShape('a function (path) => AsyncIterable<row>'));

export function registerDatasetLoader(name: string, fn: DatasetLoader): void {
  datasetLoaders.register(name, fn);
}

registerDatasetLoader('jsonl', readJsonlRows);
registerDatasetLoader('parquet', (path) => readParquetRows(path));

const BY_EXTENSION: Record<string, string> = { '.jsonl': 'jsonl', '.json': 'jsonl', '.ndjson': 'jsonl', '.parquet': 'parquet' };

/** The loader a dataset file is read with: `loader` when given, else by extension. */
export function loaderFor(path: string, loader: string | null, field: string): DatasetLoader {
  if (loader !== null) return datasetLoaders.get(loader, `${field.replace(/\.[^.]*$/, '')}.loader`);
  const name = BY_EXTENSION[extname(path).toLowerCase()];
  if (name === undefined) throw new RlstreamError('CONFIG_INVALID', `${field}: ${path} has no known extension (.jsonl, .parquet); set dataset.loader (known: ${datasetLoaders.names().join(', ')})`);
  return datasetLoaders.get(name, field);
}
