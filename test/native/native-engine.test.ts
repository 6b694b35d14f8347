// The generation engine on the native core (producers/policy/native-engine.ts) on the CPU device: sampled tokens'
// log-probs against the model's full forward, seeded sampling, stop tokens and max_new_tokens, continuous batching
// (more requests than slots, joining and leaving) equal to each request alone, and a session's next turn reusing
// its slot, and finished turns handed back with the next step already launched.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Model, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import type { GenerateResult } from '../../producers/backends/types.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { TINY, maxAbsDiff, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const CFG: ModelConfig = { ...TINY, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 };
const V = CFG.vocab_size;

function sampling(o: Partial<SamplingParams> = {}): SamplingParams {
  return { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 12, seed: 1, stop_token_ids: [], ...o } as SamplingParams;
}

async function forwardLogprobs(m: Model, prompt: number[], out: number[]): Promise<number[]> {
  const { batch, targets } = pack([[...prompt, ...out]]);
  const { logprobs } = await m.forward(batch, targets);
  return Array.from(logprobs.slice(prompt.length - 1, prompt.length - 1 + out.length));
}

test('sampled tokens (top-k, top-p, seeded) carry the log-probs of the full forward on the same tokens', { skip }, async () => {
  const m = Model.init(CFG, { seed: 5, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 4, maxLen: 64 });
  const prompts = randomSeqs(rng(4), [5, 11, 2, 8], V);
  const params = [sampling({ seed: 1 }), sampling({ seed: 2, top_k: 10 }), sampling({ seed: 3, top_p: 0.8 }), sampling({ seed: 4, top_k: 5, top_p: 0.9 })];
  const results = await Promise.all(prompts.map((p, i) => engine.generate({ requestId: `r${i}`, promptIds: p, sampling: params[i]! })));
  for (let i = 0; i < 4; i++) {
    const r = results[i]!;
    assert.equal(r.tokenIds.length, 12);
    assert.equal(r.finishReason, 'length');
    const want = await forwardLogprobs(m, prompts[i]!, r.tokenIds);
    const d = maxAbsDiff(r.logprobs, want);
    assert.ok(d < 1e-5, `request ${i}: max |sampled log-prob - forward| = ${d}`);
  }
  assert.equal(engine.stats().steps, 12, 'the four requests decoded together, one step per token');
  engine.close();
  m.dispose();
});

test('sampling is seeded: the same seed gives the same tokens, another seed others', { skip }, async () => {
  const m = Model.init(CFG, { seed: 5, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 3, maxLen: 64 });
  const prompt = [1, 2, 3, 4];
  const [a, b, c] = await Promise.all([7, 7, 8].map((seed, i) => engine.generate({ requestId: `s${i}`, promptIds: prompt, sampling: sampling({ seed, max_new_tokens: 20 }) })));
  assert.deepEqual(a!.tokenIds, b!.tokenIds);
  assert.notDeepEqual(a!.tokenIds, c!.tokenIds);
  engine.close();
  m.dispose();
});

test('a stop token ends the turn (kept as its last token); max_new_tokens ends it with length', { skip }, async () => {
  const m = Model.init(CFG, { seed: 5, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 2, maxLen: 64 });
  const prompt = [9, 8, 7];
  const greedy = await engine.generate({ requestId: 'g', promptIds: prompt, sampling: sampling({ temperature: 0, max_new_tokens: 6 }) });
  assert.equal(greedy.finishReason, 'length');
  assert.equal(greedy.tokenIds.length, 6);
  const stopAt = greedy.tokenIds[3]!;
  const first = greedy.tokenIds.indexOf(stopAt);
  const stopped = await engine.generate({ requestId: 's', promptIds: prompt, sampling: sampling({ temperature: 0, max_new_tokens: 6, stop_token_ids: [stopAt] }) });
  assert.equal(stopped.finishReason, 'stop');
  assert.deepEqual(stopped.tokenIds, greedy.tokenIds.slice(0, first + 1));
  // The context (maxLen) ends a turn too: 64 - 3 tokens of the 62 asked, finish length; a prompt filling it is refused.
  const cut = await engine.generate({ requestId: 'x', promptIds: prompt, sampling: sampling({ max_new_tokens: 62 }) });
  assert.deepEqual([cut.tokenIds.length, cut.finishReason], [61, 'length']);
  await assert.rejects(engine.generate({ requestId: 'y', promptIds: new Array(64).fill(1), sampling: sampling() }), /the prompt has 64 tokens; the engine's maxLen 64 leaves no room to generate/);
  engine.close();
  m.dispose();
});

test('more requests than slots: they queue, join as others leave, and each equals its run alone', { skip }, async () => {
  const m = Model.init(CFG, { seed: 6, threads: 2, initStd: 0.3 });
  const prompts = randomSeqs(rng(8), [3, 14, 6, 9, 1, 20, 4], V);
  const req = (i: number) => ({ requestId: `q${i}`, promptIds: prompts[i]!, sampling: sampling({ seed: 100 + i, max_new_tokens: 4 + 3 * (i % 3), top_k: 20 }) });
  const engine = new NativeEngine(m, { slots: 3, maxLen: 64 });
  const together = await Promise.all(prompts.map((_, i) => engine.generate(req(i))));
  const s = engine.stats();
  engine.close();
  const solo = new NativeEngine(m, { slots: 1, maxLen: 64 });
  const alone: GenerateResult[] = [];
  for (let i = 0; i < prompts.length; i++) alone.push(await solo.generate(req(i)));
  for (let i = 0; i < prompts.length; i++) {
    assert.deepEqual(together[i]!.tokenIds, alone[i]!.tokenIds, `request ${i}`);
    assert.ok(maxAbsDiff(together[i]!.logprobs, alone[i]!.logprobs) < 1e-5);
  }
  const total = together.reduce((n, r) => n + r.tokenIds.length, 0);
  assert.ok(s.steps < total, `batched: ${s.steps} steps for ${total} tokens`);
  assert.equal(s.prefillTokens, prompts.reduce((n, p) => n + p.length, 0));
  solo.close();
  m.dispose();
});

test("a session's next turn prefills only its new tokens and equals the full forward", { skip }, async () => {
  const m = Model.init(CFG, { seed: 2, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 2, maxLen: 96 });
  const prompt = randomSeqs(rng(12), [10], V)[0]!;
  const t1 = await engine.generate({ requestId: 't1', sessionId: 'traj', promptIds: prompt, sampling: sampling({ seed: 1 }) });
  // another session in between takes the other slot, not this one
  await engine.generate({ requestId: 'o', sessionId: 'other', promptIds: [5, 5, 5], sampling: sampling({ seed: 2 }) });
  const ctx = [...prompt, ...t1.tokenIds, 4, 17, 30];
  const before = engine.stats();
  const t2 = await engine.generate({ requestId: 't2', sessionId: 'traj', promptIds: ctx, sampling: sampling({ seed: 3 }) });
  const after = engine.stats();
  assert.equal(after.reusedTokens - before.reusedTokens, prompt.length + t1.tokenIds.length - 1, 'all but the last sampled token were cached');
  assert.equal(after.prefillTokens - before.prefillTokens, 4);
  const want = await forwardLogprobs(m, ctx, t2.tokenIds);
  assert.ok(maxAbsDiff(t2.logprobs, want) < 1e-5);
  // a context that diverges from the cache keeps only the common prefix
  const forked = [...prompt.slice(0, 6), 1, 2];
  const b2 = engine.stats();
  const t3 = await engine.generate({ requestId: 't3', sessionId: 'traj', promptIds: forked, sampling: sampling({ seed: 4 }) });
  assert.equal(engine.stats().reusedTokens - b2.reusedTokens, 6);
  assert.ok(maxAbsDiff(t3.logprobs, await forwardLogprobs(m, forked, t3.tokenIds)) < 1e-5);
  engine.close();
  m.dispose();
});

test('maxPrefillTokens spreads joining prompts over steps (one step each here) without changing any result', { skip }, async () => {
  const m = Model.init(CFG, { seed: 6, threads: 2, initStd: 0.3 });
  const prompts = randomSeqs(rng(3), [6, 6, 6], V);
  const run = async (cap: number) => {
    const engine = new NativeEngine(m, { slots: 3, maxLen: 32, maxPrefillTokens: cap });
    const out = await Promise.all(prompts.map((p, i) => engine.generate({ requestId: `c${i}`, promptIds: p, sampling: sampling({ seed: i, max_new_tokens: 3 }) })));
    const steps = engine.stats().steps;
    engine.close();
    return { out, steps };
  };
  const capped = await run(10);
  const free = await run(4096);
  assert.equal(free.steps, 3);
  assert.equal(capped.steps, 5, 'the second and third prompts joined one step after another');
  for (let i = 0; i < 3; i++) assert.deepEqual(capped.out[i]!.tokenIds, free.out[i]!.tokenIds);
  assert.throws(() => new NativeEngine(m, { slots: 1, maxLen: 8, maxPrefillTokens: 0 }), /maxPrefillTokens must be a positive integer/);
  m.dispose();
});

test('rows without top-k / top-p are drawn by the native core: the tokens sampleToken would draw, log-probs of the forward', { skip }, async () => {
  const { Rng, sampleToken, newScratch, inverseTemperature } = await import('../../producers/policy/sampler.ts');
  const m = Model.init(CFG, { seed: 8, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 2, maxLen: 64 });
  const prompt = [3, 1, 4, 1, 5];
  const params = [sampling({ seed: 41, max_new_tokens: 15 }), sampling({ seed: 42, temperature: 0.7, max_new_tokens: 15 })];
  const res = await Promise.all(params.map((p, i) => engine.generate({ requestId: `d${i}`, promptIds: prompt, sampling: p })));
  engine.close();
  // the same decoding by hand on the host rows with sampleToken and the same seeds
  const scratch = newScratch(V);
  for (let i = 0; i < 2; i++) {
    const r = new Rng(params[i]!.seed!);
    m.kvReserve(1, 64);
    let probs = await m.extend(Int32Array.of(0), Int32Array.of(prompt.length), Int32Array.from(prompt), Float32Array.of(inverseTemperature(params[i]!)));
    const toks: number[] = [];
    for (let k = 0; k < 15; k++) {
      const { token } = sampleToken(probs, params[i]!, r, scratch);
      toks.push(token);
      probs = await m.extend(Int32Array.of(0), Int32Array.of(1), Int32Array.of(token), Float32Array.of(inverseTemperature(params[i]!)));
    }
    assert.deepEqual(res[i]!.tokenIds, toks, `request ${i}`);
  }
  assert.ok(maxAbsDiff(res[0]!.logprobs, await forwardLogprobs(m, prompt, res[0]!.tokenIds)) < 1e-5, 'T = 1: log-probs of the forward');
  m.dispose();
});

test("setVersion (weights changed in place by the model's owner): new tokens carry it and sessions' older caches are not reused", { skip }, async () => {
  const m = Model.init(CFG, { seed: 9, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 2, maxLen: 64 });
  const prompt = [2, 4, 6, 8];
  const r1 = await engine.generate({ requestId: 'a', sessionId: 's', promptIds: prompt, sampling: sampling({ max_new_tokens: 5 }) });
  assert.deepEqual(r1.policyVersions, [0, 0, 0, 0, 0]);
  // a trainer step on the same model, then the version
  const { batch, targets, responseMask } = pack([[...prompt, ...r1.tokenIds]]);
  await m.backwardCrossEntropy(batch, targets, responseMask);
  await m.adamwStep({ lr: 0.05, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
  engine.setVersion(1);
  const ctx = [...prompt, ...r1.tokenIds, 3];
  const before = engine.stats().reusedTokens;
  const r2 = await engine.generate({ requestId: 'b', sessionId: 's', promptIds: ctx, sampling: sampling({ max_new_tokens: 5 }) });
  assert.equal(engine.stats().reusedTokens, before, 'the v0 cache of the session is recomputed');
  assert.deepEqual(r2.policyVersions, [1, 1, 1, 1, 1]);
  assert.ok(maxAbsDiff(r2.logprobs, await forwardLogprobs(m, ctx, r2.tokenIds)) < 1e-5, 'the updated weights');
  engine.close();
  m.dispose();
});

test("a finished turn is handed back with the next step already running; that step's tokens carry the version it read", { skip }, async () => {
  const m = Model.init(CFG, { seed: 10, threads: 2, initStd: 0.3 });
  const engine = new NativeEngine(m, { slots: 2, maxLen: 64 });
  let busyWhenHandedBack = false;
  const short = engine.generate({ requestId: 'a', promptIds: [1, 2, 3], sampling: sampling({ max_new_tokens: 2 }) }).then((r) => {
    // the owner's code runs while the device computes the other turn's next step (the model refuses a sync call)
    busyWhenHandedBack = (() => {
      try {
        m.activationBytes(1);
        return false;
      } catch (e) {
        return /is still running/.test(String(e));
      }
    })();
    engine.setVersion(1);
    return r;
  });
  const long = engine.generate({ requestId: 'b', promptIds: [4, 5, 6, 7], sampling: sampling({ max_new_tokens: 6 }) });
  const [a, b] = await Promise.all([short, long]);
  assert.equal(a.tokenIds.length, 2);
  assert.ok(busyWhenHandedBack, 'the next step was launched before the finished turn was handed back');
  // steps 1-2 sampled both turns' first two tokens; step 3 was under way when setVersion(1) ran
  assert.deepEqual(b.policyVersions, [0, 0, 0, 1, 1, 1]);
  engine.close();
  m.dispose();
});
