// Token sampling for the built-in policy: a seedable PRNG, temperature / top-k / top-p, and the log-prob that
// is reported with each sampled token.
//
// Log-prob convention (the one SGLang follows): the reported log-prob is that of the sampled token under the
// model distribution scaled by temperature, log_softmax(logits / T), taken BEFORE top-k / top-p truncation and
// without renormalisation. At T = 1 it equals what the trainer recomputes (log_softmax(logits)), so the
// rollout–trainer mismatch is pure numerics; at T != 1 the trainer must divide its logits by the same T to
// compare. Greedy decoding (T = 0) reports log_softmax(logits) at T = 1.
import { RlstreamError } from '../../core/errors.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

/** xoshiro128** seeded through splitmix32: fast, 2^128 period, identical sequences for identical seeds. */
export class Rng {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;

  constructor(seed: number) {
    // Fold a (possibly > 32-bit) integer seed into two words, then expand with splitmix32.
    let x = (seed >>> 0) ^ Math.imul(Math.floor(seed / 0x100000000) >>> 0, 0x9e3779b9);
    const next = () => {
      x = (x + 0x9e3779b9) | 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = next();
    this.s1 = next();
    this.s2 = next();
    this.s3 = next();
  }

  /** A uint32. */
  nextU32(): number {
    const r = Math.imul(((Math.imul(this.s1, 5) << 7) | (Math.imul(this.s1, 5) >>> 25)), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = (this.s3 << 11) | (this.s3 >>> 21);
    return r;
  }

  /** Uniform in [0, 1) with 53 bits. */
  next(): number {
    return ((this.nextU32() >>> 5) * 67108864 + (this.nextU32() >>> 6)) / 9007199254740992;
  }

  /** Standard normal (Box–Muller), for random weights. */
  normal(): number {
    const u = 1 - this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * this.next());
  }
}

/** Reject sampling parameters the engine cannot honour; the message names the field. */
export function validateSampling(p: SamplingParams, vocabSize: number): void {
  const bad = (m: string) => new RlstreamError('BACKEND_BAD_REQUEST', `invalid sampling parameters: ${m}`);
  if (typeof p !== 'object' || p === null) throw bad('missing');
  if (!Number.isFinite(p.temperature) || p.temperature < 0) throw bad(`temperature must be finite and >= 0, got ${p.temperature}`);
  if (!Number.isFinite(p.top_p) || p.top_p <= 0 || p.top_p > 1) throw bad(`top_p must be in (0, 1], got ${p.top_p}`);
  if (!Number.isInteger(p.top_k) || p.top_k < 0) throw bad(`top_k must be an integer >= 0, got ${p.top_k}`);
  if (!Number.isInteger(p.max_new_tokens) || p.max_new_tokens < 1) throw bad(`max_new_tokens must be an integer >= 1, got ${p.max_new_tokens}`);
  if (p.seed !== null && p.seed !== undefined && !Number.isSafeInteger(p.seed)) throw bad(`seed must be a safe integer or null, got ${p.seed}`);
  if (!Array.isArray(p.stop_token_ids)) throw bad('stop_token_ids must be an array');
  for (const t of p.stop_token_ids) if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw bad(`stop token ${t} is outside the vocabulary [0, ${vocabSize})`);
}

// Temperatures below this are greedy: dividing by ~0 would overflow and the distribution is a point mass anyway.
const GREEDY_T = 1e-5;

/**
 * Sample one token from `lp` (log_softmax of the logits at T = 1, length V) and return it with its log-prob
 * under the convention in the header. `scratch` is reused between calls to avoid allocation.
 */
export function sampleToken(lp: Float32Array, p: SamplingParams, rng: Rng, scratch: { probs: Float64Array; order: Int32Array }): { token: number; logprob: number } {
  const V = lp.length;
  if (p.temperature < GREEDY_T) {
    let best = 0;
    for (let i = 1; i < V; i++) if (lp[i]! > lp[best]!) best = i;
    return { token: best, logprob: lp[best]! };
  }
  const topK0 = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  if (p.temperature === 1 && topK0 === V && p.top_p >= 1) {
    // Plain multinomial at T = 1: `lp` is already normalised, so walk the CDF of exp(lp) directly and stop at
    // the sampled token (about half the exponentials of a full pass, no max or sum pass); the log-prob is lp.
    let u = rng.next();
    for (let i = 0; i < V; i++) {
      u -= Math.exp(lp[i]!);
      if (u < 0) return { token: i, logprob: lp[i]! };
    }
    // Float rounding left the total just under u: take the last token with any mass.
    let last = V - 1;
    while (last > 0 && lp[last]! === -Infinity) last--;
    return { token: last, logprob: lp[last]! };
  }
  const invT = 1 / p.temperature;
  let max = -Infinity;
  for (let i = 0; i < V; i++) if (lp[i]! > max) max = lp[i]!;
  const probs = scratch.probs;
  let sum = 0;
  for (let i = 0; i < V; i++) {
    const e = Math.exp((lp[i]! - max) * invT);
    probs[i] = e;
    sum += e;
  }
  const logZ = max * invT + Math.log(sum);
  const logprobOf = (t: number) => lp[t]! * invT - logZ;

  const topK = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  if (topK === V && p.top_p >= 1) {
    // Plain multinomial: walk the CDF.
    let u = rng.next() * sum;
    for (let i = 0; i < V; i++) {
      u -= probs[i]!;
      if (u < 0) return { token: i, logprob: logprobOf(i) };
    }
    let last = V - 1;
    while (last > 0 && probs[last] === 0) last--;
    return { token: last, logprob: logprobOf(last) };
  }
  // Truncated: order candidates by probability (ties by token id, so the order is deterministic).
  const order = scratch.order;
  for (let i = 0; i < V; i++) order[i] = i;
  const idx = order.subarray(0, V);
  idx.sort((a, b) => probs[b]! - probs[a]! || a - b);
  let keep = topK;
  if (p.top_p < 1) {
    let cum = 0;
    const target = p.top_p * sum;
    for (let j = 0; j < topK; j++) {
      cum += probs[idx[j]!]!;
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
  }
  let mass = 0;
  for (let j = 0; j < keep; j++) mass += probs[idx[j]!]!;
  let u = rng.next() * mass;
  for (let j = 0; j < keep; j++) {
    const t = idx[j]!;
    u -= probs[t]!;
    if (u < 0) return { token: t, logprob: logprobOf(t) };
  }
  const t = idx[keep - 1]!;
  return { token: t, logprob: logprobOf(t) };
}

export function newScratch(vocabSize: number): { probs: Float64Array; order: Int32Array } {
  return { probs: new Float64Array(vocabSize), order: new Int32Array(vocabSize) };
}
