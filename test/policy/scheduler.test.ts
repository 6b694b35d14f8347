// The one continuous-batching scheduler (producers/policy/native-engine.ts) against bad input and failing steps,
// over the ONNX runner: a request with a token id outside the vocabulary (or an unsupported option) is refused on
// its own with the position named while the good requests beside it finish; a step the runner fails rejects the
// turns in it and frees their slots, so the engine goes on serving instead of waiting for slots forever; a runner
// that no longer runs at all fails the waiting and later requests at once until new weights load. Also: the top
// alternatives against a teacher-forced pass, the slots kv_cache_bytes buys for idle sessions, and 'finish'
// swaps (two versions' weights at once, each turn and pinned session on its own).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { parseModelConfig } from '../../core/weights/model-config.ts';
import type { GenerateRequest } from '../../producers/backends/types.ts';
import { cpuKvSlots } from '../../producers/policy/kv-sizing.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import { OnnxSlotRunner } from '../../producers/policy/onnx-slot-runner.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import { PolicyRunner } from '../../producers/policy/runner.ts';
import type { SlotRunner } from '../../producers/policy/slot-runner.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

const config = parseModelConfig({ hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 48, vocab_size: 61, max_position_embeddings: 128 });
const weights = randomWeights(config, 3);
const runners: OnnxSlotRunner[] = [];
after(async () => {
  for (const r of runners) await r.release();
});
const sampling = (o: Partial<SamplingParams> = {}): SamplingParams => ({ temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 5, seed: 1, stop_token_ids: [], ...o }) as SamplingParams;

async function runner(version = 0, w = weights): Promise<OnnxSlotRunner> {
  const r = await OnnxSlotRunner.create(config, w, { version });
  runners.push(r);
  return r;
}

test('bad requests are refused on their own, naming what is wrong; the good ones beside them finish', async () => {
  const engine = new NativeEngine(await runner(), { slots: 4, maxLen: 64 });
  const bad: [unknown[], RegExp][] = [
    [[1, 2, 61], /token id 61 at position 2 is outside the vocabulary \[0, 61\)/],
    [[-1], /token id -1 at position 0/],
    [[1, 2.5], /token id 2.5 at position 1/],
    [[Number.NaN], /token id NaN at position 0/],
    [['7'], /token id 7 at position 0/],
    [[], /promptIds is empty/],
  ];
  const good = [0, 1, 2].map((i) => engine.generate({ requestId: `g${i}`, promptIds: [i + 1, i + 2], sampling: sampling({ seed: i }) }));
  const refused = bad.map(([ids]) => engine.generate({ requestId: 'bad', promptIds: ids as number[], sampling: sampling() }).then(() => null, (e: unknown) => e));
  for (const k of [21, 1.5, -1]) refused.push(engine.generate({ requestId: 'bad', promptIds: [1], sampling: sampling(), topLogprobs: k }).then(() => null, (e: unknown) => e));
  refused.push(engine.generate({ requestId: 'bad', promptIds: null as unknown as number[], sampling: sampling() }).then(() => null, (e: unknown) => e));
  const errors = await Promise.all(refused);
  for (const [i, e] of errors.entries()) {
    assert.ok(isRlstreamError(e) && e.code === 'BACKEND_BAD_REQUEST', `case ${i}: ${String(e)}`);
    if (i < bad.length) assert.match((e as Error).message, bad[i]![1]);
  }
  for (let i = 0; i < 3; i++) assert.match((errors[bad.length + i] as Error).message, /topLogprobs must be an integer in \[0, 20\]/);
  assert.match((errors[bad.length + 3] as Error).message, /promptIds must be an array/);
  for (const r of await Promise.all(good)) assert.equal(r.tokenIds.length, 5);
  engine.close();
});

test('a step the runner fails rejects its turns and frees their slots: later requests are served', async () => {
  const r = await runner();
  let failNext = false;
  const real = r.extend.bind(r);
  // The real runner, made to fail one step (what a runner error mid-run looks like to the scheduler).
  r.extend = (...args: Parameters<OnnxSlotRunner['extend']>) => {
    if (failNext) {
      failNext = false;
      return Promise.reject(new Error('injected runner failure'));
    }
    return real(...args);
  };
  const engine = new NativeEngine(r, { slots: 2, maxLen: 64 });
  failNext = true;
  const failed = await Promise.allSettled([1, 2].map((i) => engine.generate({ requestId: `f${i}`, sessionId: `s${i}`, promptIds: [i, i + 1], sampling: sampling() })));
  for (const f of failed) {
    assert.equal(f.status, 'rejected');
    assert.match(String((f as PromiseRejectedResult).reason), /injected runner failure/);
  }
  // Both slots were taken by the failed turns; without freeing them these would wait forever.
  const later = await Promise.race([
    Promise.all([3, 4, 5].map((i) => engine.generate({ requestId: `l${i}`, promptIds: [i, i + 1, i + 2], sampling: sampling({ seed: i }) }))),
    new Promise<null>((res) => setTimeout(() => res(null), 20_000).unref()),
  ]);
  assert.ok(later, 'later requests were served after the failed step');
  for (const x of later) assert.equal(x.tokenIds.length, 5);
  // The failed sessions' next turns start from an empty slot: prefilled in full, nothing reused.
  const before = engine.stats().reusedTokens;
  await engine.generate({ requestId: 'again', sessionId: 's1', promptIds: [1, 2, 3], sampling: sampling() });
  assert.equal(engine.stats().reusedTokens, before);
  engine.close();
});

test('top alternatives are the k best of the distribution each token was sampled from (log_softmax(logits/T)), ties by token id', async () => {
  const engine = new NativeEngine(await runner(), { slots: 2, maxLen: 64 });
  const prompt = [2, 7, 1, 8];
  const T = 0.7;
  // beside it, a turn without alternatives (whose rows the runner could otherwise sample where they are)
  const [r, plain] = await Promise.all([
    engine.generate({ requestId: 'top', promptIds: prompt, sampling: sampling({ temperature: T, max_new_tokens: 6, top_k: 5 }), topLogprobs: 7 }),
    engine.generate({ requestId: 'plain', promptIds: [3, 4], sampling: sampling() }),
  ]);
  assert.equal(plain.topLogprobs, undefined);
  assert.equal(r.topLogprobs!.length, r.tokenIds.length);
  // The teacher-forced pass: the whole sequence in one run of the general graph, no cache.
  const full = await PolicyRunner.create(config, weights, 0, { mode: 'all' });
  const seq = [...prompt, ...r.tokenIds];
  const bias = new Float32Array(seq.length * seq.length).fill(-1e9);
  for (let i = 0; i < seq.length; i++) bias.fill(0, i * seq.length, i * seq.length + i + 1);
  const empty = { len: 0, keys: [new Float32Array()], values: [new Float32Array()] };
  const rows = (await full.step({ batch: 1, seq: seq.length, inputIds: BigInt64Array.from(seq.map(BigInt)), positionIds: BigInt64Array.from(seq.map((_, i) => BigInt(i))), bias, past: empty })).logprobs;
  await full.release();
  const V = config.vocab_size;
  r.tokenIds.forEach((tok, i) => {
    const row = rows.subarray((prompt.length - 1 + i) * V, (prompt.length + i) * V);
    const scaled = Array.from(row, (x) => x / T);
    const max = Math.max(...scaled);
    const lse = max + Math.log(scaled.reduce((acc, x) => acc + Math.exp(x - max), 0));
    const best = scaled.map((x, t) => ({ t, lp: x - lse })).sort((a, c) => c.lp - a.lp || a.t - c.t).slice(0, 7);
    const alts = r.topLogprobs![i]!;
    assert.equal(alts.length, 7);
    alts.forEach((a, j) => {
      assert.equal(a.token, best[j]!.t, `token ${i} alternative ${j}`);
      assert.ok(Math.abs(a.logprob - best[j]!.lp) < 1e-4, `token ${i} alternative ${j}: ${a.logprob} vs ${best[j]!.lp}`);
    });
    // top_k 5 truncates what is sampled, not the distribution reported: the sampled token is among the 5 best,
    // with the very log-prob reported for it.
    assert.ok(alts.slice(0, 5).some((a) => a.token === tok && a.logprob === r.logprobs[i]), `token ${i}`);
  });
  engine.close();
});

/** The real runner, whose extend fails at the chosen calls (what a runner error mid-run looks like to the scheduler). */
function failing(r: OnnxSlotRunner, calls: number[]): { rows: number[] } {
  const real = r.extend.bind(r);
  let n = 0;
  const seen = { rows: [] as number[] };
  r.extend = (...args: Parameters<OnnxSlotRunner['extend']>) => {
    seen.rows.push(args[0].length);
    return calls.includes(++n) ? Promise.reject(new Error(`injected failure of step ${n}`)) : real(...args);
  };
  return seen;
}

async function alone(promptIds: number[], seed: number, w = weights, maxNew = 5): Promise<number[]> {
  const e = new NativeEngine(await runner(0, w), { slots: 1, maxLen: 64 });
  const out = (await e.generate({ requestId: 'alone', promptIds, sampling: sampling({ seed, max_new_tokens: maxNew }) })).tokenIds;
  e.close();
  return out;
}

for (const [which, call, prefill] of [['prefill', 1, 6], ['decode', 2, 0]] as const) {
  test(`a failed ${which} step rejects its turns, naming version and step; a request waiting for room runs after it as it would alone`, async () => {
    const r = await runner(3);
    failing(r, [call]);
    const engine = new NativeEngine(r, { slots: 2, maxLen: 64, version: 3 });
    assert.equal(engine.healthy(), true);
    const inStep = [engine.generate({ requestId: 'a', promptIds: [1, 2, 3], sampling: sampling({ seed: 1 }) }), engine.generate({ requestId: 'b', promptIds: [4, 5, 6], sampling: sampling({ seed: 2 }) })];
    const queued = engine.generate({ requestId: 'c', promptIds: [7, 8], sampling: sampling({ seed: 3 }) }); // no slot free: it waits
    for (const o of await Promise.allSettled(inStep)) {
      const err = o.status === 'rejected' ? (o.reason as Error) : assert.fail('a turn of the failed step succeeded');
      assert.ok(isRlstreamError(err, 'INTERNAL'));
      assert.match(err.message, new RegExp(`^policy v3 step \\(2 rows, ${prefill} prompt tokens\\) failed: (Error: )?injected failure of step ${call}$`));
    }
    assert.deepEqual((await queued).tokenIds, await alone([7, 8], 3));
    assert.deepEqual((await engine.generate({ requestId: 'd', promptIds: [9, 10, 11, 12], sampling: sampling({ seed: 4 }) })).tokenIds, await alone([9, 10, 11, 12], 4));
    assert.equal(engine.healthy(), true, 'a bad step does not make the engine unhealthy');
    engine.close();
  });
}

test('a runner that no longer runs fails the waiting and later requests at once; weights swapped in serve again', async () => {
  const r = await runner(1);
  const real = r.extend.bind(r);
  let n = 0;
  // The onnxruntime session is disposed between two steps, while turns are running and one is waiting.
  r.extend = async (...args: Parameters<OnnxSlotRunner['extend']>) => {
    if (++n === 3) await r.release();
    return real(...args);
  };
  const engine = new NativeEngine(r, { slots: 2, maxLen: 64, version: 1 });
  const all = [1, 2, 3].map((i) => engine.generate({ requestId: `d${i}`, promptIds: [i, i + 1], sampling: sampling({ seed: i, max_new_tokens: 20 }) }));
  const reasons = (await Promise.allSettled(all)).map((o) => (o.status === 'rejected' ? (o.reason as Error) : assert.fail('a request on a dead runner succeeded')));
  assert.ok(isRlstreamError(reasons[0], 'INTERNAL'));
  assert.match(reasons[0]!.message, /^policy v1 step \(2 rows, 0 prompt tokens\) failed: .*(disposed|released)/i);
  // The waiting one never ran: it fails with the runner's error instead of waiting forever.
  assert.ok(isRlstreamError(reasons[2], 'BACKEND_UNAVAILABLE') && !reasons[2].retriable, String(reasons[2]));
  assert.match(reasons[2].message, /^policy v1 can no longer run/);
  assert.equal(engine.healthy(), false);
  const t0 = performance.now();
  await assert.rejects(engine.generate({ requestId: 'later', promptIds: [7], sampling: sampling() }), (e: unknown) => isRlstreamError(e, 'BACKEND_UNAVAILABLE') && /can no longer run/.test(e.message));
  assert.ok(performance.now() - t0 < 50, 'a later request fails at once');
  await engine.swap(2, () => r.addWeights(weights, 2), 'next_turn');
  assert.equal(engine.healthy(), true);
  const again = await engine.generate({ requestId: 'again', promptIds: [7, 8, 9], sampling: sampling({ seed: 5 }) });
  assert.deepEqual(again.policyVersions, [2, 2, 2, 2, 2]);
  assert.deepEqual(again.tokenIds, await alone([7, 8, 9], 5));
  engine.close();
});

test('kv_cache_bytes buys slots for idle sessions beyond max_batch, least recently used evicted; at most max_batch run at once', async () => {
  const r = await runner();
  // One slot of this model at 64 tokens: 1 layer × K,V × 2 heads × 8 dims × 4 bytes × 64 = 8 KiB.
  const slotBytes = r.kvBytes(1, 64);
  assert.equal(slotBytes, 1 * 2 * 2 * 8 * 4 * 64);
  assert.deepEqual(cpuKvSlots({ kvCacheBytes: 0, slotBytes, maxBatch: 2 }), { slots: 2, keptSessions: 0 });
  assert.deepEqual(cpuKvSlots({ kvCacheBytes: 2 * slotBytes - 1, slotBytes, maxBatch: 2 }), { slots: 3, keptSessions: 1 });
  assert.throws(() => cpuKvSlots({ kvCacheBytes: -1, slotBytes, maxBatch: 2 }), /backend\.kv_cache_bytes must be a non-negative integer, got -1/);
  const { slots } = cpuKvSlots({ kvCacheBytes: slotBytes, slotBytes, maxBatch: 2 });
  const seen = failing(r, []);
  const engine = new NativeEngine(r, { slots, maxLen: 64, maxBatch: 2 });
  const turn = (s: string, promptIds: number[]) => engine.generate({ requestId: s, sessionId: s, promptIds, sampling: sampling({ max_new_tokens: 3 }) });
  // Three at once: two run, the third waits for a running slot although an idle one is free.
  await Promise.all([turn('s1', [1, 2, 3]), turn('s2', [4, 5, 6]), turn('s3', [7, 8, 9])]);
  assert.ok(Math.max(...seen.rows) <= 2, `rows per step: ${seen.rows.join(',')}`);
  // All three kept (2 + 1 slots); a fourth session takes the least recently used one's.
  await turn('s4', [10, 11, 12]);
  const reused = async (s: string, promptIds: number[]) => {
    const before = engine.stats().reusedTokens;
    await turn(s, promptIds);
    return engine.stats().reusedTokens - before;
  };
  assert.equal(await reused('s3', [7, 8, 9, 1]), 3, 's3 was kept');
  assert.equal(await reused('s1', [1, 2, 3, 1]), 0, 's1 was evicted');
  engine.close();
});

test("swap 'finish': a turn started on v1 finishes on v1 while new turns take v2; a session keeps v1 (and its cache) until released", async () => {
  const w2 = randomWeights(config, 4);
  const r = await runner(1);
  const real = r.extend.bind(r);
  let calls = 0;
  let open!: () => void;
  const gate = new Promise<void>((res) => (open = res));
  // The third step waits until the swap is done and a new turn queued, so the two overlap for sure.
  r.extend = async (...args: Parameters<OnnxSlotRunner['extend']>) => {
    if (++calls === 3) await gate;
    return real(...args);
  };
  const engine = new NativeEngine(r, { slots: 4, maxLen: 64, version: 1 });
  const prompt = [2, 4, 6];
  const long = engine.generate({ requestId: 'long', sessionId: 'old', promptIds: prompt, sampling: sampling({ seed: 9, max_new_tokens: 20 }) });
  const plain = engine.generate({ requestId: 'plain', promptIds: [5, 6], sampling: sampling({ seed: 8, max_new_tokens: 20 }) });
  while (calls < 3) await new Promise((res) => setImmediate(res));
  await engine.swap(2, () => r.addWeights(w2, 2), 'finish');
  assert.equal(engine.currentPolicyVersion(), 2);
  assert.deepEqual(r.weightVersions(), [1, 2]);
  const fresh = engine.generate({ requestId: 'fresh', sessionId: 'new', promptIds: prompt, sampling: sampling({ seed: 9, max_new_tokens: 20 }) });
  open();
  const [t1, tp, tf] = await Promise.all([long, plain, fresh]);
  assert.deepEqual(t1.policyVersions, new Array(20).fill(1));
  assert.deepEqual(tp.policyVersions, new Array(20).fill(1), 'a turn without a session finishes on its version too');
  assert.deepEqual(tf.policyVersions, new Array(20).fill(2));
  // Each as it would be alone on its own weights: no row ran on the other version's.
  assert.deepEqual(t1.tokenIds, await alone(prompt, 9, weights, 20));
  assert.deepEqual(tp.tokenIds, await alone([5, 6], 8, weights, 20));
  assert.deepEqual(tf.tokenIds, await alone(prompt, 9, w2, 20));
  assert.notDeepEqual(t1.tokenIds, tf.tokenIds);
  // The session's next turn stays on v1 and starts from its cache.
  const ctx2 = [...prompt, ...t1.tokenIds, 3];
  const before = engine.stats().reusedTokens;
  const t2 = await engine.generate({ requestId: 't2', sessionId: 'old', promptIds: ctx2, sampling: sampling({ max_new_tokens: 4 }) });
  assert.deepEqual(t2.policyVersions, [1, 1, 1, 1]);
  assert.equal(engine.stats().reusedTokens - before, prompt.length + 19);
  assert.deepEqual(r.weightVersions(), [1, 2], 'v1 stays loaded while a session is pinned to it');
  engine.releaseSession('old');
  assert.deepEqual(r.weightVersions(), [2], 'v1 unloaded once nothing needs it');
  const t3 = await engine.generate({ requestId: 't3', sessionId: 'old', promptIds: [...ctx2, ...t2.tokenIds], sampling: sampling({ max_new_tokens: 4 }) });
  assert.deepEqual(t3.policyVersions, [2, 2, 2, 2]);
  engine.close();
});

test("swap 'finish': past maxLiveVersions the oldest version's sessions move to the newest; a runner of one version refuses 'finish'", async () => {
  const r = await runner(1);
  const engine = new NativeEngine(r, { slots: 4, maxLen: 64, version: 1, maxLiveVersions: 2 });
  const turn = async (s: string) => (await engine.generate({ requestId: s, sessionId: s, promptIds: [1, 2], sampling: sampling({ max_new_tokens: 2 }) })).policyVersions;
  assert.deepEqual(await turn('a'), [1, 1]);
  await engine.swap(2, () => r.addWeights(randomWeights(config, 5), 2), 'finish');
  assert.deepEqual(await turn('b'), [2, 2]);
  assert.deepEqual(await turn('a'), [1, 1]);
  await engine.swap(3, () => r.addWeights(randomWeights(config, 6), 3), 'finish');
  assert.deepEqual(r.weightVersions(), [2, 3]);
  assert.deepEqual(await turn('a'), [3, 3]);
  assert.deepEqual(await turn('b'), [2, 2]);
  await assert.rejects(engine.swap(3, () => r.addWeights(weights, 3), 'finish'), /policy version 3 is already loaded/);
  engine.close();

  // The runner without dropWeights (as the native Model): one version's weights at a time.
  const one = await runner();
  const single: SlotRunner = { config: one.config, kvReserve: (s, m) => one.kvReserve(s, m), kvTruncate: (s, l) => one.kvTruncate(s, l), extend: (...a) => one.extend(...a) };
  const e1 = new NativeEngine(single, { slots: 1, maxLen: 64 });
  let loaded = false;
  await assert.rejects(e1.swap(1, async () => void (loaded = true), 'finish'), (e: unknown) => isRlstreamError(e, 'CONFIG_INVALID') && /'finish' needs two versions' weights at once/.test(e.message));
  assert.equal(loaded, false);
  assert.equal((await e1.generate({ requestId: 'x', promptIds: [1], sampling: sampling() })).policyVersions.length, 5);
  e1.close();
});

test('an aborted turn returns its tokens so far with finishReason abort (a prefix of its run alone); the others go on', async () => {
  const r = await runner();
  const real = r.extend.bind(r);
  const ac = new AbortController();
  let calls = 0;
  r.extend = (...args: Parameters<OnnxSlotRunner['extend']>) => {
    if (++calls === 4) ac.abort(); // while the fourth step runs: its token is kept, and no fifth step takes the turn
    return real(...args);
  };
  const engine = new NativeEngine(r, { slots: 2, maxLen: 64 });
  const long = engine.generate({ requestId: 'long', promptIds: [1, 2, 3], sampling: sampling({ seed: 1, max_new_tokens: 40 }) }, ac.signal);
  const other = engine.generate({ requestId: 'other', promptIds: [4, 5, 6], sampling: sampling({ seed: 2, max_new_tokens: 30 }) });
  const [a, o] = await Promise.all([long, other]);
  assert.equal(a.finishReason, 'abort');
  assert.equal(a.tokenIds.length, 4);
  assert.deepEqual(a.tokenIds, (await alone([1, 2, 3], 1, weights, 40)).slice(0, 4));
  assert.deepEqual(o.tokenIds, await alone([4, 5, 6], 2, weights, 30));
  const pre = new AbortController();
  pre.abort();
  const none = await engine.generate({ requestId: 'pre', promptIds: [1], sampling: sampling() }, pre.signal);
  assert.deepEqual([none.tokenIds, none.finishReason], [[], 'abort']);
  engine.close();
});

test('generated: turns of random prompts, sampling, sessions and alternatives in three waves around two finish swaps, each equal to its run alone on its version', async () => {
  let state = 0x9e3779b9;
  const rand = (n: number) => ((state = (Math.imul(state, 1664525) + 1013904223) >>> 0) % n);
  const versions = [weights, randomWeights(config, 7), randomWeights(config, 8)];
  const r = await runner(0);
  const engine = new NativeEngine(r, { slots: 4, maxBatch: 3, maxLen: 48, version: 0 });
  const refs = await Promise.all(versions.map(async (w) => new NativeEngine(await runner(0, w), { slots: 1, maxLen: 48 })));
  const pinned = new Map<string, number>();
  let cases = 0;
  for (let wave = 0; wave < 3; wave++) {
    if (wave > 0) await engine.swap(wave, () => r.addWeights(versions[wave]!, wave), 'finish');
    const reqs: GenerateRequest[] = Array.from({ length: 10 }, (_, i) => {
      const session = ['a', 'b', 'c', 'd', undefined][rand(5)];
      const s = sampling({ seed: rand(1000), max_new_tokens: 1 + rand(8), temperature: [0, 0.7, 1, 1.3][rand(4)]!, top_k: [0, 0, 3, 20][rand(4)]!, top_p: [1, 1, 0.9, 0.5][rand(4)]!, stop_token_ids: rand(3) === 0 ? [rand(61)] : [] });
      return { requestId: `w${wave}-${i}`, promptIds: Array.from({ length: 1 + rand(20) }, () => rand(61)), sampling: s, ...(session && { sessionId: session }), ...(rand(3) === 0 && { topLogprobs: 1 + rand(5) }) };
    });
    // A session keeps the version of its first turn (waves run one after another, so that is its first wave's).
    const expected = reqs.map((q) => (q.sessionId === undefined ? wave : (pinned.get(q.sessionId) ?? (pinned.set(q.sessionId, wave), wave))));
    const got = await Promise.all(reqs.map((q) => engine.generate(q)));
    for (const [i, q] of reqs.entries()) {
      const v = expected[i]!;
      const want = await refs[v]!.generate({ ...q, sessionId: undefined } as GenerateRequest);
      const g = got[i]!;
      assert.deepEqual(g.policyVersions, new Array(g.tokenIds.length).fill(v), `${q.requestId}: versions`);
      assert.deepEqual(g.tokenIds, want.tokenIds, `${q.requestId}: tokens`);
      assert.ok(maxAbs(g.logprobs, want.logprobs) < 1e-4, `${q.requestId}: log-probs`);
      assert.equal(g.finishReason, want.finishReason);
      assert.equal(g.topLogprobs?.length, q.topLogprobs ? g.tokenIds.length : undefined);
      g.topLogprobs?.forEach((alts, t) => assert.deepEqual(alts.map((a) => a.token), want.topLogprobs![t]!.map((a) => a.token), `${q.requestId}: alternatives of token ${t}`));
      cases++;
    }
  }
  assert.equal(cases, 30);
  assert.deepEqual(r.weightVersions().sort(), [...new Set(pinned.values()), 2].filter((v, i, a) => a.indexOf(v) === i).sort(), 'loaded: the versions sessions are pinned to, and the newest');
  engine.close();
  for (const e of refs) e.close();
});

function maxAbs(a: number[], b: number[]): number {
  return Math.max(0, ...a.map((x, i) => Math.abs(x - b[i]!)));
}
