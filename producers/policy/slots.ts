// The running batch's KV cache as fixed-capacity buffers the engine owns: row b's tokens sit left-aligned in
// columns [0, len_b) of [rows, kvHeads, capacity, headDim] per layer, and an additive bias row masks the
// unused columns. A decode step reads the buffers in place (the graph takes them as past K/V) and the engine
// writes back only the new column, so a step copies one column whatever the length of the cache. Rows leave by
// swap-remove (one row copied) and join by copying their own tokens in; the capacity grows geometrically and
// shrinks when long rows have left, so masked columns stay a small share of the attention work. Resizes
// re-stride the rows in place within buffers allocated with headroom; buffers are replaced only when too small
// or more than 4x larger than needed, and an emptied batch keeps them for the next one.
import type { PolicyModelConfig } from './config.ts';
import { MASKED } from './export.ts';
import type { KvTensors } from './runner.ts';

/** `count` columns of one row of a cache, starting at column `from` (`kv.len` is the source's column stride). */
export interface Segment {
  kv: KvTensors;
  row: number;
  from: number;
  count: number;
}

/** Copy `segs` one after another into row `row` of `dst` (column stride dst.len), starting at column 0. */
export function copySegments(c: PolicyModelConfig, segs: Segment[], dst: KvTensors, row: number): number {
  const KVH = c.numKvHeads;
  const D = c.headDim;
  let col = 0;
  for (const s of segs) {
    if (s.count === 0) continue;
    for (let l = 0; l < c.numLayers; l++) {
      for (const [from, to] of [
        [s.kv.keys[l]!, dst.keys[l]!],
        [s.kv.values[l]!, dst.values[l]!],
      ] as const) {
        for (let h = 0; h < KVH; h++) {
          const src = ((s.row * KVH + h) * s.kv.len + s.from) * D;
          to.set(from.subarray(src, src + s.count * D), ((row * KVH + h) * dst.len + col) * D);
        }
      }
    }
    col += s.count;
  }
  return col;
}

/** A compact batch-1 cache holding `segs` in order. */
export function compactRow(c: PolicyModelConfig, segs: Segment[]): KvTensors {
  const n = segs.reduce((t, s) => t + s.count, 0);
  const size = c.numKvHeads * n * c.headDim;
  const kv: KvTensors = { len: n, keys: [], values: [] };
  for (let l = 0; l < c.numLayers; l++) {
    kv.keys.push(new Float32Array(size));
    kv.values.push(new Float32Array(size));
  }
  copySegments(c, segs, kv, 0);
  return kv;
}

// Columns are allocated in multiples of this, with ~1/8 headroom, so growth copies are rare.
const COL_STEP = 16;
// New buffers get this much more room than asked for, so the next growths re-stride in place.
const GROW_HEADROOM = 1.5;
// An emptied batch keeps buffers up to this size for the next one.
const KEEP_EMPTY_BYTES = 64 * 1024 * 1024;

export class SlotCache {
  private rowsCap = 0;
  private cap = 0;
  private keys: Float32Array[] = [];
  private values: Float32Array[] = [];
  private biasBuf = new Float32Array(0);
  private readonly lens: number[] = [];

  constructor(private readonly c: PolicyModelConfig) {}

  get rows(): number {
    return this.lens.length;
  }

  /** Columns per row in the buffers (the past length the graph sees). */
  get capacity(): number {
    return this.cap;
  }

  lengthOf(row: number): number {
    return this.lens[row]!;
  }

  /** The buffers as a cache of `capacity` columns; the arrays hold room for more rows than `rows`. */
  view(): KvTensors {
    return { len: this.cap, keys: this.keys, values: this.values };
  }

  /** [rows, 1, 1, capacity] (a prefix of the array): 0 on each row's tokens, MASKED on the unused columns. */
  get bias(): Float32Array {
    return this.biasBuf;
  }

  /** Make sure every row has room for one more column (call before a decode step). */
  reserveColumn(): void {
    let longest = 0;
    for (const n of this.lens) longest = Math.max(longest, n);
    if (longest + 1 > this.cap) this.resize(this.rowsCap, capacityFor(longest + 1));
  }

  /**
   * Write a decode step's new K/V after each row's tokens; `column` is [rows, layers, 2 (K, V), kvHeads, headDim]
   * (DecodeOutput.column).
   */
  appendColumn(column: Float32Array): void {
    const { numKvHeads: KVH, headDim: D, numLayers } = this.c;
    const cap = this.cap;
    const rows = this.lens.length;
    // Plain loops: a column is only headDim floats, too short for subarray() + set() to pay off.
    for (let l = 0; l < numLayers; l++) {
      const k = this.keys[l]!;
      const v = this.values[l]!;
      for (let b = 0; b < rows; b++) {
        const col = this.lens[b]!;
        const srcK = (b * numLayers + l) * 2 * KVH * D;
        const srcV = srcK + KVH * D;
        for (let h = 0; h < KVH; h++) {
          const dst = ((b * KVH + h) * cap + col) * D;
          for (let d = 0; d < D; d++) {
            k[dst + d] = column[srcK + h * D + d]!;
            v[dst + d] = column[srcV + h * D + d]!;
          }
        }
      }
    }
    for (let b = 0; b < rows; b++) this.biasBuf[b * cap + this.lens[b]!] = 0;
    for (let b = 0; b < rows; b++) this.lens[b]!++;
  }

  /** Make room for `rows` rows of up to `cols` tokens (plus the next decode column) in one resize. */
  reserve(rows: number, cols: number): void {
    const rowsCap = rows > this.rowsCap ? Math.max(4, this.rowsCap * 2, rows) : this.rowsCap;
    const cap = cols + 1 > this.cap ? capacityFor(cols + 1) : this.cap;
    if (rowsCap !== this.rowsCap || cap !== this.cap) this.resize(rowsCap, cap);
  }

  /** Add a row holding `segs`; returns its index (the last). */
  append(segs: Segment[]): number {
    const n = segs.reduce((t, s) => t + s.count, 0);
    const b = this.lens.length;
    this.reserve(b + 1, n);
    copySegments(this.c, segs, this.view(), b);
    this.lens.push(n);
    this.maskRow(b);
    return b;
  }

  /** A compact batch-1 copy of row `b`'s tokens. */
  extract(b: number): KvTensors {
    return compactRow(this.c, [{ kv: this.view(), row: b, from: 0, count: this.lens[b]! }]);
  }

  /** Remove row `b`: the last row moves into its place (callers keep their row lists in the same order). */
  remove(b: number): void {
    const last = this.lens.length - 1;
    if (b !== last) {
      copySegments(this.c, [{ kv: this.view(), row: last, from: 0, count: this.lens[last]! }], this.view(), b);
      this.lens[b] = this.lens[last]!;
      this.maskRow(b);
    }
    this.lens.pop();
  }

  /** After rows left: give back masked attention work when the longest row is far below capacity. */
  shrink(): void {
    if (this.lens.length === 0) {
      // Keep the buffers for the next batch (no page faults, no GC of their memory) unless they are large.
      if (this.keys.length > 0 && this.keys[0]!.length * 4 * 2 * this.c.numLayers > KEEP_EMPTY_BYTES) {
        this.keys = [];
        this.values = [];
        this.biasBuf = new Float32Array(0);
      }
      this.rowsCap = 0;
      this.cap = 0;
      return;
    }
    let longest = 0;
    for (const n of this.lens) longest = Math.max(longest, n);
    const want = capacityFor(longest + 1);
    if (want * 2 <= this.cap) this.resize(this.rowsCap, want);
  }

  clear(): void {
    this.lens.length = 0;
    this.shrink();
  }

  private maskRow(b: number): void {
    const cap = this.cap;
    this.biasBuf.fill(0, b * cap, b * cap + this.lens[b]!);
    this.biasBuf.fill(MASKED, b * cap + this.lens[b]!, (b + 1) * cap);
  }

  /**
   * Lay the buffers out for `rowsCap` rows of `cap` columns. Only the column stride moves data: when the buffers
   * are long enough the rows are re-strided in place (copyWithin, last block first when growing), otherwise they
   * are copied into new buffers allocated with headroom. A fresh buffer costs a page fault per 4 KiB on first
   * touch and a GC of its memory when dropped, which shows in a decode round when it happens at every growth.
   */
  private resize(rowsCap: number, cap: number): void {
    const { numKvHeads: KVH, headDim: D, numLayers } = this.c;
    const need = rowsCap * KVH * cap * D;
    const oldCap = this.cap;
    const have = this.keys.length > 0 ? this.keys[0]!.length : 0;
    // In place when the buffers fit; new ones when they do not, or are far larger than needed (after long rows
    // or a large batch left, so that memory follows the batch down).
    if (have >= need && have <= 4 * need && this.biasBuf.length >= rowsCap * cap) {
      const blocks = this.lens.length * KVH;
      const move = (buf: Float32Array, i: number) => {
        const n = this.lens[Math.floor(i / KVH)]! * D;
        buf.copyWithin(i * cap * D, i * oldCap * D, i * oldCap * D + n);
      };
      for (const buf of [...this.keys, ...this.values]) {
        if (cap > oldCap) for (let i = blocks - 1; i >= 0; i--) move(buf, i);
        else if (cap < oldCap) for (let i = 0; i < blocks; i++) move(buf, i);
      }
    } else {
      const old = this.view();
      const size = Math.ceil(need * GROW_HEADROOM);
      this.keys = [];
      this.values = [];
      for (let l = 0; l < numLayers; l++) {
        this.keys.push(new Float32Array(size));
        this.values.push(new Float32Array(size));
      }
      this.biasBuf = new Float32Array(Math.ceil(rowsCap * cap * GROW_HEADROOM));
      this.cap = cap;
      for (let b = 0; b < this.lens.length; b++) copySegments(this.c, [{ kv: old, row: b, from: 0, count: this.lens[b]! }], this.view(), b);
    }
    this.rowsCap = rowsCap;
    this.cap = cap;
    // Columns past a row's tokens may hold stale K/V of another row: the bias masks them (-1e9 before the softmax
    // gives them weight 0, and K/V are finite), as it masks the zeros of a fresh buffer.
    for (let b = 0; b < this.lens.length; b++) this.maskRow(b);
  }
}

/** The columns allocated for `cols` columns of tokens (the past width a decode step's graph sees). */
function capacityFor(cols: number): number {
  return Math.ceil((cols + (cols >> 3)) / COL_STEP) * COL_STEP;
}
