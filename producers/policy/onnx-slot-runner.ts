// The ONNX runner (runner.ts, onnxruntime-node) as a SlotRunner, so the one continuous-batching scheduler
// (native-engine.ts) drives it as it drives the native core. The slots' K/V live on the host in one
// [slots, kvHeads, capacity, headDim] buffer per layer and K/V, the capacity grown in steps with the longest slot
// (up to maxLen). A decode step of every slot feeds those buffers to the one-token graph as they are (no copy; its
// rows permuted into slot order) and writes the new column in place; any other step gathers its slots' cached
// tokens into a right-aligned batch (kv.ts), runs the new tokens left-padded to the longest (the engine's prefill
// layout) and writes each slot's new K/V after its cached ones. It holds weights by policy version, one
// onnxruntime session each (several at once for rollout.interrupt 'finish'); a step names the version it runs.
import { RlstreamError } from '../../core/errors.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { MASKED } from './export.ts';
import { gatherRows } from './kv.ts';
import { PolicyRunner, type KvTensors } from './runner.ts';
import type { SlotRunner } from './slot-runner.ts';

export class OnnxSlotRunner implements SlotRunner {
  private store: KvTensors = { len: 0, keys: [], values: [] };
  private lengths = new Int32Array(0);
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

  /** Tokens a slot's buffers have room for now (grown with the longest slot, up to maxLen). */
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
    this.store = { len: 0, keys: [], values: [] };
    this.grow(Math.min(maxLen, 16));
  }

  /** Re-lays the buffers out with room for `cap` tokens a slot (the tokens held are kept). */
  private grow(cap: number): void {
    const { num_key_value_heads: KVH, head_dim: D, num_hidden_layers: numLayers } = this.config;
    const rows = this.lengths.length * KVH;
    const old = this.store;
    const layer = (from: Float32Array[]) =>
      Array.from({ length: numLayers }, (_, l) => {
        const a = new Float32Array(rows * cap * D);
        const src = from[l];
        if (src) for (let r = 0; r < rows; r++) a.set(src.subarray(r * old.len * D, (r * old.len + Math.min(old.len, cap)) * D), r * cap * D);
        return a;
      });
    this.store = { len: cap, keys: layer(old.keys), values: layer(old.values) };
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
    if (longest > this.store.len) this.grow(Math.min(maxLen, Math.max(longest, Math.ceil(this.store.len * 1.5))));
    const probs = total === B && B === this.lengths.length ? await this.decodeAll(runner, slots, tokens, invTemperature) : await this.gathered(runner, slots, counts, tokens, invTemperature);
    if (!out) return probs;
    out.set(probs.subarray(0, B * c.vocab_size));
    return out;
  }

  /**
   * One token for every slot, on the buffers as they are: store row r runs the token of the b with slots[b] = r,
   * and the rows come back in the caller's order.
   */
  private async decodeAll(runner: PolicyRunner, slots: Int32Array, tokens: Int32Array, invTemperature: Float32Array | undefined): Promise<Float32Array> {
    const { num_key_value_heads: KVH, head_dim: D, num_hidden_layers: numLayers, vocab_size: V } = this.config;
    const N = slots.length;
    const cap = this.store.len;
    const rowOf = new Int32Array(N).fill(-1);
    slots.forEach((slot, b) => (rowOf[slot] = b));
    const ids = new BigInt64Array(N);
    const pos = new BigInt64Array(N);
    const inv = new Float32Array(N);
    const pastBias = new Float32Array(N * cap).fill(MASKED);
    for (let r = 0; r < N; r++) {
      const b = rowOf[r]!;
      ids[r] = BigInt(tokens[b]!);
      pos[r] = BigInt(this.lengths[r]!);
      inv[r] = invTemperature ? invTemperature[b]! : 1;
      pastBias.fill(0, r * cap, r * cap + this.lengths[r]!);
    }
    const out = await runner.decode({ batch: N, inputIds: ids, positionIds: pos, pastBias, past: this.store, invTemperature: inv });
    // Plain loops: a column is only headDim floats, too short for subarray() + set() to pay off (as in slots.ts).
    const column = out.column;
    for (let l = 0; l < numLayers; l++) {
      const k = this.store.keys[l]!;
      const v = this.store.values[l]!;
      for (let r = 0; r < N; r++) {
        const srcK = (r * numLayers + l) * 2 * KVH * D;
        const srcV = srcK + KVH * D;
        for (let h = 0; h < KVH; h++) {
          const dst = ((r * KVH + h) * cap + this.lengths[r]!) * D;
          for (let d = 0; d < D; d++) {
            k[dst + d] = column[srcK + h * D + d]!;
            v[dst + d] = column[srcV + h * D + d]!;
          }
        }
      }
    }
    for (let r = 0; r < N; r++) this.lengths[r]!++;
    const probs = new Float32Array(N * V);
    for (let r = 0; r < N; r++) probs.set(out.probs.subarray(r * V, (r + 1) * V), rowOf[r]! * V);
    return probs;
  }

  /** Any step: its slots' cached tokens gathered into one batch, the new tokens left-padded to the longest. */
  private async gathered(runner: PolicyRunner, slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array | undefined): Promise<Float32Array> {
    const c = this.config;
    const B = slots.length;
    const { kv: past, starts } = gatherRows(
      c,
      Array.from(slots, (slot) => ({ kv: this.store, batch: this.lengths.length, row: slot, cols: range(this.lengths[slot]!) })),
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
            dst.set(fresh.subarray(src, src + n * D), ((slot * KVH + h) * this.store.len + at) * D);
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
