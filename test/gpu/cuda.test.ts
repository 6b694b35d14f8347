// The CUDA device of the native core through the Node API: device selection, the same files on both devices, and a
// training step on the GPU against the same step on the CPU. Skips with a message where the addon has no CUDA layer
// or no GPU is present (every CI machine); the kernel-level and PyTorch checks live in test/gpu/run.sh.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { isRlstreamError } from '../../core/errors.ts';
import { Model, cudaAvailable, nativeAvailable, type ModelConfig } from '../../native/index.ts';
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

test('one training step on cuda matches the same step on cpu (bf16 tolerances)', { skip: skipCuda }, async () => {
  const { batch, targets, mask } = pack(randomSeqs(rng(3), [70, 1, 129, 40], CFG.vocab_size));
  const cpu = Model.init(CFG, { seed: 4, threads: 2, initStd: 0.05 });
  const gpu = Model.init(CFG, { seed: 4, initStd: 0.05, device: 'cuda' });
  assert.equal(gpu.device, 'cuda');
  for (const [n, t] of cpu.parameters()) assert.deepEqual(gpu.parameters().get(n)!.data, t.data, `${n}: same initial weights`);
  const a = await cpu.forward(batch, targets);
  const b = await gpu.forward(batch, targets);
  // bf16 operands in every product: ~1e-3 relative on log-probs (test/gpu/run.sh measures each kernel)
  assert.ok(relErr(b.logprobs, a.logprobs) < 1e-2, `log-probs rel err ${relErr(b.logprobs, a.logprobs)}`);
  const la = await cpu.backwardCrossEntropy(batch, targets, mask);
  const lb = await gpu.backwardCrossEntropy(batch, targets, mask);
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
    const { batch, targets, mask } = pack(randomSeqs(rng(5), [50, 30], CFG.vocab_size));
    const gpu = Model.init(CFG, { seed: 8, device: 'cuda' });
    await gpu.backwardCrossEntropy(batch, targets, mask);
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
