// One continuous-batching scheduler (producers/policy/native-engine.ts) over two model runners: the ONNX runner
// as a SlotRunner (onnx-slot-runner.ts) and the native core's Model on the CPU, built from the same weights.
// Both give the same tokens and log-probs on the same requests, the log-probs those of a teacher-forced pass;
// behind the scheduler the ONNX runner batches continuously (more requests than slots, each equal to
// its run alone), reuses a session's slot for its next turn, takes a new version's weights mid-turn (next_token)
// or for the turns started after it while those under way finish on the old (next_turn), refuses slots and
// lengths outside its cache, and over random steps (decodes and prefills mixed, two versions, truncations, its
// buffers growing and shrinking) gives every slot the distribution of its whole sequence run afresh.
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { hfConfigJson } from '../../core/weights/model-config.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import { Model, nativeAvailable, parseModelConfig } from '../../native/index.ts';
import type { GenerateRequest, GenerateResult } from '../../producers/backends/types.ts';
import { NativeEngine } from '../../producers/policy/native-engine.ts';
import { OnnxSlotRunner } from '../../producers/policy/onnx-slot-runner.ts';
import { randomWeights } from '../../producers/policy/random-weights.ts';
import { MASKED } from '../../producers/policy/export.ts';
import { emptyKv, PolicyRunner } from '../../producers/policy/runner.ts';
import { scoreSequences } from '../../producers/policy/score.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';

const config = parseModelConfig({ hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 96, vocab_size: 100, max_position_embeddings: 128 });
const configJson = JSON.stringify(hfConfigJson(config));
const weights = randomWeights(config, 1);
const dir = await mkdtemp(join(tmpdir(), 'rlstream-slot-runner-'));
const weightsPath = join(dir, 'w.safetensors');
await writeSafetensors(weightsPath, weights);
const closers: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const c of closers) await c();
  await rm(dir, { recursive: true, force: true });
});

const sampling = (o: Partial<SamplingParams> = {}): SamplingParams => ({ temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 10, seed: 1, stop_token_ids: [], ...o }) as SamplingParams;
const prompt = (i: number, n: number) => Array.from({ length: n }, (_, j) => (i * 17 + j * 5 + 1) % config.vocab_size);
const requests: GenerateRequest[] = [
  { requestId: 'greedy', promptIds: prompt(0, 7), sampling: sampling({ temperature: 0 }) },
  { requestId: 'seeded', promptIds: prompt(1, 3), sampling: sampling({ seed: 4 }) },
  { requestId: 'top-k', promptIds: prompt(2, 12), sampling: sampling({ seed: 5, top_k: 8, temperature: 0.7 }) },
  { requestId: 'top-p', promptIds: prompt(3, 1), sampling: sampling({ seed: 6, top_p: 0.8 }) },
];

async function onnxEngine(slots: number, maxLen = 64): Promise<NativeEngine> {
  return (await onnxEngineAndRunner(slots, maxLen)).engine;
}

async function onnxEngineAndRunner(slots: number, maxLen = 64): Promise<{ engine: NativeEngine; runner: OnnxSlotRunner }> {
  const runner = await OnnxSlotRunner.create(config, weights);
  const engine = new NativeEngine(runner, { slots, maxLen });
  closers.push(async () => {
    engine.close();
    await runner.release();
  });
  return { engine, runner };
}

/** Teacher-forced log-probs of `out` after `prompt` under `w` (the ONNX graph in mode 'all'). */
async function score(w: typeof weights, prompt: number[], out: number[]): Promise<number[]> {
  const r = await PolicyRunner.create(config, w, 0, { mode: 'all' });
  try {
    const [lp] = await scoreSequences(r, [[...prompt, ...out]]);
    return Array.from(lp!.slice(prompt.length - 1));
  } finally {
    await r.release();
  }
}

const maxDiff = (a: number[], b: number[]) => Math.max(0, ...a.map((x, i) => Math.abs(x - b[i]!)));

/** Resolves once the engine has run `n` steps. */
async function afterSteps(engine: NativeEngine, n: number): Promise<void> {
  while (engine.stats().steps < n) await new Promise((r) => setImmediate(r));
}

function assertSame(got: GenerateResult, want: GenerateResult, what: string): void {
  assert.deepEqual(got.tokenIds, want.tokenIds, `${what}: tokens`);
  const d = Math.max(...got.logprobs.map((x, i) => Math.abs(x - want.logprobs[i]!)));
  assert.ok(d < 1e-4, `${what}: max |log-prob difference| ${d}`);
  assert.equal(got.finishReason, want.finishReason, `${what}: finish reason`);
}

test('the one scheduler over the ONNX runner and over the native CPU runner: the same tokens, and the log-probs of a teacher-forced pass', async () => {
  const onnx = await onnxEngine(4);
  const want = await Promise.all(requests.map((r) => onnx.generate(r)));
  assert.equal(onnx.stats().steps, 10, 'the four requests ran together, one step per token');
  // At T = 1 the reported log-prob is log_softmax(logits) whatever top-k / top-p cut from what is sampled.
  let checked = 0;
  for (const [i, r] of requests.entries())
    if (r.sampling.temperature === 1) {
      const d = maxDiff(want[i]!.logprobs, await score(weights, r.promptIds, want[i]!.tokenIds));
      assert.ok(d < 1e-4, `${r.requestId}: max |log-prob - teacher-forced| ${d}`);
      checked++;
    }
  assert.equal(checked, 2);
  if (!nativeAvailable()) return;
  const m = Model.load(weightsPath, parseModelConfig(JSON.parse(configJson)), { threads: 1, trainable: false });
  const native = new NativeEngine(m, { slots: 4, maxLen: 64 });
  closers.push(() => {
    native.close();
    m.dispose();
  });
  const nat = await Promise.all(requests.map((r) => native.generate(r)));
  nat.forEach((g, i) => assertSame(g, want[i]!, `native runner, ${requests[i]!.requestId}`));
});

test('over the ONNX runner: more requests than slots queue, join as others leave, and each equals its run alone', async () => {
  const many = Array.from({ length: 7 }, (_, i) => ({ requestId: `m${i}`, promptIds: prompt(i + 5, 2 + ((i * 3) % 9)), sampling: sampling({ seed: 10 + i, max_new_tokens: 3 + ((i * 5) % 11) }) }));
  const alone = await onnxEngine(1);
  const want: GenerateResult[] = [];
  for (const r of many) want.push(await alone.generate(r));
  const batched = await onnxEngine(3);
  const got = await Promise.all(many.map((r) => batched.generate(r)));
  got.forEach((g, i) => assertSame(g, want[i]!, many[i]!.requestId));
  const s = batched.stats();
  assert.ok(s.steps < want.reduce((n, r) => n + r.tokenIds.length, 0), `requests shared steps (${s.steps} steps)`);
});

test("over the ONNX runner: a session's next turn prefills only its new tokens and equals a fresh run", async () => {
  const engine = await onnxEngine(2);
  const first = await engine.generate({ requestId: 't1', sessionId: 's', promptIds: prompt(9, 6), sampling: sampling({ temperature: 0, max_new_tokens: 5 }) });
  const next = [...prompt(9, 6), ...first.tokenIds, 7, 8, 9];
  const before = engine.stats();
  const second = await engine.generate({ requestId: 't2', sessionId: 's', promptIds: next, sampling: sampling({ temperature: 0, max_new_tokens: 6 }) });
  const after = engine.stats();
  // The slot holds the prompt and every sampled token but the last (never fed back): 6 + 5 - 1 = 10.
  assert.equal(after.reusedTokens - before.reusedTokens, 10);
  assert.equal(after.prefillTokens - before.prefillTokens, next.length - 10);
  const fresh = await (await onnxEngine(1)).generate({ requestId: 't2', promptIds: next, sampling: sampling({ temperature: 0, max_new_tokens: 6 }) });
  assertSame(second, fresh, 'the second turn');
});

test("over the ONNX runner, next_token: a turn under way goes on with the new weights, each token carrying its version's log-prob", async () => {
  const w2 = randomWeights(config, 2);
  const { engine, runner } = await onnxEngineAndRunner(2);
  const p = prompt(4, 6);
  const turn = engine.generate({ requestId: 'a', sessionId: 's', promptIds: p, sampling: sampling({ max_new_tokens: 30 }) });
  await afterSteps(engine, 8);
  await engine.swap(1, () => runner.addWeights(w2, 1), 'next_token');
  const r = await turn;
  const k = r.policyVersions.indexOf(1);
  assert.ok(k >= 8 && k < 30, `the swap landed mid-turn (first v1 token at ${k})`);
  assert.ok(r.policyVersions.slice(k).every((v) => v === 1) && r.policyVersions.slice(0, k).every((v) => v === 0));
  const old = await score(weights, p, r.tokenIds);
  const neu = await score(w2, p, r.tokenIds);
  assert.ok(maxDiff(r.logprobs.slice(0, k), old.slice(0, k)) < 1e-4, 'tokens before the swap: the old weights');
  assert.ok(maxDiff(r.logprobs.slice(k), neu.slice(k)) < 1e-4, 'tokens after it: the new weights on the whole context');
  // The session's next turn does not reuse K/V the old weights computed: it equals a fresh run on the new ones.
  const next = [...p, ...r.tokenIds, 3];
  const second = await engine.generate({ requestId: 'b', sessionId: 's', promptIds: next, sampling: sampling({ temperature: 0, max_new_tokens: 4 }) });
  assert.deepEqual(second.policyVersions, [1, 1, 1, 1]);
  assert.ok(maxDiff(second.logprobs, await score(w2, next, second.tokenIds)) < 1e-4);
});

test('over the ONNX runner, next_turn: the new weights load while the turn under way goes on; it finishes on the old ones, a turn started meanwhile runs on the new', async () => {
  const w2 = randomWeights(config, 2);
  const { engine, runner } = await onnxEngineAndRunner(2);
  const p = prompt(6, 5);
  let done = false;
  const turn = engine.generate({ requestId: 'a', sessionId: 's', promptIds: p, sampling: sampling({ max_new_tokens: 40 }) }).finally(() => (done = true));
  await afterSteps(engine, 4);
  await engine.swap(1, () => runner.addWeights(w2, 1), 'next_turn');
  // The swap did not wait for the turn under way, and a turn admitted now does not either.
  assert.equal(done, false, 'the swap returned while the turn was still generating');
  const p2 = prompt(7, 4);
  const during = engine.generate({ requestId: 'b', promptIds: p2, sampling: sampling({ max_new_tokens: 6 }) });
  const [r, b] = await Promise.all([turn, during]);
  assert.ok(r.policyVersions.every((v) => v === 0));
  assert.ok(maxDiff(r.logprobs, await score(weights, p, r.tokenIds)) < 1e-4);
  assert.ok(b.policyVersions.every((v) => v === 1));
  assert.ok(maxDiff(b.logprobs, await score(w2, p2, b.tokenIds)) < 1e-4);
  // The session's next turn runs the new weights too, its old K/V dropped; the old weights are unloaded.
  const next = [...p, ...r.tokenIds, 3];
  const again = await engine.generate({ requestId: 'c', sessionId: 's', promptIds: next, sampling: sampling({ max_new_tokens: 4 }) });
  assert.ok(again.policyVersions.every((v) => v === 1));
  assert.ok(maxDiff(again.logprobs, await score(w2, next, again.tokenIds)) < 1e-4);
  assert.deepEqual(runner.weightVersions(), [1]);
});

test('generated: the ONNX runner over random steps (decodes and prefills mixed, two versions, truncations) gives each slot the distribution of its whole sequence run afresh', async () => {
  const w2 = randomWeights(config, 3);
  const r = await OnnxSlotRunner.create(config, weights, { version: 0 });
  await r.addWeights(w2, 1);
  const refs = [await PolicyRunner.create(config, weights, 0), await PolicyRunner.create(config, w2, 1)];
  closers.push(async () => {
    await r.release();
    for (const x of refs) await x.release();
  });
  const SLOTS = 7;
  const MAX = 120;
  r.kvReserve(SLOTS, MAX);
  // What each slot holds and the version that computed it (a slot keeps one until emptied).
  const held: number[][] = Array.from({ length: SLOTS }, () => []);
  const ver = new Array<number>(SLOTS).fill(-1);
  let seed = 99;
  const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  /** softmax(logits) after the last token of `ids`, from an empty cache on version v's weights. */
  const fresh = async (v: number, ids: number[]): Promise<Float32Array> => {
    const n = ids.length;
    const bias = new Float32Array(n * n).fill(MASKED);
    for (let i = 0; i < n; i++) bias.fill(0, i * n, i * n + i + 1);
    const out = await refs[v]!.step({ batch: 1, seq: n, inputIds: BigInt64Array.from(ids, BigInt), positionIds: BigInt64Array.from(ids, (_, i) => BigInt(i)), bias, past: emptyKv(config) });
    return out.logprobs.map(Math.exp);
  };
  let mixed = 0;
  let shrunk = 0;
  let widest = 0;
  const truncate = (s: number, keep: number) => {
    r.kvTruncate(s, keep);
    held[s]!.length = keep;
    if (keep === 0) ver[s] = -1;
  };
  for (let it = 0; it < 120; it++) {
    // Now and then every slot is cut short (sessions released), so the buffers' room outgrows what they hold.
    if (it % 40 === 39) for (let s = 0; s < SLOTS; s++) truncate(s, Math.min(held[s]!.length, rand(6)));
    if (rand(5) === 0) {
      const s = rand(SLOTS);
      truncate(s, rand(held[s]!.length + 1));
      continue;
    }
    const v = rand(2);
    const rows: number[] = [];
    for (let s = 0; s < SLOTS; s++) if ((ver[s] === v || ver[s] === -1) && rand(3) > 0) rows.push(s);
    const counts = rows.map((s) => Math.min(MAX - held[s]!.length, held[s]!.length === 0 || rand(4) === 0 ? 1 + rand(12) : 1));
    const step = rows.filter((_, i) => counts[i]! > 0);
    const cnt = counts.filter((n) => n > 0);
    if (step.length === 0) continue;
    if (cnt.some((n) => n === 1) && cnt.some((n) => n > 1)) mixed++;
    const toks = cnt.map((n) => Array.from({ length: n }, () => rand(config.vocab_size)));
    const before = r.capacity();
    const probs = await r.extend(Int32Array.from(step), Int32Array.from(cnt), Int32Array.from(toks.flat()), undefined, undefined, v);
    if (r.capacity() < before) shrunk++;
    for (const [b, s] of step.entries()) {
      held[s]!.push(...toks[b]!);
      ver[s] = v;
      widest = Math.max(widest, held[s]!.length);
      const want = await fresh(v, held[s]!);
      const got = probs.subarray(b * config.vocab_size, (b + 1) * config.vocab_size);
      const d = Math.max(...want.map((x, i) => Math.abs(x - got[i]!)));
      assert.ok(d < 1e-4, `step ${it}, slot ${s} (v${v}, ${held[s]!.length} tokens): max |p - p afresh| ${d}`);
    }
  }
  // The corpus reached what it is for: steps mixing decodes with prefills, and buffers that grew and shrank.
  assert.ok(mixed >= 5, `${mixed} mixed steps`);
  assert.ok(shrunk >= 1 && widest > 64, `buffers shrank ${shrunk} times, widest slot ${widest}`);
});

test('the ONNX slot runner refuses slots outside its cache or twice in a step, lengths beyond maxLen and a token count that does not add up', async () => {
  const r = await OnnxSlotRunner.create(config, weights);
  closers.push(() => r.release());
  r.kvReserve(2, 4);
  const fails = async (f: () => Promise<unknown> | unknown, match: RegExp) => {
    try {
      await f();
    } catch (err) {
      assert.ok(isRlstreamError(err), String(err));
      assert.match((err as Error).message, match);
      return;
    }
    assert.fail(`expected a failure matching ${match}`);
  };
  await fails(() => r.extend(Int32Array.of(2), Int32Array.of(1), Int32Array.of(5)), /slot 2 is outside the cache's 2 slots/);
  await fails(() => r.extend(Int32Array.of(0), Int32Array.of(5), Int32Array.of(1, 2, 3, 4, 5)), /would hold 5 tokens, more than maxLen 4/);
  await fails(() => r.extend(Int32Array.of(0), Int32Array.of(2), Int32Array.of(1)), /counts add up to 2 tokens, got 1/);
  await fails(() => r.kvTruncate(0, 1), /holds 0 tokens, cannot keep 1/);
  // Both slots once each is the in-place decode path, a slot twice would write one row over the other.
  await fails(() => r.extend(Int32Array.of(1, 1), Int32Array.of(1, 1), Int32Array.of(1, 2)), /slot 1 appears twice in one step/);
  await fails(() => r.extend(Int32Array.of(1, 1), Int32Array.of(2, 1), Int32Array.of(1, 2, 3)), /slot 1 appears twice in one step/);
  // A refused call changed nothing: the slot still takes its full length.
  const probs = await r.extend(Int32Array.of(0), Int32Array.of(4), Int32Array.of(1, 2, 3, 4));
  assert.equal(probs.length, config.vocab_size);
  assert.ok(Math.abs(probs.reduce((a, b) => a + b, 0) - 1) < 1e-4);
});
