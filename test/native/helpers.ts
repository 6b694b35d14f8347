// Shared fixtures of the native tests: tiny configs, packed batches, and comparisons against the reference.
import assert from 'node:assert/strict';
import type { Model, ModelConfig, PackedBatch } from '../../native/index.ts';
import type { RefParams } from '../../native/reference.ts';

export const TINY: ModelConfig = {
  hidden_size: 8,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  intermediate_size: 12,
  vocab_size: 11,
  rope_theta: 10000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: false,
  max_position_embeddings: 160,
  attention_bias: true,
};

// A deterministic pseudo-random stream (mulberry32, core/random.ts) so fixtures are stable.
export { rng } from '../../core/random.ts';

/** Packs sequences; targets[t] = next token of the same sequence, -1 at each sequence's last position. */
export function pack(seqs: number[][]): { batch: PackedBatch; targets: Int32Array; responseMask: Float32Array } {
  const tokens = seqs.flat();
  const seqStarts = [0];
  const targets: number[] = [];
  for (const s of seqs) {
    seqStarts.push(seqStarts[seqStarts.length - 1]! + s.length);
    for (let i = 0; i < s.length; i++) targets.push(i + 1 < s.length ? s[i + 1]! : -1);
  }
  return {
    batch: { tokens: Int32Array.from(tokens), seqStarts: Int32Array.from(seqStarts) },
    targets: Int32Array.from(targets),
    responseMask: Float32Array.from(targets.map((t) => (t >= 0 ? 1 : 0))),
  };
}

export function randomSeqs(r: () => number, lengths: number[], vocab: number): number[][] {
  return lengths.map((n) => Array.from({ length: n }, () => Math.floor(r() * vocab)));
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** One slot, one token: the per-slot arrays Model.extend takes. */
export const one = (x: number): Int32Array => Int32Array.of(x);

export function argmax(row: Float32Array): number {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i]! > row[best]!) best = i;
  return best;
}

/** Log-probs the full forward gives to each token of `seq` after position `from` (targets = next tokens). */
export async function fullLogprobs(m: Model, seq: number[], from: number): Promise<Float32Array> {
  const { batch, targets } = pack([seq]);
  return (await m.forward(batch, targets)).logprobs.slice(from - 1, seq.length - 1);
}

/**
 * Greedy decoding of `steps` tokens in one slot through the KV cache, from `probs` (the distribution after what the
 * slot holds): each token goes onto `seq` and its log-prob onto `logprobs`. Returns the distribution after the last.
 */
export async function decodeGreedy(m: Model, slot: number, probs: Float32Array, steps: number, seq: number[], logprobs: number[]): Promise<Float32Array> {
  for (let i = 0; i < steps; i++) {
    const tok = argmax(probs);
    logprobs.push(Math.log(probs[tok]!));
    seq.push(tok);
    probs = await m.extend(one(slot), one(1), one(tok));
  }
  return probs;
}

/**
 * Native gradients against central finite differences (h = 1e-5) of `loss` over the float64 parameters `params`
 * (every tensor, or those `only` matches): relative L2 error < 1e-3 per tensor and every element within
 * 1e-3 * max|g_fd| + 1e-3 * |g_fd|. Asserts the finite-difference gradient is not zero everywhere.
 */
export function checkGradients(native: Map<string, { data: Float32Array }>, params: RefParams, loss: (p: RefParams) => number, only?: RegExp): void {
  const h = 1e-5;
  for (const [name, ref] of params) {
    if (only && !only.test(name)) continue;
    const g = native.get(name)!.data;
    const fd = new Float64Array(ref.length);
    for (let i = 0; i < ref.length; i++) {
      const x = ref[i]!;
      ref[i] = x + h;
      const up = loss(params);
      ref[i] = x - h;
      const down = loss(params);
      ref[i] = x;
      fd[i] = (up - down) / (2 * h);
    }
    let num = 0;
    let den = 0;
    let maxFd = 0;
    for (let i = 0; i < fd.length; i++) {
      num += (g[i]! - fd[i]!) ** 2;
      den += fd[i]! ** 2;
      maxFd = Math.max(maxFd, Math.abs(fd[i]!));
    }
    assert.ok(den > 0, `${name}: finite-difference gradient is zero everywhere, the check would be vacuous`);
    const rel = Math.sqrt(num / den);
    assert.ok(rel < 1e-3, `${name}: relative error ${rel.toExponential(2)} (|fd| = ${Math.sqrt(den).toExponential(2)})`);
    for (let i = 0; i < fd.length; i++)
      assert.ok(Math.abs(g[i]! - fd[i]!) <= 1e-3 * maxFd + 1e-3 * Math.abs(fd[i]!), `${name}[${i}]: native ${g[i]} vs finite difference ${fd[i]}`);
  }
}
