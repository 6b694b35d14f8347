// The built-in policy backend on the CPU end to end (the scheduler over the ONNX runner, onnxruntime): seeded sampling, the reported log-probs against a
// teacher-forced recomputation, top-k/top-p/stop/length, continuous batching, kept KV caches across turns,
// bad requests next to good ones, aborts, and hot-swaps in each interrupt mode.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { hfConfigJson, parseModelConfig } from '../../core/weights/model-config.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import type { GenerateRequest } from '../../producers/backends/types.ts';
import { BuiltinPolicyBackend, type BuiltinPolicyOptions } from '../../producers/policy/backend.ts';
import { logprobMismatch } from '../../producers/policy/mismatch.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import { OnnxSlotRunner } from '../../producers/policy/onnx-slot-runner.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import { PolicyRunner } from '../../producers/policy/runner.ts';
import { topAlternatives } from '../../producers/policy/sampler.ts';
import { scoreSequences } from '../../producers/policy/score.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

const config = parseModelConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96, vocab_size: 100, max_position_embeddings: 128, attention_bias: true });
const configJson = JSON.stringify(hfConfigJson(config));
const w1 = randomWeights(config, 1);
const w2 = randomWeights(config, 2);
const dir = await mkdtemp(join(tmpdir(), 'rlstream-policy-'));
const v2Path = join(dir, 'v2.safetensors');
await writeSafetensors(v2Path, w2);
const backends: BuiltinPolicyBackend[] = [];
after(async () => {
  for (const b of backends) await b.close();
  for (const r of scorers.values()) await r.release();
  await rm(dir, { recursive: true, force: true });
});

async function backend(options: BuiltinPolicyOptions = {}, cfgJson = configJson): Promise<BuiltinPolicyBackend> {
  const b = await BuiltinPolicyBackend.create({ configJson: cfgJson, weights: w1, version: 1 }, options);
  backends.push(b);
  return b;
}

function sampling(over: Partial<SamplingParams> = {}): SamplingParams {
  return { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 12, seed: 7, stop_token_ids: [], ...over };
}

let n = 0;
function req(promptIds: number[], over: Partial<SamplingParams> = {}, sessionId?: string): GenerateRequest {
  return { requestId: `r${n++}`, promptIds, sampling: sampling(over), ...(sessionId !== undefined && { sessionId }) };
}

const scorers = new Map<number, PolicyRunner>();
async function score(version: 1 | 2, seq: number[]): Promise<Float32Array> {
  let r = scorers.get(version);
  if (!r) scorers.set(version, (r = await PolicyRunner.create({ ...config, max_position_embeddings: 2048 }, version === 1 ? w1 : w2, version, { mode: 'all' })));
  return (await scoreSequences(r, [seq]))[0]!;
}

test('same seed and prompt give the same tokens, alone or in a busy batch; other seeds differ', async () => {
  const b = await backend();
  const alone = await b.generate(req([5, 6, 7], { seed: 42 }));
  const busy = await Promise.all([req([5, 6, 7], { seed: 42 }), req([1, 2], { seed: 1 }), req([9, 9, 9, 9, 9], { seed: 2 }), req([5, 6, 7], { seed: 43 })].map((r) => b.generate(r)));
  assert.deepEqual(busy[0]!.tokenIds, alone.tokenIds);
  // Log-probs agree to float noise (different batch shapes take different kernel paths).
  assert.ok(logprobMismatch(busy[0]!.logprobs, alone.logprobs).maxAbs < 1e-4);
  assert.notDeepEqual(busy[3]!.tokenIds, alone.tokenIds);
  assert.equal(alone.tokenIds.length, 12);
  assert.equal(alone.finishReason, 'length');
  assert.deepEqual(alone.policyVersions, new Array(12).fill(1));
  assert.equal(alone.server, 'builtin');
});

test('reported log-probs are the trainer’s recomputed ones at T=1 and log_softmax(logits/T) otherwise', async () => {
  const b = await backend();
  const prompt = [3, 1, 4, 1, 5];
  const r1 = await b.generate(req(prompt, { temperature: 1, max_new_tokens: 20 }));
  const lp = await score(1, [...prompt, ...r1.tokenIds]);
  const m = logprobMismatch(r1.logprobs, lp.subarray(prompt.length - 1));
  console.log(`rollout vs recomputed at T=1: mean |Δ| ${m.meanAbs.toExponential(2)}, max ${m.maxAbs.toExponential(2)}`);
  assert.ok(m.maxAbs < 1e-4);

  // At T = 0.6 the reported value is log_softmax(logits / T) of the sampled token: check it from the full rows.
  const T = 0.6;
  const r2 = await b.generate(req(prompt, { temperature: T, max_new_tokens: 6 }));
  const full = await PolicyRunner.create(config, w1, 1, { mode: 'all' });
  const seq = [...prompt, ...r2.tokenIds];
  const rows = (await full.step({ batch: 1, seq: seq.length, inputIds: BigInt64Array.from(seq.map(BigInt)), positionIds: BigInt64Array.from(seq.map((_, i) => BigInt(i))), bias: causal(seq.length), past: { len: 0, keys: [new Float32Array(), new Float32Array()], values: [new Float32Array(), new Float32Array()] } })).logprobs;
  r2.tokenIds.forEach((tok, i) => {
    const row = rows.subarray((prompt.length - 1 + i) * 100, (prompt.length + i) * 100);
    const scaled = Array.from(row, (x) => x / T);
    const max = Math.max(...scaled);
    const lse = max + Math.log(scaled.reduce((s, x) => s + Math.exp(x - max), 0));
    assert.ok(Math.abs(r2.logprobs[i]! - (scaled[tok]! - lse)) < 1e-4, `token ${i}`);
  });
  await full.release();
});

test('top alternatives are the k best of the distribution each token was sampled from (log_softmax(logits/T)), ties by token id', async () => {
  const b = await backend();
  const prompt = [2, 7, 1, 8];
  const T = 0.7;
  const r = await b.generate({ ...req(prompt, { temperature: T, max_new_tokens: 6, top_k: 5 }), topLogprobs: 7 });
  assert.equal(r.topLogprobs!.length, r.tokenIds.length);
  const full = await PolicyRunner.create(config, w1, 1, { mode: 'all' });
  const seq = [...prompt, ...r.tokenIds];
  const rows = (await full.step({ batch: 1, seq: seq.length, inputIds: BigInt64Array.from(seq.map(BigInt)), positionIds: BigInt64Array.from(seq.map((_, i) => BigInt(i))), bias: causal(seq.length), past: { len: 0, keys: [new Float32Array(), new Float32Array()], values: [new Float32Array(), new Float32Array()] } })).logprobs;
  r.tokenIds.forEach((tok, i) => {
    const row = rows.subarray((prompt.length - 1 + i) * 100, (prompt.length + i) * 100);
    const scaled = Array.from(row, (x) => x / T);
    const max = Math.max(...scaled);
    const lse = max + Math.log(scaled.reduce((s, x) => s + Math.exp(x - max), 0));
    const best = scaled.map((x, t) => ({ t, lp: x - lse })).sort((a, c) => c.lp - a.lp || a.t - c.t).slice(0, 7);
    const alts = r.topLogprobs![i]!;
    alts.forEach((a, j) => assert.ok(Math.abs(a.logprob - best[j]!.lp) < 1e-4, `token ${i} alternative ${j}`));
    // top_k 5 truncates what is sampled, not the distribution reported: the 6th and 7th are there too, and the
    // sampled token (one of the 5 best) is among them with its own log-prob.
    assert.ok(alts.slice(0, 5).some((a) => a.token === tok && a.logprob === r.logprobs[i]));
  });
  await full.release();
  // Without asking, none; beyond 20 (or not an integer), a bad request.
  assert.equal((await b.generate(req(prompt))).topLogprobs, undefined);
  for (const k of [21, 1.5, -1]) await assert.rejects(b.generate({ ...req(prompt), topLogprobs: k }), (e) => isRlstreamError(e, 'BACKEND_BAD_REQUEST') && e.message.includes('topLogprobs'));
});

test('topAlternatives: most probable first, ties by token id, at most the vocabulary', () => {
  const probs = Float32Array.from([0.1, 0.3, 0.1, 0.3, 0.2]);
  assert.deepEqual(topAlternatives(probs, 3).map((a) => a.token), [1, 3, 4]);
  assert.deepEqual(topAlternatives(probs, 4).map((a) => a.token), [1, 3, 4, 0]);
  assert.deepEqual(topAlternatives(probs, 20).map((a) => a.token), [1, 3, 4, 0, 2]);
  assert.equal(topAlternatives(probs, 1)[0]!.logprob, Math.log(probs[1]!));
});

function causal(n: number): Float32Array {
  const b = new Float32Array(n * n).fill(-1e9);
  for (let i = 0; i < n; i++) b.fill(0, i * n, i * n + i + 1);
  return b;
}

test('greedy, top-k, top-p, stop tokens and the context limit', async () => {
  const b = await backend();
  const prompt = [10, 20, 30];
  const greedy = await b.generate(req(prompt, { temperature: 0, seed: null }));
  const greedy2 = await b.generate(req(prompt, { temperature: 0, seed: 99 }));
  assert.deepEqual(greedy2.tokenIds, greedy.tokenIds);
  assert.deepEqual((await b.generate(req(prompt, { top_k: 1, seed: 5 }))).tokenIds, greedy.tokenIds);
  assert.deepEqual((await b.generate(req(prompt, { top_p: 1e-6, seed: 6 }))).tokenIds, greedy.tokenIds);

  // top-k = 3: every sampled token is among the 3 most likely under the model.
  const k3 = await b.generate(req(prompt, { top_k: 3, temperature: 1.5, max_new_tokens: 20, seed: 8 }));
  const full = await PolicyRunner.create(config, w1, 1, { mode: 'all' });
  const seq = [...prompt, ...k3.tokenIds];
  const rows = (await full.step({ batch: 1, seq: seq.length, inputIds: BigInt64Array.from(seq.map(BigInt)), positionIds: BigInt64Array.from(seq.map((_, i) => BigInt(i))), bias: causal(seq.length), past: { len: 0, keys: [new Float32Array(), new Float32Array()], values: [new Float32Array(), new Float32Array()] } })).logprobs;
  k3.tokenIds.forEach((tok, i) => {
    const row = Array.from(rows.subarray((prompt.length - 1 + i) * 100, (prompt.length + i) * 100));
    const rank = row.filter((x) => x > row[tok]!).length;
    assert.ok(rank < 3, `token ${i} has rank ${rank}`);
  });
  await full.release();

  const stopAt = greedy.tokenIds[3]!;
  const firstStop = greedy.tokenIds.indexOf(stopAt);
  const stopped = await b.generate(req(prompt, { temperature: 0, stop_token_ids: [stopAt] }));
  assert.equal(stopped.finishReason, 'stop');
  assert.deepEqual(stopped.tokenIds, greedy.tokenIds.slice(0, firstStop + 1));

  // The context (max_len, here max_position_embeddings 128) ends the turn where it is full.
  const nearEnd = Array.from({ length: 125 }, (_, i) => i % 100);
  const capped = await b.generate(req(nearEnd, { max_new_tokens: 50 }));
  assert.equal(capped.tokenIds.length, 3);
  assert.equal(capped.finishReason, 'length');
});

test('continuous batching: requests join and leave a running batch and each gets what it would alone', async () => {
  const b = await backend({ maxBatch: 4 });
  const prompts = Array.from({ length: 10 }, (_, i) => Array.from({ length: 2 + (i % 4) * 3 }, (_, j) => (i * 7 + j) % 100));
  const lengths = prompts.map((_, i) => 4 + ((i * 5) % 13));
  const first = prompts.slice(0, 5).map((p, i) => b.generate(req(p, { seed: i, max_new_tokens: lengths[i]! })));
  await new Promise((r) => setTimeout(r, 5));
  const later = prompts.slice(5).map((p, i) => b.generate(req(p, { seed: i + 5, max_new_tokens: lengths[i + 5]! })));
  const results = await Promise.all([...first, ...later]);
  const s = b.stats();
  const total = results.reduce((sum, r) => sum + r.tokenIds.length, 0);
  assert.equal(total, lengths.reduce((a, x) => a + x, 0));
  assert.ok(s.prefillSteps >= 3, `prefill steps ${s.prefillSteps}`);
  assert.ok(s.steps < total, `${s.steps} steps for ${total} tokens: decoding was batched`);
  const solo = await backend({ maxBatch: 1 });
  for (let i = 0; i < prompts.length; i++) {
    const alone = await solo.generate(req(prompts[i]!, { seed: i, max_new_tokens: lengths[i]! }));
    assert.deepEqual(results[i]!.tokenIds, alone.tokenIds, `request ${i}`);
  }
});

test('two intra-op threads give the same greedy tokens and the same log-probs (to float noise) as one', async () => {
  const one = await backend({ threads: 1 });
  const two = await backend({ threads: 2 });
  const prompts = Array.from({ length: 6 }, (_, i) => Array.from({ length: 3 + i }, (_, j) => (i * 13 + j * 5) % 100));
  const [a, b] = await Promise.all([one, two].map((x) => Promise.all(prompts.map((p) => x.generate(req(p, { temperature: 0, seed: null, max_new_tokens: 10 }))))));
  a!.forEach((r, i) => {
    assert.deepEqual(b![i]!.tokenIds, r.tokenIds);
    assert.ok(logprobMismatch(b![i]!.logprobs, r.logprobs).maxAbs < 1e-4);
  });
});

test('a session keeps its KV cache between turns: only new tokens are encoded, results unchanged', async () => {
  const b = await backend();
  const fresh = await backend();
  const prompt = [11, 12, 13, 14, 15, 16];
  const t1 = await b.generate(req(prompt, { seed: 1 }, 'traj-A'));
  const ctx2 = [...prompt, ...t1.tokenIds, 40, 41, 42]; // the turn's tokens, then a tool result
  const before = b.stats();
  const t2 = await b.generate(req(ctx2, { seed: 2 }, 'traj-A'));
  const after2 = b.stats();
  assert.equal(after2.cacheHits - before.cacheHits, 1);
  assert.equal(after2.reusedTokens - before.reusedTokens, prompt.length + t1.tokenIds.length - 1);
  assert.equal(after2.prefillTokens - before.prefillTokens, 4); // the last sampled token + 3 tool tokens
  assert.deepEqual(t2.tokenIds, (await fresh.generate(req(ctx2, { seed: 2 }))).tokenIds);
  const lp = await score(1, [...ctx2, ...t2.tokenIds]);
  assert.ok(logprobMismatch(t2.logprobs, lp.subarray(ctx2.length - 1)).maxAbs < 1e-4);

  // A context that does not extend the cached one (edited history) keeps only the common prefix.
  const edited = [...ctx2, ...t2.tokenIds];
  edited[2] = 99;
  const t3 = await b.generate(req(edited, { seed: 3 }, 'traj-A'));
  assert.equal(b.stats().reusedTokens - after2.reusedTokens, 2);
  assert.deepEqual(t3.tokenIds, (await fresh.generate(req(edited, { seed: 3 }))).tokenIds);

  // Exactly the cached context again (no new token): one token is re-run, the rest reused.
  const again = [...edited, ...t3.tokenIds.slice(0, -1)];
  const t4 = await b.generate(req(again, { seed: 4, max_new_tokens: 1 }, 'traj-A'));
  assert.deepEqual(t4.tokenIds, (await fresh.generate(req(again, { seed: 4, max_new_tokens: 1 }))).tokenIds);

  b.releaseSession('traj-A');
  assert.equal(b.stats().cachedSessions, 0);
});

test('kept caches are bounded by kvCacheBytes (whole slots of maxLen tokens beyond maxBatch) and evicted least recently used', async () => {
  // One token of this model's cache: 2 layers × K,V × 2 heads × 16 dims × 4 bytes = 512 bytes; a slot of maxLen
  // 128 tokens is 64 KiB. One slot's worth (less a byte is none) beside the one running.
  const none = await backend({ maxBatch: 1, kvCacheBytes: 512 * 128 - 1 });
  const one = await backend({ maxBatch: 1, kvCacheBytes: 512 * 128 });
  for (const b of [none, one]) for (const s of ['s1', 's2', 's3']) await b.generate(req([1, 2, 3, 4, 5], { max_new_tokens: 10 }, s));
  assert.equal(none.stats().cachedSessions, 1, 'the running slot keeps the last session while idle');
  assert.equal(one.stats().cachedSessions, 2);
  const hits = one.stats().cacheHits;
  await one.generate(req([1, 2, 3, 4, 5, 6], { max_new_tokens: 2 }, 's1')); // evicted: a miss
  assert.equal(one.stats().cacheHits, hits);
  await one.generate(req([1, 2, 3, 4, 5, 6], { max_new_tokens: 2 }, 's3')); // kept
  assert.equal(one.stats().cacheHits, hits + 1);
  await assert.rejects(backend({ kvCacheBytes: -1 }), /backend\.kv_cache_bytes must be a non-negative integer, got -1/);
});

test('bad requests are rejected with BACKEND_BAD_REQUEST while good ones in the same batch complete', async () => {
  const b = await backend();
  const bad: [GenerateRequest, RegExp][] = [
    [req(Array.from({ length: 128 }, () => 1)), /the prompt has 128 tokens; the engine's maxLen 128 leaves no room/],
    [req([1, 2, 100]), /token id 100 at position 2 is outside the vocabulary/],
    [req([1, -1]), /token id -1/],
    [req([]), /promptIds is empty/],
    [req([1], { temperature: -1 }), /temperature/],
    [req([1], { top_p: 0 }), /top_p/],
    [req([1], { top_k: 1.5 }), /top_k/],
    [req([1], { max_new_tokens: 0 }), /max_new_tokens/],
    [req([1], { stop_token_ids: [500] }), /stop token 500/],
  ];
  const good = [req([1, 2, 3]), req([4, 5]), req([6])].map((r) => b.generate(r));
  const outcomes = await Promise.allSettled([...bad.map(([r]) => b.generate(r)), ...good]);
  bad.forEach(([, msg], i) => {
    const o = outcomes[i]!;
    assert.equal(o.status, 'rejected');
    assert.ok(isRlstreamError((o as PromiseRejectedResult).reason, 'BACKEND_BAD_REQUEST') && msg.test((o as PromiseRejectedResult).reason.message), `case ${i}: ${String((o as PromiseRejectedResult).reason)}`);
  });
  for (const o of outcomes.slice(bad.length)) {
    assert.equal(o.status, 'fulfilled');
    assert.equal((o as PromiseFulfilledResult<{ tokenIds: number[] }>).value.tokenIds.length, 12);
  }
});

test('an aborted request returns its tokens so far with finishReason abort, others go on', async () => {
  const b = await backend();
  const ac = new AbortController();
  const long = b.generate(req([1, 2, 3], { max_new_tokens: 100 }), ac.signal);
  const other = b.generate(req([4, 5, 6], { max_new_tokens: 30 }));
  setTimeout(() => ac.abort(), 10);
  const r = await long;
  assert.equal(r.finishReason, 'abort');
  assert.ok(r.tokenIds.length < 100);
  assert.equal((await other).tokenIds.length, 30);
  const pre = new AbortController();
  pre.abort();
  assert.deepEqual((await b.generate(req([1]), pre.signal)).tokenIds, []);
});

test("hot-swap 'next_turn': in-flight turns finish on v1, the next turn runs v2 without the old cache", async () => {
  // A longer context than the other tests (same weights), so the in-flight turn outlasts the swap.
  const longJson = JSON.stringify(hfConfigJson({ ...config, max_position_embeddings: 2048 }));
  const b = await backend({ interrupt: 'next_turn' }, longJson);
  const prompt = [7, 7, 7];
  const t1 = await b.generate(req(prompt, { max_new_tokens: 5 }, 'sess'));
  let inflightDone = false;
  const inflight = b.generate(req([8, 8], { max_new_tokens: 1500 })).finally(() => (inflightDone = true));
  await new Promise((r) => setTimeout(r, 5));
  // The update loads beside the turn under way, which finishes on v1.
  const swapped = b.updatePolicy({ version: 2, weightsPath: v2Path, configJson: longJson });
  assert.equal(inflightDone, false, 'the swap was asked for while the turn was generating');
  const r = await inflight;
  await swapped;
  assert.equal(b.currentPolicyVersion(), 2);
  assert.deepEqual(r.policyVersions, new Array(1500).fill(1));
  assert.ok(logprobMismatch(r.logprobs, (await score(1, [8, 8, ...r.tokenIds])).subarray(1)).maxAbs < 1e-4);
  const reused = b.stats().reusedTokens;
  const ctx2 = [...prompt, ...t1.tokenIds, 1];
  const t2 = await b.generate(req(ctx2, { max_new_tokens: 8 }, 'sess'));
  assert.equal(b.stats().reusedTokens, reused, 'the v1 cache was dropped');
  assert.deepEqual(t2.policyVersions, new Array(8).fill(2));
  // The tokens really come from the v2 weights.
  assert.ok(logprobMismatch(t2.logprobs, (await score(2, [...ctx2, ...t2.tokenIds])).subarray(ctx2.length - 1)).maxAbs < 1e-4);
  // An older version is ignored.
  await b.updatePolicy({ version: 1, weightsPath: v2Path, configJson: longJson });
  assert.equal(b.currentPolicyVersion(), 2);
});

test("hot-swap 'next_token': a long generation goes on with v2 from the next token, each token keeping its version and log-prob", async () => {
  const longJson = JSON.stringify(hfConfigJson({ ...config, max_position_embeddings: 2048 }));
  const b = await backend({ interrupt: 'next_token' }, longJson);
  const prompt = [8, 8];
  let inflightDone = false;
  const inflight = b.generate(req(prompt, { max_new_tokens: 1500 }, 'long')).finally(() => (inflightDone = true));
  await new Promise((r) => setTimeout(r, 5));
  await b.updatePolicy({ version: 2, weightsPath: v2Path, configJson: longJson });
  assert.equal(inflightDone, false, 'the swap happened while the turn was generating');
  const r = await inflight;
  assert.equal(r.tokenIds.length, 1500);
  // One switch, from v1 to v2, somewhere inside the generation.
  const k = r.policyVersions.indexOf(2);
  assert.ok(k > 0 && k < 1500, `switch at token ${k}`);
  assert.deepEqual(r.policyVersions, [...new Array(k).fill(1), ...new Array(1500 - k).fill(2)]);
  assert.equal(b.stats().interrupted, 1);
  // Each token's log-prob is its own version's: v1 before the switch, v2 (over the whole context) after it.
  const seq = [...prompt, ...r.tokenIds];
  const lp1 = (await score(1, seq)).subarray(prompt.length - 1);
  const lp2 = (await score(2, seq)).subarray(prompt.length - 1);
  assert.ok(logprobMismatch(r.logprobs.slice(0, k), lp1.subarray(0, k)).maxAbs < 1e-4, 'tokens before the switch are v1');
  assert.ok(logprobMismatch(r.logprobs.slice(k), lp2.subarray(k, 1500)).maxAbs < 1e-4, 'tokens after the switch are v2');
  assert.ok(logprobMismatch(r.logprobs.slice(k), lp1.subarray(k, 1500)).maxAbs > 1e-2, 'and not v1');
});

test("hot-swap 'finish': a session started on v1 keeps v1 (and its cache) until released; new sessions get v2", async () => {
  const b = await backend({ interrupt: 'finish' });
  const prompt = [2, 4, 6];
  const t1 = await b.generate(req(prompt, { max_new_tokens: 4 }, 'old'));
  await b.updatePolicy({ version: 2, weightsPath: v2Path, configJson });
  const hits = b.stats().cacheHits;
  const ctx2 = [...prompt, ...t1.tokenIds, 3];
  const t2 = await b.generate(req(ctx2, { max_new_tokens: 4 }, 'old'));
  assert.deepEqual(t2.policyVersions, [1, 1, 1, 1]);
  assert.equal(b.stats().cacheHits, hits + 1);
  const other = await b.generate(req(prompt, { max_new_tokens: 4 }, 'new'));
  assert.deepEqual(other.policyVersions, [2, 2, 2, 2]);
  b.releaseSession('old');
  const t3 = await b.generate(req([...ctx2, ...t2.tokenIds], { max_new_tokens: 4 }, 'old'));
  assert.deepEqual(t3.policyVersions, [2, 2, 2, 2]);
});

test('a malformed weights file fails updatePolicy with WEIGHTS_FORMAT and keeps serving the old version', async () => {
  const b = await backend();
  const badPath = join(dir, 'bad.safetensors');
  await (await import('node:fs/promises')).writeFile(badPath, new Uint8Array(4));
  await assert.rejects(b.updatePolicy({ version: 3, weightsPath: badPath, configJson }), (e: unknown) => isRlstreamError(e, 'WEIGHTS_FORMAT'));
  assert.equal(b.currentPolicyVersion(), 1);
  assert.equal((await b.generate(req([1, 2]))).tokenIds.length, 12);
  await b.updatePolicy({ version: 3, weightsPath: v2Path, configJson });
  assert.equal(b.currentPolicyVersion(), 3);
});

test('without the one-token decode graph, decode steps run on the general graph and give the same tokens', async () => {
  const tokens = async (decodeGraph: boolean) => {
    const runner = await OnnxSlotRunner.create(config, w1, { decodeGraph });
    const engine = new NativeEngine(runner, { slots: 2, maxLen: 128 });
    try {
      return await Promise.all([req([1, 2, 3], { seed: 3 }), req([4, 5], { seed: 4, max_new_tokens: 7 })].map((r) => engine.generate(r)));
    } finally {
      engine.close();
      await runner.release();
    }
  };
  const [general, dedicated] = [await tokens(false), await tokens(true)];
  assert.deepEqual(general.map((r) => r.tokenIds), dedicated.map((r) => r.tokenIds));
  general.forEach((r, i) => assert.ok(logprobMismatch(r.logprobs, dedicated[i]!.logprobs).maxAbs < 1e-4));
});
