// The CUDA device of the native core through the Node API: device selection, the same files on both devices, and a
// training step on the GPU against the same step on the CPU. Skips with a message where the addon has no CUDA layer
// or no GPU is present (every CI machine); the kernel-level and PyTorch checks live in test/gpu/run.sh.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { Model, cudaAvailable, nativeAvailable, type ModelConfig, type PolicyLossInputs, type PolicyLossOptions } from '../../native/index.ts';
import { TINY, pack, randomSeqs, rng } from '../native/helpers.ts';

const built = nativeAvailable();
const skipNative = built ? false : 'native addon not built (npm run build:native)';
const skipCuda = !built ? 'native addon not built (npm run build:native)' : cudaAvailable() ? false : 'no CUDA: addon built without RLSTREAM_CUDA=1 or no GPU present';
// head dim 64 takes the tensor-core attention path
const CFG: ModelConfig = { ...TINY, hidden_size: 128, num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 256, vocab_size: 300, max_position_embeddings: 512 };

function relErr(a: Float32Array, b: Float32Array): number {
  let d = 0;
  let n = 0;
  for (let i = 0; i < a.length; i++) {
    d += (a[i]! - b[i]!) ** 2;
    n += b[i]! ** 2;
  }
  return Math.sqrt(d / Math.max(n, 1e-30));
}

test('an unknown device is rejected with the option named', { skip: skipNative }, () => {
  assert.throws(
    () => Model.init(TINY, { seed: 1, device: 'tpu' as 'cpu' }),
    (e: unknown) => isRlstreamError(e) && e.code === 'NATIVE_INVALID_ARGUMENT' && /options\.device must be 'cpu' or 'cuda'/.test(e.message),
  );
});

test("device 'cuda' without CUDA fails with a precise error, never an abort", { skip: built && !cudaAvailable() ? false : 'CUDA is available here (or the addon is not built)' }, () => {
  assert.throws(
    () => Model.init(TINY, { seed: 1, device: 'cuda' }),
    (e: unknown) => isRlstreamError(e) && e.code === 'NATIVE_INVALID_ARGUMENT' && /(RLSTREAM_CUDA=1|no CUDA GPU)/.test(e.message),
  );
});

// The second shape's intermediate size is not a multiple of 4: the fused SwiGLU kernels take their one-column path.
for (const [what, cfg] of [['', CFG], [', intermediate size 250', { ...CFG, intermediate_size: 250 }]] as const)
test(`one training step on cuda matches the same step on cpu (bf16 tolerances${what})`, { skip: skipCuda }, async () => {
  const { batch, targets, responseMask } = pack(randomSeqs(rng(3), [70, 1, 129, 40], cfg.vocab_size));
  const cpu = Model.init(cfg, { seed: 4, threads: 2, initStd: 0.05 });
  const gpu = Model.init(cfg, { seed: 4, initStd: 0.05, device: 'cuda' });
  assert.equal(gpu.device, 'cuda');
  for (const [n, t] of cpu.parameters()) assert.deepEqual(gpu.parameters().get(n)!.data, t.data, `${n}: same initial weights`);
  const a = await cpu.forward(batch, targets);
  const b = await gpu.forward(batch, targets);
  // bf16 operands in every product: ~1e-3 relative on log-probs (test/gpu/run.sh measures each kernel)
  assert.ok(relErr(b.logprobs, a.logprobs) < 1e-2, `log-probs rel err ${relErr(b.logprobs, a.logprobs)}`);
  const la = await cpu.backwardCrossEntropy(batch, targets, responseMask);
  const lb = await gpu.backwardCrossEntropy(batch, targets, responseMask);
  assert.ok(Math.abs(la.loss - lb.loss) < 1e-2 * la.loss, `loss ${lb.loss} vs ${la.loss}`);
  for (const [n, g] of cpu.gradients()) assert.ok(relErr(gpu.gradients().get(n)!.data, g.data) < 5e-2, `${n}: gradient rel err ${relErr(gpu.gradients().get(n)!.data, g.data)}`);
  assert.ok(Math.abs(gpu.clipGradNorm(1) - cpu.clipGradNorm(1)) < 5e-2 * cpu.gradNorm());
  await gpu.adamwStep({ lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1 });
  assert.equal(gpu.step, 1);
  cpu.dispose();
  gpu.dispose();
});

test('checkpoints are the same files on both devices: saved on cuda, loaded on cpu and back', { skip: skipCuda }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rls-cuda-'));
  try {
    const { batch, targets, responseMask } = pack(randomSeqs(rng(5), [50, 30], CFG.vocab_size));
    const gpu = Model.init(CFG, { seed: 8, device: 'cuda' });
    await gpu.backwardCrossEntropy(batch, targets, responseMask);
    await gpu.adamwStep({ lr: 1e-2, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0 });
    await gpu.saveCheckpoint(dir);
    const cpu = await Model.loadCheckpoint(dir, { threads: 2 });
    const back = await Model.loadCheckpoint(dir, { device: 'cuda' });
    for (const [n, t] of gpu.parameters()) {
      assert.deepEqual(cpu.parameters().get(n)!.data, t.data, n);
      assert.deepEqual(back.parameters().get(n)!.data, t.data, n);
    }
    for (const [n, t] of gpu.optimizerState().expAvgSq) assert.deepEqual(back.optimizerState().expAvgSq.get(n)!.data, t.data, n);
    assert.equal(back.step, 1);
    const x = await gpu.forward(batch, targets);
    const y = await back.forward(batch, targets);
    assert.deepEqual(y.logprobs, x.logprobs);
    for (const m of [gpu, cpu, back]) m.dispose();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// Each registered policy loss with rollout correction, dual clip, KL and entropy bonus: the same loss, metrics and
// gradients on the GPU as on the CPU. Inputs derive from the CPU log-probs, with ratios far enough from the clip
// bounds that the clipped set is the same on both devices.
test('every policy loss gives the same loss, metrics and gradients on cuda as on cpu', { skip: skipCuda }, async () => {
  const { batch, targets, responseMask } = pack(randomSeqs(rng(11), [33, 65, 7, 90], CFG.vocab_size));
  const cpu = Model.init(CFG, { seed: 12, threads: 2, initStd: 0.05 });
  const gpu = Model.init(CFG, { seed: 12, initStd: 0.05, device: 'cuda' });
  const { logprobs } = await cpu.forward(batch, targets);
  const r = rng(13);
  // log-ratios logp - prox of ±0.1 (inside every clip range) or ±0.6 (outside): bf16's error (~1e-2) moves none across
  const prox = logprobs.map((x) => x - [-0.6, -0.1, 0.1, 0.6, 0.6][Math.floor(r() * 5)]!);
  const behav = prox.map((x) => x + (r() - 0.5) * 1.2);
  const ref = logprobs.map((x) => x + (r() - 0.5) * 0.2);
  const adv = logprobs.map(() => r() - 0.5);
  for (let t = 0; t < logprobs.length; t++) if (!responseMask[t]) prox[t] = behav[t] = ref[t] = adv[t] = 0;
  const inputs: PolicyLossInputs = { targets, responseMask, advantages: adv, behaviourLogprobs: behav, proximalLogprobs: prox, refLogprobs: ref };
  const cases: PolicyLossOptions[] = [
    { loss: 'ppo', clipLow: 0.2, clipHigh: 0.28, dualClipC: 3, correction: { mode: 'truncate', level: 'token', cap: 1.5 }, klCoef: 0.1, entropyCoef: 0.01 },
    { loss: 'gspo', clipLow: 3e-4, clipHigh: 4e-4, correction: { mode: 'mask', level: 'sequence', low: 0.01, high: 100 }, aggregation: 'seq-mean-token-mean', klCoef: 0.05, klType: 'k1' },
    { loss: 'cispo', clipLow: 1, clipHigh: 0.28, iwCap: 2, aggregation: 'seq-mean-token-sum', entropyCoef: 0.01, lossScale: 0.5 },
  ];
  for (const options of cases) {
    cpu.zeroGrad();
    gpu.zeroGrad();
    const a = await cpu.backwardPolicyLoss(batch, inputs, options);
    const b = await gpu.backwardPolicyLoss(batch, inputs, options);
    const near = (x: number, y: number, what: string) => assert.ok(Math.abs(x - y) <= 2e-2 * Math.abs(y) + 5e-3, `${options.loss} ${what}: cuda ${x} vs cpu ${y}`);
    for (const k of ['loss', 'pgLoss', 'entropy', 'kl', 'approxKl', 'iwMean', 'iwMax', 'clipFraction', 'dualClipFraction', 'iwTruncatedFraction', 'iwMaskedFraction'] as const) near(b[k], a[k], k);
    assert.ok(a.loss !== 0 && a.clipFraction > 0, `${options.loss}: the fixture exercises the loss and its clip`);
    for (const [n, g] of cpu.gradients()) assert.ok(relErr(gpu.gradients().get(n)!.data, g.data) < 5e-2, `${options.loss} ${n}: gradient rel err ${relErr(gpu.gradients().get(n)!.data, g.data)}`);
  }
  cpu.dispose();
  gpu.dispose();
});

test('on cuda a packed sequence sees only itself, and two micro-batches at lossScale 1/2 equal one batch', { skip: skipCuda }, async () => {
  const gpu = Model.init(CFG, { seed: 21, initStd: 0.05, device: 'cuda' });
  const seqs = randomSeqs(rng(22), [80, 80, 45, 115], CFG.vocab_size); // two halves of 158 targets each
  seqs[1] = seqs[0]!.slice();
  const all = pack(seqs);
  const whole = await gpu.forward(all.batch, all.targets);
  // Sequence 1 repeats sequence 0: the same log-probs (attention never crosses a sequence) ...
  const first = whole.logprobs.subarray(0, 80);
  assert.ok(relErr(whole.logprobs.subarray(80, 160), first) < 1e-4, `repeat differs: ${relErr(whole.logprobs.subarray(80, 160), first)}`);
  // ... and the same as sequence 0 alone, while one long sequence (the copy attending to the original) differs.
  const alone = pack([seqs[0]!]);
  assert.ok(relErr((await gpu.forward(alone.batch, alone.targets)).logprobs, first) < 1e-3);
  const joined = pack([[...seqs[0]!, ...seqs[1]!]]);
  assert.ok(relErr((await gpu.forward(joined.batch, joined.targets)).logprobs.subarray(80, 159), whole.logprobs.subarray(80, 159)) > 1e-2, 'the check could not see a crossing');

  const twice = Model.init(CFG, { seed: 21, initStd: 0.05, device: 'cuda' });
  const a = pack(seqs.slice(0, 2));
  const b = pack(seqs.slice(2));
  await twice.backwardCrossEntropy(a.batch, a.targets, a.responseMask, { lossScale: 0.5 });
  await twice.backwardCrossEntropy(b.batch, b.targets, b.responseMask, { lossScale: 0.5 });
  const once = await gpu.backwardCrossEntropy(all.batch, all.targets, all.responseMask);
  assert.ok(once.loss > 0);
  for (const [n, g] of twice.gradients()) assert.ok(relErr(g.data, gpu.gradients().get(n)!.data) < 2e-2, `${n}: accumulated vs one batch ${relErr(g.data, gpu.gradients().get(n)!.data)}`);
  gpu.dispose();
  twice.dispose();
});
