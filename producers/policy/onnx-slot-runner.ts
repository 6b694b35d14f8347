// The ONNX runner (runner.ts, onnxruntime-node) as a SlotRunner, so the one continuous-batching scheduler
// (native-engine.ts) drives it as it drives the native core. The slots' K/V live on the host in one
// [rows, kvHeads, capacity, headDim] buffer per layer and K/V, the capacity grown in steps with the longest slot
// (up to maxLen) and shrunk once the slots hold far less; a slot sits in some row of it (rowOf). A step's one-token rows run the one-token graph on the
// buffers as they are: their slots are first moved into the leading rows (a swap of two rows' cached tokens, only
// when the running set changed), so the graph reads a prefix of the buffers with no copy and each new column is
// written in place. Its rows with several tokens (a turn joining) are run apart on the general graph: their
// cached tokens gathered into a right-aligned batch (kv.ts), the new tokens left-padded to the longest of them
// only (the engine's prefill layout), each slot's new K/V written after its cached ones. (Run together, every
// one-token row would be padded to the longest prompt of the step and computed that many times over.) It holds
// weights by policy version, one onnxruntime session each (several at once for rollout.interrupt 'finish' and
// 'next_turn'); a step names the version it runs.
import { RlstreamError } from '../../core/errors.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { MASKED } from './export.ts';
import { gatherRows } from './kv.ts';
import { PolicyRunner, type KvTensors } from './runner.ts';
import type { SlotRunner } from './slot-runner.ts';

/**
 * Room the buffers keep beyond the longest slot: a decode step computes attention over all of it, and each
 * re-layout copies every slot's tokens, so it trades one against the other (a re-layout every SLACK tokens of
 * the longest slot at most, room wasted below 2 × SLACK).
 */
const SLACK = 32;

export class OnnxSlotRunner implements SlotRunner {
  private store: KvTensors = { len: 0, keys: [], values: [] };
  /** Tokens each slot holds. */
  private lengths = new Int32Array(0);
  /** The buffers' row holding each slot, and the slot each row holds (a permutation). */
  private rowOf = new Int32Array(0);
  private slotAt = new Int32Array(0);
  private maxLen = 0;
  /** The weights held, by policy version; `newest` is the one a step that names none runs. */
  private readonly sets = new Map<number, PolicyRunner>();
  private newest: number;

  private constructor(
    readonly config: ParsedModelConfig,
    first: PolicyRunner,
    private readonly threads: number,
    private readonly decodeGraph: boolean,
  ) {
    this.sets.set(first.version, first);
    this.newest = first.version;
  }

  /**
   * The graph exported from `weights` in one onnxruntime session of `threads` intra-op threads (default 1), held
   * as policy `version` (default 0). decodeGraph false: one-token steps run on the general graph too (default true).
   */
  static async create(config: ParsedModelConfig, weights: TensorMap, options: { threads?: number; version?: number; decodeGraph?: boolean } = {}): Promise<OnnxSlotRunner> {
    const threads = options.threads ?? 1;
    const decodeGraph = options.decodeGraph ?? true;
    return new OnnxSlotRunner(config, await PolicyRunner.create(config, weights, options.version ?? 0, { threads, decodeGraph }), threads, decodeGraph);
  }

  /**
   * Another version's weights (same architecture) in a new onnxruntime session beside those held; steps that
   * name no version run it from now on. The slots keep their K/V: the scheduler decides which it drops.
   */
  async addWeights(weights: TensorMap, version: number): Promise<void> {
    if (this.sets.has(version)) throw new RlstreamError('INPUT_INVALID', `policy version ${version} is already loaded`);
    this.sets.set(version, await PolicyRunner.create(this.config, weights, version, { threads: this.threads, decodeGraph: this.decodeGraph }));
    this.newest = version;
  }

  /** Releases a version's weights (the scheduler does, once no turn or session needs them); the last one stays. */
  async dropWeights(version: number): Promise<void> {
    const r = this.sets.get(version);
    if (!r) return;
    if (this.sets.size === 1) throw new RlstreamError('INPUT_INVALID', `policy version ${version} is the only one loaded; add another before dropping it`);
    this.sets.delete(version);
    if (this.newest === version) this.newest = Math.max(...this.sets.keys());
    await r.release();
  }

  /** How long a held version's export and onnxruntime session load took (ms). */
  loadTimes(version: number): { exportMs: number; loadMs: number } {
    const r = this.runnerFor(version);
    return { exportMs: r.exportMs, loadMs: r.loadMs };
  }

  /** Tokens a slot's buffers have room for now (grown with the longest slot, up to maxLen; shrunk once none needs it). */
  capacity(): number {
    return this.store.len;
  }

  /** The versions whose weights are held, ascending. */
  weightVersions(): number[] {
    return [...this.sets.keys()].sort((a, b) => a - b);
  }

  private runnerFor(version: number | undefined): PolicyRunner {
    const r = this.sets.get(version ?? this.newest);
    if (!r) throw new RlstreamError('INPUT_INVALID', `policy version ${version} is not loaded (held: ${this.weightVersions().join(', ')})`);
    return r;
  }

  /** Bytes of K/V `slots` slots take once each holds `maxLen` tokens (float32, every layer), as Model.kvBytes. */
  kvBytes(slots: number, maxLen: number): number {
    return slots * maxLen * this.config.num_hidden_layers * 2 * this.config.num_key_value_heads * this.config.head_dim * Float32Array.BYTES_PER_ELEMENT;
  }

  kvReserve(slots: number, maxLen: number): void {
    if (!Number.isInteger(slots) || slots < 1 || !Number.isInteger(maxLen) || maxLen < 1) throw new RlstreamError('CONFIG_INVALID', `kvReserve: slots and maxLen must be positive integers, got ${slots} and ${maxLen}`);
    this.maxLen = maxLen;
    this.lengths = new Int32Array(slots);
    this.rowOf = Int32Array.from({ length: slots }, (_, i) => i);
    this.slotAt = Int32Array.from({ length: slots }, (_, i) => i);
    this.store = { len: 0, keys: [], values: [] };
    this.relayout(Math.min(maxLen, 16));
  }

  /** Re-lays the buffers out with room for `cap` tokens a slot (the tokens each slot holds are kept). */
  private relayout(cap: number): void {
    const { num_key_value_heads: KVH, head_dim: D, num_hidden_layers: numLayers } = this.config;
    const rows = this.lengths.length;
    const old = this.store;
    const layer = (from: Float32Array[]) =>
      Array.from({ length: numLayers }, (_, l) => {
        const a = new Float32Array(rows * KVH * cap * D);
        const src = from[l];
        if (src)
          for (let r = 0; r < rows; r++) {
            const n = Math.min(this.lengths[this.slotAt[r]!]!, cap) * D;
            for (let h = 0; h < KVH; h++) {
              const x = (r * KVH + h) * old.len * D;
              a.set(src.subarray(x, x + n), (r * KVH + h) * cap * D);
            }
          }
        return a;
      });
    this.store = { len: cap, keys: layer(old.keys), values: layer(old.values) };
  }

  /**
   * Grows the buffers for a step whose longest slot will hold `longest` tokens, or shrinks them once every slot
   * holds far fewer than they have room for: a decode step attends over the whole capacity (its padding masked), so
   * room kept for a long context that has since been released would cost every later step.
   */
  private fit(longest: number): void {
    const cap = this.store.len;
    if (longest > cap) return this.relayout(Math.min(this.maxLen, longest + SLACK));
    let held = longest;
    for (const n of this.lengths) held = Math.max(held, n);
    if (cap > held + 2 * SLACK) this.relayout(Math.min(this.maxLen, held + SLACK));
  }

  kvTruncate(slot: number, length: number): void {
    this.checkSlot(slot);
    if (!Number.isInteger(length) || length < 0 || length > this.lengths[slot]!) throw new RlstreamError('INPUT_INVALID', `kvTruncate: slot ${slot} holds ${this.lengths[slot]} tokens, cannot keep ${length}`);
    this.lengths[slot] = length;
  }

  async extend(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature?: Float32Array, out?: Float32Array, weights?: number): Promise<Float32Array> {
    const c = this.config;
    const runner = this.runnerFor(weights);
    const B = slots.length;
    const maxLen = this.maxLen;
    let total = 0;
    let longest = 0;
    const seen = new Set<number>();
    for (let b = 0; b < B; b++) {
      this.checkSlot(slots[b]!);
      if (seen.has(slots[b]!)) throw new RlstreamError('INPUT_INVALID', `extend: slot ${slots[b]} appears twice in one step`);
      seen.add(slots[b]!);
      const n = counts[b]!;
      if (!Number.isInteger(n) || n < 1) throw new RlstreamError('INPUT_INVALID', `extend: row ${b} appends ${n} tokens; at least 1`);
      if (this.lengths[slots[b]!]! + n > maxLen) throw new RlstreamError('INPUT_INVALID', `extend: slot ${slots[b]} would hold ${this.lengths[slots[b]!]! + n} tokens, more than maxLen ${maxLen}`);
      total += n;
      longest = Math.max(longest, this.lengths[slots[b]!]! + n);
    }
    if (tokens.length !== total) throw new RlstreamError('INPUT_INVALID', `extend: counts add up to ${total} tokens, got ${tokens.length}`);
    this.fit(longest);
    const V = c.vocab_size;
    const probs = out ?? new Float32Array(B * V);
    // One-token rows (decodes) and rows with several (prefills) run apart; each part's rows land in the caller's order.
    const one: number[] = [];
    const many: number[] = [];
    for (let b = 0; b < B; b++) (counts[b] === 1 ? one : many).push(b);
    const offsets = new Int32Array(B);
    for (let b = 1; b < B; b++) offsets[b] = offsets[b - 1]! + counts[b - 1]!;
    const pick = <T extends Int32Array | Float32Array>(a: T, rows: number[]): T => {
      const r = new (a.constructor as new (n: number) => T)(rows.length);
      rows.forEach((b, i) => (r[i] = a[b]!));
      return r;
    };
    const invOf = (rows: number[]) => (invTemperature ? pick(invTemperature, rows) : undefined);
    if (one.length > 0) {
      const part = await this.decodeRows(runner, pick(slots, one), Int32Array.from(one, (b) => tokens[offsets[b]!]!), invOf(one));
      one.forEach((b, i) => probs.set(part.subarray(i * V, (i + 1) * V), b * V));
    }
    if (many.length > 0) {
      const manyTokens = new Int32Array(many.reduce((n, b) => n + counts[b]!, 0));
      let at = 0;
      for (const b of many) {
        manyTokens.set(tokens.subarray(offsets[b]!, offsets[b]! + counts[b]!), at);
        at += counts[b]!;
      }
      const part = await this.gathered(runner, pick(slots, many), pick(counts, many), manyTokens, invOf(many));
      many.forEach((b, i) => probs.set(part.subarray(i * V, (i + 1) * V), b * V));
    }
    return probs;
  }

  /**
   * Moves the given slots into one window of slots.length consecutive rows of the buffers and returns its first row:
   * the window starts at the lowest row among them (as far as it fits), and each of them outside it swaps rows with
   * a slot inside that is not in the step (only the tokens either holds are copied). Steps of two versions taking
   * turns (each its own set of slots) each keep their own window, so they swap nothing once laid out.
   */
  private lead(slots: Int32Array): number {
    const N = slots.length;
    const R = this.slotAt.length;
    let start = R - N;
    for (const s of slots) start = Math.min(start, this.rowOf[s]!);
    const inSet = new Uint8Array(R);
    for (const s of slots) inSet[s] = 1;
    const free: number[] = [];
    for (let r = start; r < start + N; r++) if (!inSet[this.slotAt[r]!]) free.push(r);
    for (const s of slots) {
      const from = this.rowOf[s]!;
      if (from < start || from >= start + N) this.swapRows(from, free.pop()!);
    }
    return start;
  }

  private swapRows(a: number, b: number): void {
    const { num_key_value_heads: KVH, head_dim: D } = this.config;
    const cap = this.store.len;
    const sa = this.slotAt[a]!;
    const sb = this.slotAt[b]!;
    const n = Math.max(this.lengths[sa]!, this.lengths[sb]!) * D;
    const tmp = new Float32Array(n);
    for (const buffers of [this.store.keys, this.store.values])
      for (const buf of buffers)
        for (let h = 0; h < KVH; h++) {
          const x = (a * KVH + h) * cap * D;
          const y = (b * KVH + h) * cap * D;
          tmp.set(buf.subarray(x, x + n));
          buf.copyWithin(x, y, y + n);
          buf.set(tmp, y);
        }
    this.slotAt[a] = sb;
    this.slotAt[b] = sa;
    this.rowOf[sa] = b;
    this.rowOf[sb] = a;
  }

  /**
   * One token for each of `slots`, on the buffers as they are once those slots fill the leading rows: buffer row
   * r runs the token of the b whose slot sits there, and the rows come back in the caller's order.
   */
  private async decodeRows(runner: PolicyRunner, slots: Int32Array, tokens: Int32Array, invTemperature: Float32Array | undefined): Promise<Float32Array> {
    const { num_key_value_heads: KVH, head_dim: D, num_hidden_layers: numLayers, vocab_size: V } = this.config;
    const N = slots.length;
    const first = this.lead(slots);
    const cap = this.store.len;
    const bOf = new Int32Array(N);
    slots.forEach((slot, b) => (bOf[this.rowOf[slot]! - first] = b));
    const ids = new BigInt64Array(N);
    const pos = new BigInt64Array(N);
    const inv = new Float32Array(N);
    const pastBias = new Float32Array(N * cap).fill(MASKED);
    for (let r = 0; r < N; r++) {
      const b = bOf[r]!;
      const len = this.lengths[slots[b]!]!;
      ids[r] = BigInt(tokens[b]!);
      pos[r] = BigInt(len);
      inv[r] = invTemperature ? invTemperature[b]! : 1;
      pastBias.fill(0, r * cap, r * cap + len);
    }
    // The graph reads rows [first, first + N) of the buffers, through views (runner.ts takes their first N rows).
    const at = first * KVH * cap * D;
    const window = { len: cap, keys: this.store.keys.map((k) => k.subarray(at)), values: this.store.values.map((v) => v.subarray(at)) };
    const out = await runner.decode({ batch: N, inputIds: ids, positionIds: pos, pastBias, past: window, invTemperature: inv });
    // Plain loops: a column is only headDim floats, too short for subarray() + set() to pay off.
    const column = out.column;
    for (let l = 0; l < numLayers; l++) {
      const k = this.store.keys[l]!;
      const v = this.store.values[l]!;
      for (let r = 0; r < N; r++) {
        const len = this.lengths[slots[bOf[r]!]!]!;
        const srcK = (r * numLayers + l) * 2 * KVH * D;
        const srcV = srcK + KVH * D;
        for (let h = 0; h < KVH; h++) {
          const dst = (((first + r) * KVH + h) * cap + len) * D;
          for (let d = 0; d < D; d++) {
            k[dst + d] = column[srcK + h * D + d]!;
            v[dst + d] = column[srcV + h * D + d]!;
          }
        }
      }
    }
    for (const slot of slots) this.lengths[slot]!++;
    const probs = new Float32Array(N * V);
    for (let r = 0; r < N; r++) probs.set(out.probs.subarray(r * V, (r + 1) * V), bOf[r]! * V);
    return probs;
  }

  /** Any step: its slots' cached tokens gathered into one batch, the new tokens left-padded to the longest. */
  private async gathered(runner: PolicyRunner, slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array | undefined): Promise<Float32Array> {
    const c = this.config;
    const B = slots.length;
    const { kv: past, starts } = gatherRows(
      c,
      Array.from(slots, (slot) => ({ kv: this.store, batch: this.lengths.length, row: this.rowOf[slot]!, cols: range(this.lengths[slot]!) })),
    );
    const Tp = past.len;
    const S = Math.max(...counts);
    const ids = new BigInt64Array(B * S);
    const pos = new BigInt64Array(B * S);
    const pastBias = new Float32Array(B * S * Tp).fill(MASKED);
    const newBias = new Float32Array(B * S * S).fill(MASKED);
    for (let b = 0, t = 0; b < B; t += counts[b]!, b++) {
      const n = counts[b]!;
      const pad = S - n;
      const cached = this.lengths[slots[b]!]!;
      for (let i = 0; i < S; i++) {
        const r = b * S + i;
        if (i < pad) {
          newBias[r * S + i] = 0; // padding attends to itself only, so its softmax stays finite
          continue;
        }
        ids[r] = BigInt(tokens[t + i - pad]!);
        pos[r] = BigInt(cached + i - pad);
        pastBias.fill(0, r * Tp + starts[b]!, (r + 1) * Tp);
        newBias.fill(0, r * S + pad, r * S + i + 1);
      }
    }
    const run = await runner.run({ batch: B, seq: S, inputIds: ids, positionIds: pos, pastBias, newBias, past, invTemperature: invTemperature ?? new Float32Array(B).fill(1) });
    // Each row's new K/V (the last counts[b] columns of its padded row) after what its slot holds.
    const KVH = c.num_key_value_heads;
    const D = c.head_dim;
    for (let b = 0; b < B; b++) {
      const slot = slots[b]!;
      const n = counts[b]!;
      const at = this.lengths[slot]!;
      for (let l = 0; l < c.num_hidden_layers; l++) {
        for (const [fresh, dst] of [
          [run.fresh.keys[l]!, this.store.keys[l]!],
          [run.fresh.values[l]!, this.store.values[l]!],
        ] as const) {
          for (let h = 0; h < KVH; h++) {
            const src = ((b * KVH + h) * S + S - n) * D;
            dst.set(fresh.subarray(src, src + n * D), ((this.rowOf[slot]! * KVH + h) * this.store.len + at) * D);
          }
        }
      }
      this.lengths[slot] = at + n;
    }
    return run.probs!;
  }

  /** Whether a version's onnxruntime session (default the newest) still runs (PolicyRunner.healthy: one token through each graph). */
  async healthy(weights?: number): Promise<boolean> {
    const r = this.sets.get(weights ?? this.newest);
    return r !== undefined && (await r.healthy());
  }

  async release(): Promise<void> {
    for (const r of this.sets.values()) await r.release();
  }

  private checkSlot(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.lengths.length) throw new RlstreamError('INPUT_INVALID', `slot ${slot} is outside the cache's ${this.lengths.length} slots (kvReserve first)`);
  }
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}
