// Gathering rows of batched KV caches into a new, right-aligned batch: how the ONNX runner (onnx-slot-runner.ts)
// lays out a step's slots for the general graph.
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { KvTensors } from './runner.ts';

/** One row to gather: `cols` are the columns of `kv` (a batch of `batch` rows) holding this row's tokens, in order. */
export interface RowSource {
  kv: KvTensors;
  batch: number;
  row: number;
  cols: ArrayLike<number>;
}

/**
 * Copy rows into a fresh batch of length T = max(cols.length); row r's tokens land right-aligned in columns
 * [T - n_r, T). Returns the cache and each row's first valid column. Contiguous runs of columns are copied as
 * blocks, so the cost is one memcpy per (row, layer, K/V, head, run).
 */
export function gatherRows(c: ParsedModelConfig, rows: RowSource[]): { kv: KvTensors; starts: number[] } {
  const KVH = c.num_key_value_heads;
  const D = c.head_dim;
  const B = rows.length;
  const T = rows.reduce((m, r) => Math.max(m, r.cols.length), 0);
  const keys: Float32Array[] = [];
  const values: Float32Array[] = [];
  for (let l = 0; l < c.num_hidden_layers; l++) {
    keys.push(new Float32Array(B * KVH * T * D));
    values.push(new Float32Array(B * KVH * T * D));
  }
  const starts: number[] = [];
  rows.forEach((src, b) => {
    const n = src.cols.length;
    const start = T - n;
    starts.push(start);
    // Runs of consecutive source columns: [srcCol, dstCol, length].
    const runs: [number, number, number][] = [];
    for (let j = 0; j < n; ) {
      let k = j + 1;
      while (k < n && src.cols[k] === src.cols[k - 1]! + 1) k++;
      runs.push([src.cols[j]!, start + j, k - j]);
      j = k;
    }
    const L = src.kv.len;
    for (let l = 0; l < c.num_hidden_layers; l++) {
      for (const [from, to] of [
        [src.kv.keys[l]!, keys[l]!],
        [src.kv.values[l]!, values[l]!],
      ] as const) {
        for (let h = 0; h < KVH; h++) {
          const srcBase = ((src.row * KVH + h) * L) * D;
          const dstBase = ((b * KVH + h) * T) * D;
          for (const [s, d, len] of runs) to.set(from.subarray(srcBase + s * D, srcBase + (s + len) * D), dstBase + d * D);
        }
      }
    }
  });
  return { kv: { len: T, keys, values }, starts };
}
