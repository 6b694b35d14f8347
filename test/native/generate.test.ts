// Incremental decoding on the native core (Model.kvReserve / extend): the KV-cache path against the model's own
// full-sequence forward on the same tokens, slots batched against each alone, multi-turn reuse, join/leave between
// steps, in-place weight updates, and the errors. CPU fp32: agreement to ~1e-5.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { Model, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { TINY, argmax, decodeGreedy, fullLogprobs, maxAbsDiff, one, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const CFG: ModelConfig = { ...TINY, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 };
const V = CFG.vocab_size;

function model(seed = 7): Model {
  return Model.init(CFG, { seed, threads: 2, initStd: 0.3 });
}

test('a greedy continuation through the KV cache has the log-probs of the full forward on the same tokens', { skip }, async () => {
  const m = model();
  m.kvReserve(2, 64);
  const prompt = randomSeqs(rng(1), [7], V)[0]!;
  const seq = [...prompt];
  const got: number[] = [];
  await decodeGreedy(m, 1, await m.extend(one(1), one(prompt.length), Int32Array.from(prompt)), 20, seq, got);
  assert.equal(m.kvLength(1), seq.length);
  assert.equal(m.kvLength(0), 0);
  const want = await fullLogprobs(m, seq, prompt.length);
  const d = maxAbsDiff(got, want);
  assert.ok(d < 1e-5, `max |KV log-prob - forward log-prob| = ${d}`);
  assert.ok(new Set(seq.slice(prompt.length)).size > 1, 'the continuation is not one token repeated (a weak check otherwise)');
  m.dispose();
});

test('the returned rows are softmax(logits * invTemperature): temperature 0.5 squares and renormalises', { skip }, async () => {
  const m = model();
  m.kvReserve(2, 16);
  const toks = Int32Array.of(3, 9, 4);
  const p1 = await m.extend(Int32Array.of(0, 1), Int32Array.of(3, 3), Int32Array.from([...toks, ...toks]), Float32Array.of(1, 2));
  const a = p1.subarray(0, V);
  const b = p1.subarray(V);
  let z = 0;
  for (let i = 0; i < V; i++) z += a[i]! * a[i]!;
  let sum = 0;
  for (let i = 0; i < V; i++) {
    sum += b[i]!;
    assert.ok(Math.abs(b[i]! - (a[i]! * a[i]!) / z) < 1e-6, `row ${i}`);
  }
  assert.ok(Math.abs(sum - 1) < 1e-5);
  m.dispose();
});

test('slots decoded together in one batch, of different lengths, joining and leaving, equal each decoded alone', { skip }, async () => {
  const r = rng(2);
  const prompts = randomSeqs(r, [3, 9, 17, 5], V);
  const feeds = randomSeqs(r, [6, 6, 6, 6], V); // tokens fed at each decode step (the sampler's choice does not matter here)
  const together = model();
  together.kvReserve(5, 64);
  // Step 0: sequences 0, 1, 2 prefill together in slots 0, 2, 4. Steps 1-5 decode them; sequence 1 leaves after step
  // 2 and sequence 3 joins at step 3 in the slot it freed (whose stale K/V must not leak), its prompt prefilled in
  // the same call as the others' decode token.
  const rows = new Map<string, Float32Array>();
  const slotOf = [0, 2, 4, 2];
  let p = await together.extend(Int32Array.of(0, 2, 4), Int32Array.of(3, 9, 17), Int32Array.from([...prompts[0]!, ...prompts[1]!, ...prompts[2]!]));
  for (let b = 0; b < 3; b++) rows.set(`${b}:0`, p.slice(b * V, (b + 1) * V));
  const fed = [0, 0, 0, 0];
  for (let step = 1; step <= 5; step++) {
    const seqs = step <= 2 ? [0, 1, 2] : [0, 2, 3];
    const slots: number[] = [];
    const counts: number[] = [];
    const toks: number[] = [];
    for (const s of seqs) {
      slots.push(slotOf[s]!);
      if (s === 3 && step === 3) {
        counts.push(prompts[3]!.length);
        toks.push(...prompts[3]!);
      } else {
        counts.push(1);
        toks.push(feeds[s]![fed[s]!]!);
        fed[s]!++;
      }
    }
    p = await together.extend(Int32Array.from(slots), Int32Array.from(counts), Int32Array.from(toks));
    seqs.forEach((s, b) => rows.set(`${s}:${s === 3 ? step - 3 : fed[s]}`, p.slice(b * V, (b + 1) * V)));
    if (step === 2) together.kvTruncate(slotOf[1]!, 0); // leaves: its slot is free again
  }
  assert.equal(together.kvLength(2), prompts[3]!.length + 2);
  // Each alone, on a model with the same weights and a cache of one slot.
  const alone = model();
  alone.kvReserve(1, 64);
  let worst = 0;
  for (let s = 0; s < 4; s++) {
    alone.kvTruncate(0, 0);
    let q = await alone.extend(one(0), one(prompts[s]!.length), Int32Array.from(prompts[s]!));
    for (let i = 0; ; i++) {
      const want = rows.get(`${s}:${i}`);
      if (!want) break;
      worst = Math.max(worst, maxAbsDiff(q, want));
      q = await alone.extend(one(0), one(1), one(feeds[s]![i]!));
    }
  }
  assert.equal(rows.size, 6 + 3 + 6 + 3, 'every row was compared');
  // Batched and alone run products of different shapes (one row or several), so BLAS sums in a different order:
  // fp32 agreement to a few units in the last place, where K/V leaking from the slot's earlier sequence would
  // move probabilities by orders of magnitude more.
  assert.ok(worst < 1e-5, `max |batched - alone| over every probability = ${worst}`);
  together.dispose();
  alone.dispose();
});

test('a multi-turn slot (prefill, decode, prefill the next observation, decode) equals a fresh full forward', { skip }, async () => {
  const m = model(11);
  m.kvReserve(1, 96);
  const [p1, obs] = randomSeqs(rng(5), [12, 6], V) as [number[], number[]];
  const seq: number[] = [];
  const got: number[] = []; // log-prob of every token after the first prompt, in order, from the KV path
  seq.push(...p1);
  const last = await decodeGreedy(m, 0, await m.extend(one(0), one(p1.length), Int32Array.from(p1)), 8, seq, got);
  // the next observation's tokens: their log-probs under the previous turn's last distribution and then their own
  got.push(Math.log(last[obs[0]!]!));
  const second = await m.extend(one(0), one(obs.length), Int32Array.from(obs));
  seq.push(...obs);
  await decodeGreedy(m, 0, second, 8, seq, got);
  assert.equal(m.kvLength(0), seq.length);
  const full = await fullLogprobs(m, seq, p1.length);
  // KV-path log-probs exist for the decoded tokens and the first observation token; the rest of the observation
  // was prefilled (its log-probs are not returned), so compare at those positions only.
  const at: number[] = [];
  for (let i = 0; i < 8; i++) at.push(i);
  at.push(8);
  for (let i = 0; i < 8; i++) at.push(8 + obs.length + i);
  const want = at.map((i) => full[i]!);
  const d = maxAbsDiff(got, want);
  assert.ok(d < 1e-5, `max |multi-turn KV log-prob - full forward| = ${d}`);
  m.dispose();
});

test('a trainer step changes what the next extend computes, in place (no export, no reload)', { skip }, async () => {
  const m = model(3);
  m.kvReserve(2, 32);
  const seq = randomSeqs(rng(9), [10], V)[0]!;
  const before = await m.extend(one(0), one(seq.length), Int32Array.from(seq));
  const { batch, targets, responseMask } = pack([seq]);
  await m.backwardCrossEntropy(batch, targets, responseMask);
  await m.adamwStep({ lr: 0.05, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
  const after = await m.extend(one(1), one(seq.length), Int32Array.from(seq));
  assert.ok(maxAbsDiff(before, after) > 1e-3, 'the update is visible to decoding');
  // ...and equals the full forward of the updated weights
  const probe = [...seq, argmax(after)];
  const want = await fullLogprobs(m, probe, seq.length);
  assert.ok(Math.abs(Math.log(after[probe[seq.length]!]!) - want[0]!) < 1e-5);
  m.dispose();
});

test('bad extend calls fail with the problem named and leave the cache as it was', { skip }, async () => {
  const m = model();
  const bad = (re: RegExp) => (e: unknown) => isRlstreamError(e) && e.code === 'NATIVE_INVALID_ARGUMENT' && re.test(e.message);
  await assert.rejects(m.extend(one(0), one(1), one(1)), bad(/no kv cache reserved/));
  assert.throws(() => m.kvReserve(0, 8), bad(/slots must be >= 1/));
  assert.throws(() => m.kvReserve(2, 129), bad(/maxLen must be in \[1, max_position_embeddings = 128\]/));
  m.kvReserve(2, 8);
  await m.extend(one(0), one(5), Int32Array.of(1, 2, 3, 4, 5));
  await assert.rejects(m.extend(one(0), one(4), Int32Array.of(1, 2, 3, 4)), bad(/slot 0 holds 5 tokens; 4 more exceed maxLen 8/));
  await assert.rejects(m.extend(one(2), one(1), one(1)), bad(/slot 2 is out of range \[0, 2\)/));
  await assert.rejects(m.extend(Int32Array.of(1, 1), Int32Array.of(1, 1), Int32Array.of(1, 2)), bad(/slot 1 appears twice/));
  await assert.rejects(m.extend(one(1), one(2), one(1)), bad(/counts add up to 2 but tokens has 1/));
  await assert.rejects(m.extend(one(1), one(1), one(V)), bad(/tokens\[0\] = 61 is out of range/));
  await assert.rejects(m.extend(one(1), one(1), one(1), Float32Array.of(0)), bad(/invTemperature\[0\] must be finite and > 0/));
  assert.throws(() => m.kvTruncate(0, 6), bad(/slot 0 holds 5 tokens, cannot keep 6/));
  assert.equal(m.kvLength(0), 5);
  assert.equal(m.kvLength(1), 0);
  m.dispose();
});

test('extendSample draws on the device what sampleToken draws on the host rows, for the same uniforms', { skip }, async () => {
  const { Rng, sampleToken, newScratch } = await import('../../producers/policy/sampler.ts');
  const a = model(21);
  const b = model(21);
  a.kvReserve(8, 32);
  b.kvReserve(8, 32);
  const prompts = randomSeqs(rng(30), [4, 1, 9, 6, 3, 7, 2, 5], V);
  const slots = Int32Array.from({ length: 8 }, (_, i) => i);
  const counts = Int32Array.from(prompts.map((p) => p.length));
  const toks = Int32Array.from(prompts.flat());
  const inv = Float32Array.of(1, 1, 2, 0.5, 1, 1, 1.25, 1);
  const r = new Rng(99);
  const u = Float64Array.of(0, -1, r.next(), r.next(), 0.999999, r.next(), -1, r.next());
  const rows = await a.extend(slots, counts, toks, inv);
  const got = await b.extendSample(slots, counts, toks, inv, u);
  const scratch = newScratch(V);
  for (let i = 0; i < 8; i++) {
    // sampleToken with an Rng whose next() is u[i]: a greedy row (temperature 0) draws nothing
    const row = rows.subarray(i * V, (i + 1) * V);
    const fixed = { next: () => u[i]! } as unknown as InstanceType<typeof Rng>;
    const p = { temperature: u[i]! < 0 ? 0 : 1 / inv[i]!, top_p: 1, top_k: 0, max_new_tokens: 1, seed: null, stop_token_ids: [] };
    const want = sampleToken(row, p as never, fixed, scratch);
    assert.equal(got.tokens[i], want.token, `row ${i} (u ${u[i]})`);
    assert.ok(Math.abs(got.logprobs[i]! - want.logprob) < 1e-6, `row ${i} log-prob`);
  }
  assert.equal(a.kvLength(3), b.kvLength(3));
  await assert.rejects(b.extendSample(Int32Array.of(0), Int32Array.of(1), Int32Array.of(1), Float32Array.of(1), Float64Array.of(1)), /uniforms\[0\] must be in \[0, 1\)/);
  a.dispose();
  b.dispose();
});
