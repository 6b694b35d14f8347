// LoRA on the CPU: the adapters' gradients against central finite differences of the float64 reference run on
// merged weights (W + alpha/rank * B A, computed here from the definition, not by the native code), the base frozen
// through an optimizer step, the adapter file, merging it into a model without adapters, checkpoints, and the
// option errors.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { LORA_TARGETS, Model, nativeAvailable, type LoraOptions, type ModelConfig, type PolicyLossOptions } from '../../native/index.ts';
import { loraMetadata } from '../../native/lora.ts';
import { writeSafetensors } from '../../core/weights/safetensors.ts';
import { referenceCrossEntropy, referenceForward, referencePolicyLoss, toReferenceParams, type RefParams } from '../../native/reference.ts';
import { TINY, checkGradients, maxAbsDiff, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';

const MODULE: Record<string, string> = { q_proj: 'self_attn', k_proj: 'self_attn', v_proj: 'self_attn', o_proj: 'self_attn', gate_proj: 'mlp', up_proj: 'mlp', down_proj: 'mlp' };

/** The base weights with every adapter folded in, in float64: W + alpha/rank * B A. */
function merged(cfg: ModelConfig, base: RefParams, adapters: RefParams, lora: LoraOptions): RefParams {
  const out: RefParams = new Map(base);
  const s = lora.alpha / lora.rank;
  for (let l = 0; l < cfg.num_hidden_layers; l++)
    for (const t of lora.targets) {
      const p = `model.layers.${l}.${MODULE[t]}.${t}`;
      const W = base.get(`${p}.weight`)!;
      const A = adapters.get(`${p}.lora_A.weight`)!;
      const B = adapters.get(`${p}.lora_B.weight`)!;
      const r = lora.rank;
      const C = A.length / r;
      const OC = B.length / r;
      assert.equal(W.length, OC * C, `${p}: W is [${OC}, ${C}]`);
      const M = Float64Array.from(W);
      for (let o = 0; o < OC; o++)
        for (let c = 0; c < C; c++) {
          let d = 0;
          for (let k = 0; k < r; k++) d += B[o * r + k]! * A[k * C + c]!;
          M[o * C + c]! += s * d;
        }
      out.set(`${p}.weight`, M);
    }
  return out;
}

/** Splits float64 parameters into base and adapter maps. */
function split(all: RefParams): { base: RefParams; adapters: RefParams } {
  const base: RefParams = new Map();
  const adapters: RefParams = new Map();
  for (const [n, v] of all) (/\.lora_[AB]\.weight$/.test(n) ? adapters : base).set(n, v);
  return { base, adapters };
}

/** A model with adapters whose B is random too (B = 0 at init would make every A gradient zero). */
function setup(cfg: ModelConfig, lora: LoraOptions, lengths: number[], seed: number) {
  const model = Model.init(cfg, { seed, threads: 2, initStd: 0.4, logitChunkTokens: 4, lora });
  const r = rng(seed + 7);
  for (const [n, v] of model.adapter()) if (n.includes('lora_B')) for (let i = 0; i < v.data.length; i++) v.data[i] = (r() - 0.5) * 0.8;
  return { model, ...pack(randomSeqs(rng(seed + 100), lengths, cfg.vocab_size)) };
}

const ALL: LoraOptions = { rank: 2, alpha: 3, targets: [...LORA_TARGETS] };

test('LoRA: adapter gradients match finite differences of the reference on merged weights (all targets, GQA, q/k/v bias)', { skip }, async () => {
  const { model, batch, targets, responseMask } = setup(TINY, ALL, [6, 4, 5], 31);
  await model.backwardCrossEntropy(batch, targets, responseMask, { lossScale: 0.7 });
  const grads = model.gradients();
  // gradients exist for the adapters and nothing else: 2 layers x 7 targets x (A, B)
  assert.deepEqual([...grads.keys()].sort(), [...model.adapter().keys()].sort());
  assert.equal(grads.size, 2 * 7 * 2);
  const { base, adapters } = split(toReferenceParams(model.parameters()));
  checkGradients(grads, adapters, (a) => referenceCrossEntropy(TINY, merged(TINY, base, a, ALL), batch, targets, responseMask, 0.7));
  model.dispose();
});

test('LoRA: gradients match with some targets, rank 3, Qwen3 q/k norms, tied embeddings and the ppo loss', { skip }, async () => {
  const cfg: ModelConfig = { ...TINY, model_type: 'qwen3', attention_bias: false, head_dim: 8, tie_word_embeddings: true };
  const lora: LoraOptions = { rank: 3, alpha: 1.5, targets: ['v_proj', 'q_proj', 'down_proj'] };
  const d = setup(cfg, lora, [7, 5], 41);
  assert.deepEqual(d.model.lora!.targets, ['q_proj', 'v_proj', 'down_proj']); // kept in module order
  const { logprobs } = await d.model.forward(d.batch, d.targets);
  const r = rng(3);
  const T = logprobs.length;
  const behav = Float32Array.from(logprobs, (x) => x + (r() - 0.5));
  const adv = Float32Array.from({ length: T }, () => (r() - 0.5) * 4);
  const inputs = { targets: d.targets, responseMask: d.responseMask, advantages: adv, behaviourLogprobs: behav };
  const options: PolicyLossOptions = { clipLow: 0.2, clipHigh: 0.28, iwCap: 2, aggregation: 'token-mean' };
  const metrics = await d.model.backwardPolicyLoss(d.batch, inputs, options);
  const { base, adapters } = split(toReferenceParams(d.model.parameters()));
  const refLoss = referencePolicyLoss(cfg, merged(cfg, base, adapters, lora), d.batch, inputs, options);
  assert.ok(Math.abs(metrics.loss - refLoss) < 1e-5 * Math.max(1, Math.abs(refLoss)), `loss ${metrics.loss} vs reference ${refLoss}`);
  checkGradients(d.model.gradients(), adapters, (a) => referencePolicyLoss(cfg, merged(cfg, base, a, lora), d.batch, inputs, options));
  d.model.dispose();
});

test('LoRA: at init (B = 0) the model computes the base model; a step moves the adapters and leaves the base bit for bit', { skip }, async () => {
  const base = Model.init(TINY, { seed: 5, threads: 2, initStd: 0.3 });
  const dir = mkdtempSync(join(tmpdir(), 'lora-'));
  try {
    await base.save(join(dir, 'base.safetensors'));
    const m = Model.load(join(dir, 'base.safetensors'), TINY, { threads: 2, lora: { ...ALL, seed: 9 } });
    const { batch, targets, responseMask } = pack(randomSeqs(rng(1), [9, 6], TINY.vocab_size));
    const want = await base.forward(batch, targets);
    const got = await m.forward(batch, targets);
    assert.ok(maxAbsDiff(want.logprobs, got.logprobs) < 1e-6, `logprobs differ by ${maxAbsDiff(want.logprobs, got.logprobs)}`);
    // A is uniform in ±1/sqrt(in), B zero
    for (const [n, v] of m.adapter()) {
      if (n.includes('lora_B')) assert.ok(v.data.every((x) => x === 0), `${n} is not zero`);
      else {
        const bound = 1 / Math.sqrt(v.shape[1]!);
        assert.ok(v.data.every((x) => Math.abs(x) <= bound) && v.data.some((x) => x !== 0), `${n} not in ±${bound}`);
      }
    }
    const before = new Map([...m.baseParameters()].map(([n, v]) => [n, Float32Array.from(v.data)]));
    for (let i = 0; i < 3; i++) {
      m.zeroGrad();
      await m.backwardCrossEntropy(batch, targets, responseMask);
      assert.ok(m.gradNorm() > 0);
      await m.adamwStep({ lr: 0.05, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.1 });
    }
    for (const [n, v] of m.baseParameters()) assert.deepEqual(v.data, before.get(n), `${n} changed`);
    assert.ok([...m.adapter()].some(([n, v]) => n.includes('lora_B') && v.data.some((x) => x !== 0)), 'B did not move');
    const after = await m.forward(batch, targets);
    assert.ok(maxAbsDiff(want.logprobs, after.logprobs) > 1e-4, 'training the adapters changed nothing');

    // the adapter file folded into a model without adapters computes what the LoRA model computes
    await m.saveAdapter(join(dir, 'adapter.safetensors'));
    const plain = Model.load(join(dir, 'base.safetensors'), TINY, { threads: 2, trainable: false });
    await plain.mergeAdapter(join(dir, 'adapter.safetensors'));
    const folded = await plain.forward(batch, targets);
    assert.ok(maxAbsDiff(folded.logprobs, after.logprobs) < 1e-5, `merged differs by ${maxAbsDiff(folded.logprobs, after.logprobs)}`);
    // and taken out again, the base weights come back (to fp32 rounding)
    await plain.mergeAdapter(join(dir, 'adapter.safetensors'), -1);
    const back = await plain.forward(batch, targets);
    assert.ok(maxAbsDiff(back.logprobs, want.logprobs) < 1e-5, `unmerged differs by ${maxAbsDiff(back.logprobs, want.logprobs)}`);

    // a checkpoint holds the adapters and their optimizer state; resumed on the same base it continues identically
    await m.saveCheckpoint(join(dir, 'ckpt'));
    const resumed = await Model.loadCheckpoint(join(dir, 'ckpt'), { threads: 2, base: join(dir, 'base.safetensors') });
    assert.equal(resumed.step, 3);
    assert.deepEqual({ ...resumed.lora, seed: 9 }, m.lora);
    for (const model of [m, resumed]) {
      model.zeroGrad();
      await model.backwardCrossEntropy(batch, targets, responseMask);
      await model.adamwStep({ lr: 0.05, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.1 });
    }
    for (const [n, v] of m.adapter()) assert.deepEqual(resumed.adapter().get(n)!.data, v.data, `${n} differs after resume`);
    await assert.rejects(Model.loadCheckpoint(join(dir, 'ckpt'), { threads: 2 }), /needs options\.base/);
    // a file of other adapters is refused, naming both shapes
    const other = Model.init(TINY, { seed: 1, threads: 2, lora: { rank: 4, alpha: 3, targets: ['q_proj'] } });
    await assert.rejects(other.loadAdapter(join(dir, 'adapter.safetensors')), /tensor model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight has shape \[2, 8\]/);
    await assert.rejects(m.mergeAdapter(join(dir, 'adapter.safetensors')), /trains its own adapters/);
    await assert.rejects(plain.mergeAdapter(join(dir, 'base.safetensors')), /not an adapter file/);
    // a file with one pair's lora_B missing is refused before any pair is folded in: the weights stay as they were
    const partial = [...m.adapter()].filter(([n]) => n !== 'model.layers.1.mlp.down_proj.lora_B.weight');
    assert.equal(partial.length, m.adapter().size - 1);
    await writeSafetensors(join(dir, 'partial.safetensors'), partial, loraMetadata(m.lora!));
    await assert.rejects(plain.mergeAdapter(join(dir, 'partial.safetensors')), /layer 1 down_proj has lora_B missing/);
    const untouched = await plain.forward(batch, targets);
    assert.deepEqual(untouched.logprobs, back.logprobs, 'the refused file changed the weights');
    for (const x of [base, m, plain, resumed, other]) x.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Kernels::dropout's multipliers rebuilt from its definition: 1/(1-p) (float32) where splitmix64(seed + (i+1)·φ)'s top 24 bits ≥ ⌈p·2^24⌉, else 0. */
function dropMask(seed: bigint, n: number, p: number): Float64Array {
  const M = (1n << 64n) - 1n;
  const pf = Math.fround(p);
  const cut = Math.ceil(pf * 16777216);
  const keep = Math.fround(1 / Math.fround(1 - pf));
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let z = (seed + BigInt(i + 1) * 0x9e3779b97f4a7c15n) & M;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M;
    z ^= z >> 31n;
    out[i] = Number(z >> 40n) >= cut ? keep : 0;
  }
  return out;
}
/** The mask of layer l's adapter on `target` in the native core's training call number `call` (0 first). */
const masks = (seed: number, call: number, p: number) => (l: number, target: string, n: number) =>
  dropMask((BigInt(seed) * 0x100000001b3n + BigInt(call) * 1000003n + BigInt(l) * 131n + BigInt(LORA_TARGETS.indexOf(target as never))) & ((1n << 64n) - 1n), n, p);

test("LoRA: the reference's adapters agree with the merged weights (the two oracles of these tests)", { skip }, async () => {
  const { model, batch, targets, responseMask } = setup(TINY, ALL, [5, 4], 51);
  const { base, adapters } = split(toReferenceParams(model.parameters()));
  const a = referenceCrossEntropy(TINY, merged(TINY, base, adapters, ALL), batch, targets, responseMask);
  const b = referenceCrossEntropy(TINY, new Map([...base, ...adapters]), batch, targets, responseMask, 1, { scale: ALL.alpha / ALL.rank });
  assert.ok(Math.abs(a - b) < 1e-12, `${a} vs ${b}`);
  model.dispose();
});

test('LoRA dropout: gradients match the reference with the same masks; each training call draws new ones; log-prob passes have none', { skip }, async () => {
  const lora: LoraOptions = { ...ALL, dropout: 0.3, seed: 5 };
  const { model, batch, targets, responseMask } = setup(TINY, lora, [6, 4, 5], 61);
  const { base, adapters } = split(toReferenceParams(model.parameters()));
  const all = () => new Map([...base, ...adapters]);
  const scale = lora.alpha / lora.rank;
  // the masks are not trivial: about 30% of each adapter input is dropped
  const m0 = masks(5, 0, 0.3)(0, 'q_proj', 15 * 8);
  const dropped = m0.filter((x) => x === 0).length / m0.length;
  assert.ok(dropped > 0.15 && dropped < 0.45, `dropped fraction ${dropped}`);
  for (const call of [0, 1]) {
    model.zeroGrad();
    const { loss } = await model.backwardCrossEntropy(batch, targets, responseMask);
    const ref = { scale, dropMask: masks(5, call, 0.3) };
    const want = referenceCrossEntropy(TINY, all(), batch, targets, responseMask, 1, ref);
    assert.ok(Math.abs(loss - want) < 1e-5 * Math.abs(want), `call ${call}: loss ${loss} vs reference ${want}`);
    const without = referenceCrossEntropy(TINY, all(), batch, targets, responseMask, 1, { scale });
    assert.ok(Math.abs(loss - without) > 1e-4, `call ${call}: dropout changed nothing`);
    checkGradients(model.gradients(), adapters, (a) => referenceCrossEntropy(TINY, new Map([...base, ...a]), batch, targets, responseMask, 1, ref));
  }
  const { logprobs } = await model.forward(batch, targets);
  const plain = referenceForward(TINY, all(), batch, targets, { scale }).logprobs;
  assert.ok(maxAbsDiff(logprobs, plain) < 1e-5, 'forward() runs the adapters without dropout');
  model.dispose();
});

test('LoRA: bad options fail naming the field', { skip }, () => {
  const bad: [unknown, RegExp][] = [
    [{ rank: 0, alpha: 1, targets: ['q_proj'] }, /lora\.rank must be an integer in \[1, 4096\], got 0/],
    [{ rank: 2.5, alpha: 1, targets: ['q_proj'] }, /lora\.rank/],
    [{ rank: 2, alpha: 0, targets: ['q_proj'] }, /lora\.alpha must be a positive number/],
    [{ rank: 2, alpha: 1, targets: [] }, /lora\.targets must be a non-empty array/],
    [{ rank: 2, alpha: 1, targets: ['q_proj', 'qkv_proj'] }, /lora\.targets\[1\] must be one of q_proj, .*got "qkv_proj"/],
    [{ rank: 2, alpha: 1, targets: ['q_proj'], seed: 0.5 }, /lora\.seed must be an integer/],
    [{ rank: 2, alpha: 1, targets: ['q_proj'], dropout: 1 }, /lora\.dropout must be a number in \[0, 1\), got 1/],
  ];
  for (const [lora, re] of bad) assert.throws(() => Model.init(TINY, { seed: 1, lora: lora as LoraOptions }), re);
  assert.throws(() => Model.init(TINY, { seed: 1, trainable: false, lora: ALL }), /trainable false/);
});
