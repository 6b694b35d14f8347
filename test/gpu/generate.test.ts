// Incremental decoding on device 'cuda' (Model.extend over the slot KV cache, and NativeEngine on it) against the
// full-sequence forward of the same weights on cuda and on the CPU (fp32), with the largest differences printed as
// diagnostics; batched slots against each alone; a multi-turn slot; a trainer step seen in place. Skips with a
// message where the addon has no CUDA layer or no GPU is present (every CI machine).
import assert from 'node:assert/strict';
import { test, type TestContext } from 'node:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { jsonLogger } from '../../core/telemetry.ts';
import { Model, cudaAvailable, cudaMemory, nativeAvailable, type ModelConfig } from '../../native/index.ts';
import { NativePolicyBackend } from '../../producers/policy/native-backend.ts';
import { DEFAULT_PREFILL_TOKENS, NativeEngine } from '../../producers/policy/native-engine.ts';
import type { SamplingParams } from '../../schemas/generated/types.ts';
import { TINY, argmax, decodeGreedy, fullLogprobs, maxAbsDiff, one, pack, randomSeqs, rng } from '../native/helpers.ts';

const built = nativeAvailable();
const skip = !built ? 'native addon not built (npm run build:native)' : cudaAvailable() ? false : 'no CUDA: addon built without RLSTREAM_CUDA=1 or no GPU present';
// head dim 64 (SmolLM2's) and 48 (lanes past the head dim idle in the one-query attention kernel)
const HD64: ModelConfig = { ...TINY, hidden_size: 192, num_attention_heads: 3, num_key_value_heads: 1, intermediate_size: 384, vocab_size: 500, max_position_embeddings: 1024, attention_bias: false, tie_word_embeddings: true };
const HD48: ModelConfig = { ...HD64, hidden_size: 96, num_attention_heads: 2, intermediate_size: 160, attention_bias: true, tie_word_embeddings: false };
// bf16 operands in every product: log-probs agree with fp32 to a few 1e-2 at these scales (cuda.test.ts: 1e-2 relative)
const BF16_LOGPROB = 0.1;

function pair(cfg: ModelConfig, seed: number, initStd = 0.1): { gpu: Model; cpu: Model } {
  return { gpu: Model.init(cfg, { seed, initStd, device: 'cuda' }), cpu: Model.init(cfg, { seed, initStd, threads: 4 }) };
}

for (const [name, cfg] of [['head dim 64', HD64], ['head dim 48', HD48]] as const) {
  test(`cuda, ${name}: a greedy continuation through the KV cache has the log-probs of the full forward (cuda and cpu)`, { skip }, async (t: TestContext) => {
    const { gpu, cpu } = pair(cfg, 3);
    gpu.kvReserve(3, 600);
    const prompt = randomSeqs(rng(1), [300], cfg.vocab_size)[0]!;
    const seq = [...prompt];
    const got: number[] = [];
    await decodeGreedy(gpu, 2, await gpu.extend(one(2), one(prompt.length), Int32Array.from(prompt)), 200, seq, got);
    const dg = maxAbsDiff(got, await fullLogprobs(gpu, seq, prompt.length));
    const dc = maxAbsDiff(got, await fullLogprobs(cpu, seq, prompt.length));
    t.diagnostic(`${name}: 200 greedy tokens after a 300-token prompt: max |KV log-prob - forward| cuda ${dg.toExponential(2)}, cpu fp32 ${dc.toExponential(2)}`);
    assert.ok(dg < BF16_LOGPROB && dc < BF16_LOGPROB, `cuda ${dg}, cpu ${dc}`);
    gpu.dispose();
    cpu.dispose();
  });
}

// The cached attention's layouts: head dims 32, 64 and 128 take the kernel where 4, 8 or 16 lanes hold a key's row
// (1, 2, 7 and 8 query heads a key head: its 1-, 2-, 8- and 8-head variants; HD64's 3 take the 4-head one); 160
// and 42 take the lane-per-dim kernel (160 with lanes past the head idle, 42 with some idle in its last dim). A
// step of one slot splits each row's keys over blocks that merge their results; a step of 300 slots does not.
const LAYOUTS: Array<[string, ModelConfig]> = [
  ['hd128, 8 heads on 1 key head', { ...HD64, hidden_size: 1024, num_attention_heads: 8, num_key_value_heads: 1, intermediate_size: 256 }],
  ['hd64, 14 heads on 2 key heads', { ...HD64, hidden_size: 896, num_attention_heads: 14, num_key_value_heads: 2, intermediate_size: 256 }],
  ['hd64, 4 heads on 2 key heads', { ...HD64, hidden_size: 256, num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 256 }],
  ['hd32, 4 heads on 4 key heads', { ...HD64, hidden_size: 128, num_attention_heads: 4, num_key_value_heads: 4 }],
  ['hd160, 2 heads on 1 key head', { ...HD64, hidden_size: 320, num_attention_heads: 2, num_key_value_heads: 1 }],
  ['hd42, 2 heads on 1 key head', { ...HD64, hidden_size: 84, num_attention_heads: 2, num_key_value_heads: 1 }],
];
test('cuda: every attention layout decodes as the full forward, and a step of one slot as a step of 300', { skip }, async (t: TestContext) => {
  for (const [name, cfg] of LAYOUTS) {
    // weights scaled so that the activations are as large as HD64's (the bf16 tolerance below is set at that scale)
    const { gpu, cpu } = pair(cfg, 11, 0.1 * Math.sqrt(HD64.hidden_size / cfg.hidden_size));
    const V = cfg.vocab_size;
    const r = rng(12);
    const S = 300;
    gpu.kvReserve(S + 1, 200);
    // one slot: greedy through the cache against the CPU's full forward
    const prompt = randomSeqs(r, [150], V)[0]!;
    const seq = [...prompt];
    const got: number[] = [];
    await decodeGreedy(gpu, S, await gpu.extend(one(S), one(prompt.length), Int32Array.from(prompt)), 30, seq, got);
    const dg = maxAbsDiff(got, await fullLogprobs(gpu, seq, prompt.length));
    const dc = maxAbsDiff(got, await fullLogprobs(cpu, seq, prompt.length));
    // S slots of different lengths, one decode step together, against each slot's step alone
    const prompts = randomSeqs(r, Array.from({ length: S }, (_, i) => 20 + (i * 37) % 150), V);
    const slots = Int32Array.from({ length: S }, (_, i) => i);
    await gpu.extend(slots, Int32Array.from(prompts.map((x) => x.length)), Int32Array.from(prompts.flat()));
    const feed = Int32Array.from({ length: S }, (_, i) => (i * 7) % V);
    const together = await gpu.extend(slots, new Int32Array(S).fill(1), feed);
    let worst = 0;
    for (const b of [0, 1, 150, S - 1]) {
      gpu.kvTruncate(b, prompts[b]!.length);
      const alone = await gpu.extend(one(b), one(1), one(feed[b]!));
      worst = Math.max(worst, maxAbsDiff(alone, together.subarray(b * V, (b + 1) * V)));
    }
    t.diagnostic(`${name}: max |KV log-prob - forward| cuda ${dg.toExponential(2)}, cpu fp32 ${dc.toExponential(2)}; ${S} slots together vs alone: max |probability difference| ${worst.toExponential(2)}`);
    assert.ok(dg < BF16_LOGPROB && dc < BF16_LOGPROB, `${name}: cuda ${dg}, cpu ${dc}`);
    assert.ok(worst < 1e-3, `${name}: together vs alone ${worst}`);
    gpu.dispose();
    cpu.dispose();
  }
});

test('cuda: slots of different lengths decoded in one batch equal each decoded alone', { skip }, async (t: TestContext) => {
  const V = HD64.vocab_size;
  const r = rng(2);
  const prompts = randomSeqs(r, [5, 77, 260, 31], V);
  const feeds = randomSeqs(r, [8, 8, 8, 8], V);
  const m = Model.init(HD64, { seed: 4, initStd: 0.1, device: 'cuda' });
  m.kvReserve(8, 512);
  const slots = Int32Array.of(6, 1, 3, 0);
  let p = await m.extend(slots, Int32Array.from(prompts.map((x) => x.length)), Int32Array.from(prompts.flat()));
  const together: Float32Array[][] = prompts.map(() => []);
  for (let i = 0; ; i++) {
    for (let b = 0; b < 4; b++) together[b]!.push(p.slice(b * V, (b + 1) * V));
    if (i === 8) break;
    p = await m.extend(slots, Int32Array.of(1, 1, 1, 1), Int32Array.from(feeds.map((f) => f[i]!)));
  }
  let worst = 0;
  for (let b = 0; b < 4; b++) {
    m.kvTruncate(7, 0);
    let q = await m.extend(one(7), one(prompts[b]!.length), Int32Array.from(prompts[b]!));
    for (let i = 0; ; i++) {
      worst = Math.max(worst, maxAbsDiff(q, together[b]![i]!));
      if (i === 8) break;
      q = await m.extend(one(7), one(1), one(feeds[b]![i]!));
    }
  }
  t.diagnostic(`batched vs alone: max |probability difference| ${worst.toExponential(2)}`);
  assert.ok(worst < 1e-3, `${worst}`);
  m.dispose();
});

test('cuda: a multi-turn slot equals a fresh full forward; a trainer step is seen by the next extend', { skip }, async (t: TestContext) => {
  const { gpu, cpu } = pair(HD64, 9);
  gpu.kvReserve(2, 512);
  const [p1, obs] = randomSeqs(rng(5), [40, 15], HD64.vocab_size) as [number[], number[]];
  const seq = [...p1];
  const got: number[] = [];
  const at: number[] = [];
  let probs = await gpu.extend(one(0), one(p1.length), Int32Array.from(p1));
  for (const turn of [0, 1]) {
    if (turn === 1) {
      probs = await gpu.extend(one(0), one(obs.length), Int32Array.from(obs));
      seq.push(...obs);
    }
    for (let i = 0; i < 30; i++) {
      const tok = argmax(probs);
      at.push(seq.length - p1.length);
      got.push(Math.log(probs[tok]!));
      seq.push(tok);
      probs = await gpu.extend(one(0), one(1), one(tok));
    }
  }
  const full = await fullLogprobs(cpu, seq, p1.length);
  const d = maxAbsDiff(got, at.map((i) => full[i]!));
  t.diagnostic(`multi-turn (40 + 30 + 15 + 30 tokens): max |cuda KV log-prob - cpu fp32 forward| ${d.toExponential(2)}`);
  assert.ok(d < BF16_LOGPROB, `${d}`);
  // a trainer step on the same model: the next extend (a fresh slot) sees the new weights, as the full forward does
  const before = await gpu.extend(one(1), one(20), Int32Array.from(seq.slice(0, 20)));
  const { batch, targets, responseMask } = pack([seq]);
  await gpu.backwardCrossEntropy(batch, targets, responseMask);
  await gpu.adamwStep({ lr: 0.02, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
  gpu.kvTruncate(1, 0);
  const after = await gpu.extend(one(1), one(20), Int32Array.from(seq.slice(0, 20)));
  assert.ok(maxAbsDiff(before, after) > 1e-3, 'the update is visible');
  const want = await fullLogprobs(gpu, seq.slice(0, 21), 20);
  assert.ok(Math.abs(Math.log(after[seq[20]!]!) - want[0]!) < BF16_LOGPROB);
  gpu.dispose();
  cpu.dispose();
});

test('cuda: NativeEngine samples 16 concurrent requests whose log-probs match the full forward', { skip }, async (t: TestContext) => {
  const { gpu, cpu } = pair(HD64, 12);
  const engine = new NativeEngine(gpu, { slots: 8, maxLen: 256 });
  const prompts = randomSeqs(rng(6), Array.from({ length: 16 }, (_, i) => 10 + 7 * i), HD64.vocab_size);
  const sampling = (i: number): SamplingParams => ({ temperature: 1, top_p: 0.95, top_k: 50, max_new_tokens: 40, seed: i, stop_token_ids: [] }) as SamplingParams;
  const res = await Promise.all(prompts.map((p, i) => engine.generate({ requestId: `r${i}`, promptIds: p, sampling: sampling(i) })));
  let dg = 0;
  let dc = 0;
  for (let i = 0; i < 16; i++) {
    const seq = [...prompts[i]!, ...res[i]!.tokenIds];
    dg = Math.max(dg, maxAbsDiff(res[i]!.logprobs, await fullLogprobs(gpu, seq, prompts[i]!.length)));
    dc = Math.max(dc, maxAbsDiff(res[i]!.logprobs, await fullLogprobs(cpu, seq, prompts[i]!.length)));
  }
  const s = engine.stats();
  t.diagnostic(`engine on cuda: 16 requests over 8 slots, ${s.steps} steps, ${s.decodeTokens} decode tokens; max |sampled log-prob - forward| cuda ${dg.toExponential(2)}, cpu fp32 ${dc.toExponential(2)}`);
  assert.ok(dg < BF16_LOGPROB && dc < BF16_LOGPROB, `cuda ${dg}, cpu ${dc}`);
  engine.close();
  gpu.dispose();
  cpu.dispose();
});

test('cuda: extendSample draws on the GPU what sampleToken draws on the same rows, and the engine uses it', { skip }, async (t: TestContext) => {
  const { Rng, sampleToken, newScratch } = await import('../../producers/policy/sampler.ts');
  const V = HD64.vocab_size;
  const a = Model.init(HD64, { seed: 31, initStd: 0.1, device: 'cuda' });
  const b = Model.init(HD64, { seed: 31, initStd: 0.1, device: 'cuda' });
  const B = 64;
  a.kvReserve(B, 64);
  b.kvReserve(B, 64);
  const prompts = randomSeqs(rng(32), Array.from({ length: B }, (_, i) => 1 + (i % 13)), V);
  const slots = Int32Array.from({ length: B }, (_, i) => i);
  const counts = Int32Array.from(prompts.map((p) => p.length));
  const toks = Int32Array.from(prompts.flat());
  const inv = Float32Array.from({ length: B }, (_, i) => [1, 2, 0.5, 1.5][i % 4]!);
  const r = new Rng(5);
  const u = Float64Array.from({ length: B }, (_, i) => (i % 9 === 0 ? -1 : r.next()));
  const rows = await a.extend(slots, counts, toks, inv);
  const got = await b.extendSample(slots, counts, toks, inv, u);
  const scratch = newScratch(V);
  let same = 0;
  let worst = 0;
  for (let i = 0; i < B; i++) {
    const fixed = { next: () => u[i]! } as unknown as InstanceType<typeof Rng>;
    const p = { temperature: u[i]! < 0 ? 0 : 1 / inv[i]!, top_p: 1, top_k: 0, max_new_tokens: 1, seed: null, stop_token_ids: [] };
    const want = sampleToken(rows.subarray(i * V, (i + 1) * V), p as never, fixed, scratch);
    if (got.tokens[i] === want.token) {
      same++;
      worst = Math.max(worst, Math.abs(got.logprobs[i]! - want.logprob));
    }
  }
  t.diagnostic(`extendSample on cuda: ${same}/${B} rows drew sampleToken's token, log-prob max diff ${worst.toExponential(2)}`);
  assert.equal(same, B);
  assert.ok(worst < 1e-5);
  a.dispose();
  b.dispose();
  // the engine on plain rows (drawn on the GPU): log-probs of the full forward
  const m = Model.init(HD64, { seed: 33, initStd: 0.1, device: 'cuda' });
  const engine = new NativeEngine(m, { slots: 8, maxLen: 128 });
  const res = await Promise.all(prompts.slice(0, 12).map((p, i) => engine.generate({ requestId: `p${i}`, promptIds: p, sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 30, seed: i, stop_token_ids: [] } as unknown as SamplingParams })));
  let d = 0;
  for (let i = 0; i < 12; i++) d = Math.max(d, maxAbsDiff(res[i]!.logprobs, await fullLogprobs(m, [...prompts[i]!, ...res[i]!.tokenIds], prompts[i]!.length)));
  t.diagnostic(`engine, rows drawn on the GPU: max |sampled log-prob - cuda forward| ${d.toExponential(2)}`);
  assert.ok(d < BF16_LOGPROB, `${d}`);
  engine.close();
  m.dispose();
});

test('cuda: decode steps replayed as CUDA graphs equal them run without graphs, across weight updates and a new cache', { skip }, async (t: TestContext) => {
  // b reads RLSTREAM_CUDA_GRAPHS=0 when its kernels are made: the reference path, launch by launch (a too, where the
  // whole run has graphs off)
  const graphsOn = process.env.RLSTREAM_CUDA_GRAPHS !== '0';
  const cfgs: Array<[string, ModelConfig]> = [['hd64', HD64], ['hd48 (biases, untied head)', HD48]];
  for (const [name, cfg] of cfgs) {
    const a = Model.init(cfg, { seed: 41, initStd: 0.1, device: 'cuda' });
    const prev = process.env.RLSTREAM_CUDA_GRAPHS;
    process.env.RLSTREAM_CUDA_GRAPHS = '0';
    let b: Model;
    try {
      b = Model.init(cfg, { seed: 41, initStd: 0.1, device: 'cuda' });
    } finally {
      if (prev === undefined) delete process.env.RLSTREAM_CUDA_GRAPHS;
      else process.env.RLSTREAM_CUDA_GRAPHS = prev;
    }
    const other = Model.init(cfg, { seed: 42, initStd: 0.1, device: 'cuda' });
    const V = cfg.vocab_size;
    const r = rng(43);
    let worst = 0;
    let steps = 0;
    const run = async (B: number, n: number) => {
      for (const m of [a, b]) m.kvReserve(B, 96);
      const prompts = randomSeqs(r, Array.from({ length: B }, (_, i) => 2 + ((i * 5) % 11)), V);
      const slots = Int32Array.from({ length: B }, (_, i) => i);
      const counts = Int32Array.from(prompts.map((p) => p.length));
      const inv = Float32Array.from({ length: B }, (_, i) => [1, 2, 0.5][i % 3]!);
      for (const m of [a, b]) await m.extend(slots, counts, Int32Array.from(prompts.flat()), inv);
      const ones = new Int32Array(B).fill(1);
      let feed: Int32Array = Int32Array.from({ length: B }, (_, i) => (i * 7) % V);
      for (let i = 0; i < n; i++) {
        if (i % 3 === 2) {
          // the rows to the host (extend), the other steps drawn on the device (extendSample)
          const [x, y] = [await a.extend(slots, ones, feed, inv), await b.extend(slots, ones, feed, inv)];
          worst = Math.max(worst, maxAbsDiff(Array.from(x), Array.from(y)));
          feed = Int32Array.from({ length: B }, (_, j) => argmax(x.subarray(j * V, (j + 1) * V)));
        } else {
          const u = Float64Array.from({ length: B }, (_, j) => (j % 4 === 0 ? -1 : r()));
          const [x, y] = [await a.extendSample(slots, ones, feed, inv, u), await b.extendSample(slots, ones, feed, inv, u)];
          assert.deepEqual(Array.from(x.tokens), Array.from(y.tokens), `${name}: step ${i} of batch ${B} drew other tokens`);
          worst = Math.max(worst, maxAbsDiff(Array.from(x.logprobs), Array.from(y.logprobs)));
          feed = x.tokens;
        }
        steps++;
      }
    };
    await run(5, 9);
    // new weights into both (a device copy over the fp32 parameters): the next replay sees them
    a.copyParamsFrom(other);
    b.copyParamsFrom(other);
    await run(5, 6);
    await run(3, 6); // another batch size, and a new cache (the graphs of the old one are dropped)
    const graphS = a.profile().graph;
    t.diagnostic(`${name}: ${steps} decode steps, graphs vs none: max |diff| ${worst.toExponential(2)}, graph replay ${(graphS * 1000).toFixed(2)} ms`);
    assert.ok(worst < 1e-5, `${worst}`);
    assert.ok(graphsOn ? graphS > 0 : graphS === 0, `graph replay seconds ${graphS}`);
    assert.equal(b.profile().graph, 0);
    for (const m of [a, b, other]) m.dispose();
  }
});

test('cuda: the built-in policy sizes its KV cache from the GPU memory backend.gpu_memory_utilization gives it', { skip }, async (t: TestContext) => {
  // Slots of 12 MiB (8 layers, 192 K/V dims, 1024 tokens), well above the allocator's 2 MiB pages.
  const cfg: ModelConfig = { ...HD64, num_hidden_layers: 8, num_key_value_heads: 3, max_position_embeddings: 1024 };
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-kv-'));
  try {
    const weights = join(dir, 'w.safetensors');
    // on cuda: the step's activations are laid out for the device's fused ops there (activationBytes differs); made
    // for generation as the backend loads it (its layers share one set of activations: a smaller step)
    const probe = Model.init(cfg, { seed: 5, initStd: 0.1, device: 'cuda', trainable: false });
    await probe.save(weights);
    const slotBytes = probe.kvBytes(1, 1024);
    const stepBytes = probe.activationBytes(DEFAULT_PREFILL_TOKENS + 64);
    const probeParams = probe.numParameters;
    probe.dispose();
    // What loading the model takes on this GPU (its blocks, the kernels' handles and workspaces): for generation
    // as the backend loads it, and trainable.
    const loadedBytes = (trainable: boolean): number => {
      const before = cudaMemory()!.free;
      const m = Model.load(weights, cfg, { device: 'cuda', trainable });
      const used = before - cudaMemory()!.free;
      m.dispose();
      return used;
    };
    const weightsBytes = loadedBytes(false);
    const trainableBytes = loadedBytes(true);
    const open = (utilization: number, stagesTrainerWeights = false) => {
      const lines: string[] = [];
      const backend = NativePolicyBackend.create({ configJson: JSON.stringify(cfg), weightsPath: weights, version: 0 }, { device: 'cuda', maxBatch: 64, maxLen: 1024, gpuMemoryUtilization: utilization, interrupt: 'next_turn', stagesTrainerWeights, logger: jsonLogger({ write: (l) => lines.push(l) }) });
      const loaded = lines.map((l) => JSON.parse(l) as { msg: string; slots?: number; kvCacheGiB?: number }).find((l) => l.msg === 'built-in policy loaded on the native core')!;
      return { backend, loaded, warned: lines.some((l) => l.includes('fewer sequences than backend.max_batch')) };
    };
    // A share far above what 64 slots need: max_batch slots.
    const roomy = open(0.5);
    assert.equal(roomy.loaded.slots, 64);
    assert.equal(roomy.warned, false);
    assert.ok(Math.abs(roomy.loaded.kvCacheGiB! - (64 * slotBytes) / 1024 ** 3) < 0.01);
    await roomy.backend.close();
    // A share that leaves about 10.5 slots after the weights and the step.
    const mem = cudaMemory()!;
    const share = (weightsBytes + stepBytes + 10.5 * slotBytes) / mem.total;
    const tight = open(share);
    // A generation-only model leaves out the gradients and both AdamW moments: three parameter blocks fewer.
    assert.ok(trainableBytes - weightsBytes >= 3 * 4 * probeParams, `${trainableBytes} vs ${weightsBytes}`);
    t.diagnostic(`card ${(mem.total / 1024 ** 3).toFixed(1)} GiB, ${(mem.free / 1024 ** 3).toFixed(1)} free; model ${(weightsBytes / 1024 ** 2).toFixed(0)} MiB (trainable ${(trainableBytes / 1024 ** 2).toFixed(0)}), step ${(stepBytes / 1024 ** 2).toFixed(0)} MiB; share ${share.toExponential(3)} -> ${tight.loaded.slots} slots of ${(slotBytes / 1024 ** 2).toFixed(1)} MiB`);
    assert.ok(tight.loaded.slots! >= 9 && tight.loaded.slots! <= 11, String(tight.loaded.slots));
    assert.equal(tight.warned, true);
    // It still generates, with as many requests as slots at a time.
    const res = await Promise.all(Array.from({ length: 16 }, (_, i) => tight.backend.generate({ requestId: `r${i}`, promptIds: [1, 2, 3, i], sampling: { temperature: 1, top_p: 1, top_k: 0, max_new_tokens: 8, seed: i, stop_token_ids: [] } as unknown as SamplingParams })));
    assert.equal(res.filter((r) => r.tokenIds.length === 8).length, 16);
    await tight.backend.close();
    // A trainer in the process that stages its weights for the policy: the same slots need a share larger by one
    // copy of the weights, and once the copy is made the policy holds no more than that share less a step (the
    // step's activations are allocated at the first generation, and there is none here).
    const before = cudaMemory()!.free;
    const staging = open(share + weightsBytes / mem.total, true);
    assert.ok(staging.loaded.slots! >= 9 && staging.loaded.slots! <= 11, String(staging.loaded.slots));
    const freeWithoutTrainer = cudaMemory()!.free;
    const trainer = Model.init(cfg, { seed: 6, initStd: 0.1, device: 'cuda' });
    const trainerBytes = freeWithoutTrainer - cudaMemory()!.free;
    staging.backend.stageWeights(1, trainer);
    const held = before - cudaMemory()!.free - trainerBytes;
    t.diagnostic(`staging: ${staging.loaded.slots} slots; the policy holds ${(held / 1024 ** 2).toFixed(0)} MiB with the trainer's copy, its share less a step ${(((share + weightsBytes / mem.total) * mem.total - stepBytes) / 1024 ** 2).toFixed(0)} MiB`);
    assert.ok(held <= (share + weightsBytes / mem.total) * mem.total - stepBytes + 16 * 1024 ** 2, `${held} bytes held`);
    trainer.dispose();
    await staging.backend.close();
    // A share below the weights and one step: refused at start-up, naming the field.
    assert.throws(() => open(share / 4), /backend\.gpu_memory_utilization .*Raise backend\.gpu_memory_utilization/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

