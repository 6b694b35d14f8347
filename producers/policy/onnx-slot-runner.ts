// The ONNX runner (runner.ts, onnxruntime-node) as a SlotRunner, so the one continuous-batching scheduler
// (native-engine.ts) drives it as it drives the native core. The slots' K/V live on the host in one
// [slots, kvHeads, maxLen, headDim] buffer per layer and K/V; a step gathers its slots' cached tokens into a
// right-aligned batch (kv.ts), runs the new tokens left-padded to the longest (the engine's prefill layout,
// which a one-token decode is a case of), and writes each slot's new K/V after its cached ones.
import { RlstreamError } from '../../core/errors.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { PolicyModelConfig } from './config.ts';
import { MASKED } from './export.ts';
import { gatherRows } from './kv.ts';
import { PolicyRunner, type KvTensors } from './runner.ts';
import type { SlotRunner } from './slot-runner.ts';

export class OnnxSlotRunner implements SlotRunner {
  readonly config: { readonly vocab_size: number };
  private store: KvTensors = { len: 0, keys: [], values: [] };
  private lengths = new Int32Array(0);

  private constructor(
    private readonly c: PolicyModelConfig,
    private readonly runner: PolicyRunner,
  ) {
    this.config = Object.freeze({ vocab_size: c.vocabSize });
  }

  /** The graph exported from `weights` in one onnxruntime session of `threads` intra-op threads (default 1). */
  static async create(config: PolicyModelConfig, weights: TensorMap, options: { threads?: number } = {}): Promise<OnnxSlotRunner> {
    return new OnnxSlotRunner(config, await PolicyRunner.create(config, weights, 0, { threads: options.threads ?? 1, decodeGraph: false }));
  }

  kvReserve(slots: number, maxLen: number): void {
    if (!Number.isInteger(slots) || slots < 1 || !Number.isInteger(maxLen) || maxLen < 1) throw new RlstreamError('CONFIG_INVALID', `kvReserve: slots and maxLen must be positive integers, got ${slots} and ${maxLen}`);
    const n = slots * this.c.numKvHeads * maxLen * this.c.headDim;
    const layer = () => Array.from({ length: this.c.numLayers }, () => new Float32Array(n));
    this.store = { len: maxLen, keys: layer(), values: layer() };
    this.lengths = new Int32Array(slots);
  }

  kvTruncate(slot: number, length: number): void {
    this.checkSlot(slot);
    if (!Number.isInteger(length) || length < 0 || length > this.lengths[slot]!) throw new RlstreamError('INPUT_INVALID', `kvTruncate: slot ${slot} holds ${this.lengths[slot]} tokens, cannot keep ${length}`);
    this.lengths[slot] = length;
  }

  async extend(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature?: Float32Array, out?: Float32Array): Promise<Float32Array> {
    const c = this.c;
    const B = slots.length;
    const maxLen = this.store.len;
    let total = 0;
    for (let b = 0; b < B; b++) {
      this.checkSlot(slots[b]!);
      const n = counts[b]!;
      if (!Number.isInteger(n) || n < 1) throw new RlstreamError('INPUT_INVALID', `extend: row ${b} appends ${n} tokens; at least 1`);
      if (this.lengths[slots[b]!]! + n > maxLen) throw new RlstreamError('INPUT_INVALID', `extend: slot ${slots[b]} would hold ${this.lengths[slots[b]!]! + n} tokens, more than maxLen ${maxLen}`);
      total += n;
    }
    if (tokens.length !== total) throw new RlstreamError('INPUT_INVALID', `extend: counts add up to ${total} tokens, got ${tokens.length}`);
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
    const run = await this.runner.run({ batch: B, seq: S, inputIds: ids, positionIds: pos, pastBias, newBias, past, invTemperature: invTemperature ?? new Float32Array(B).fill(1) });
    // Each row's new K/V (the last counts[b] columns of its padded row) after what its slot holds.
    const KVH = c.numKvHeads;
    const D = c.headDim;
    for (let b = 0; b < B; b++) {
      const slot = slots[b]!;
      const n = counts[b]!;
      const at = this.lengths[slot]!;
      for (let l = 0; l < c.numLayers; l++) {
        for (const [fresh, dst] of [
          [run.fresh.keys[l]!, this.store.keys[l]!],
          [run.fresh.values[l]!, this.store.values[l]!],
        ] as const) {
          for (let h = 0; h < KVH; h++) {
            const src = ((b * KVH + h) * S + S - n) * D;
            dst.set(fresh.subarray(src, src + n * D), ((slot * KVH + h) * maxLen + at) * D);
          }
        }
      }
      this.lengths[slot] = at + n;
    }
    const probs = run.probs!;
    if (!out) return probs;
    out.set(probs.subarray(0, B * c.vocabSize));
    return out;
  }

  release(): Promise<void> {
    return this.runner.release();
  }

  private checkSlot(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.lengths.length) throw new RlstreamError('INPUT_INVALID', `slot ${slot} is outside the cache's ${this.lengths.length} slots (kvReserve first)`);
  }
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}
