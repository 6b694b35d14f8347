// KV-cache bookkeeping for the engine: gathering rows of batched caches into a new, right-aligned batch (how
// requests join and leave the running batch), and the per-session cache kept between turns, bounded in bytes
// and evicted least-recently-used.
import type { PolicyModelConfig } from './config.ts';
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
export function gatherRows(c: PolicyModelConfig, rows: RowSource[]): { kv: KvTensors; starts: number[] } {
  const KVH = c.numKvHeads;
  const D = c.headDim;
  const B = rows.length;
  const T = rows.reduce((m, r) => Math.max(m, r.cols.length), 0);
  const keys: Float32Array[] = [];
  const values: Float32Array[] = [];
  for (let l = 0; l < c.numLayers; l++) {
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
    for (let l = 0; l < c.numLayers; l++) {
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

export function kvBytes(c: PolicyModelConfig, kv: KvTensors, batch: number): number {
  return c.numLayers * 2 * batch * c.numKvHeads * kv.len * c.headDim * 4;
}

/** The cache of one session after a turn: the KV of `tokens` (batch 1, compact) under policy `version`. */
export interface SessionKv {
  version: number;
  tokens: number[];
  kv: KvTensors;
  bytes: number;
}

export class SessionCache {
  // Map iteration order is insertion order: re-inserting on use makes the first key the least recently used.
  private readonly entries = new Map<string, SessionKv>();
  private used = 0;
  evictions = 0;

  constructor(private readonly budgetBytes: number) {}

  /** Remove and return a session's cache (the caller owns it while the turn runs). */
  take(sessionId: string): SessionKv | undefined {
    const e = this.entries.get(sessionId);
    if (e) {
      this.entries.delete(sessionId);
      this.used -= e.bytes;
    }
    return e;
  }

  put(sessionId: string, entry: SessionKv): void {
    this.take(sessionId);
    if (entry.bytes > this.budgetBytes) return;
    this.entries.set(sessionId, entry);
    this.used += entry.bytes;
    for (const [id, e] of this.entries) {
      if (this.used <= this.budgetBytes) break;
      this.entries.delete(id);
      this.used -= e.bytes;
      this.evictions++;
    }
  }

  /** Drop every cache not computed by `version` (after a policy switch). */
  dropOtherVersions(version: number): void {
    for (const [id, e] of this.entries) {
      if (e.version !== version) {
        this.entries.delete(id);
        this.used -= e.bytes;
      }
    }
  }

  has(sessionId: string): boolean {
    return this.entries.has(sessionId);
  }

  get bytes(): number {
    return this.used;
  }

  get size(): number {
    return this.entries.size;
  }
}
