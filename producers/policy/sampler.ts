// Token sampling for the built-in policy: a seedable PRNG, temperature / top-k / top-p, and the log-prob that
// is reported with each sampled token.
//
// Log-prob convention (the one SGLang follows): the reported log-prob is that of the sampled token under the
// model distribution scaled by temperature, log_softmax(logits / T), taken BEFORE top-k / top-p truncation and
// without renormalisation. At T = 1 it equals what the trainer recomputes (log_softmax(logits)), so the
// rollout–trainer mismatch is pure numerics; at T != 1 the trainer must divide its logits by the same T to
// compare. Greedy decoding (T = 0) reports log_softmax(logits) at T = 1.
// The graph hands over softmax(logits / T) per row (export.ts), so sampling here needs no exp per vocabulary
// entry; the reported log-prob is log(p[token]).
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

/** The inverse temperature the graph scales a row's logits by (greedy rows report log-probs at T = 1). */
export function inverseTemperature(p: SamplingParams): number {
  return isGreedy(p) ? 1 : 1 / p.temperature;
}

/** Greedy rows take the arg-max and draw nothing from the Rng. */
export function isGreedy(p: SamplingParams): boolean {
  return p.temperature < GREEDY_T;
}

/**
 * Rows that are greedy or sample without top-k / top-p truncation. For them sampleToken is one uniform u (none
 * when greedy) and the first token whose cumulative probability exceeds u, a rule the native core applies where
 * the probabilities are (Model.extendSample, Kernels::sample_rows) with the same draw from the same Rng.
 */
export function isUntruncated(p: SamplingParams, vocabSize: number): boolean {
  return isGreedy(p) || ((p.top_k <= 0 || p.top_k >= vocabSize) && p.top_p >= 1);
}

/**
 * Sample one token from `probs` = softmax(logits / T) (the graph's row for this request, computed at
 * inverseTemperature(p)) and return it with log(probs[token]), the log-prob under the convention in the
 * header. Greedy rows take the arg-max and draw nothing; every other row takes exactly one draw from `rng`.
 * `scratch` is reused between calls to avoid allocation.
 */
export function sampleToken(probs: Float32Array, p: SamplingParams, rng: Rng, scratch: { order: Int32Array }): { token: number; logprob: number } {
  const V = probs.length;
  if (isGreedy(p)) {
    let best = 0;
    for (let i = 1; i < V; i++) if (probs[i]! > probs[best]!) best = i;
    return pick(probs, best);
  }
  const topK = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  const u = rng.next();
  if (topK === V && p.top_p >= 1) {
    // Plain multinomial: walk the CDF and stop at the sampled token (about half the row on average).
    let left = u;
    for (let i = 0; i < V; i++) {
      left -= probs[i]!;
      if (left < 0) return pick(probs, i);
    }
    // Float rounding left the total just under u: take the last token with any mass.
    let last = V - 1;
    while (last > 0 && probs[last] === 0) last--;
    return pick(probs, last);
  }
  // Truncated: order candidates by probability (ties by token id, so the order is deterministic).
  const idx = scratch.order.subarray(0, V);
  for (let i = 0; i < V; i++) idx[i] = i;
  idx.sort((a, b) => probs[b]! - probs[a]! || a - b);
  let keep = topK;
  if (p.top_p < 1) {
    let cum = 0;
    for (let j = 0; j < topK; j++) {
      cum += probs[idx[j]!]!;
      if (cum >= p.top_p) {
        keep = j + 1;
        break;
      }
    }
  }
  let mass = 0;
  for (let j = 0; j < keep; j++) mass += probs[idx[j]!]!;
  let left = u * mass;
  for (let j = 0; j < keep; j++) {
    const t = idx[j]!;
    left -= probs[t]!;
    if (left < 0) return pick(probs, t);
  }
  return pick(probs, idx[keep - 1]!);
}

function pick(probs: Float32Array, token: number): { token: number; logprob: number } {
  // log of the float32 probability: within ~1e-7 of log_softmax for any token that can be sampled (a
  // probability below float32's normal range, 1e-38, is never drawn).
  return { token, logprob: Math.log(probs[token]!) };
}

/** The most alternatives per token the engine computes (OpenAI's own limit on top_logprobs). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * The k most probable tokens of `probs` (the same row sampleToken draws from), most probable first, ties by token
 * id, each with log(probs[token]): the alternatives OpenAI's top_logprobs returns, under the convention above.
 */
export function topAlternatives(probs: Float32Array, k: number): { token: number; logprob: number }[] {
  const V = probs.length;
  const n = Math.min(k, V);
  const tokens: number[] = [];
  // A sorted list of at most k: one pass over the row, an insertion only for a token that beats the k-th.
  for (let i = 0; i < V; i++) {
    const p = probs[i]!;
    if (tokens.length === n && !(p > probs[tokens[n - 1]!]!)) continue;
    let at = tokens.length === n ? n - 1 : tokens.length;
    while (at > 0 && probs[tokens[at - 1]!]! < p) at--;
    if (tokens.length === n) tokens.pop();
    tokens.splice(at, 0, i);
  }
  return tokens.map((t) => ({ token: t, logprob: Math.log(probs[t]!) }));
}

export function newScratch(vocabSize: number): { order: Int32Array } {
  return { order: new Int32Array(vocabSize) };
}
