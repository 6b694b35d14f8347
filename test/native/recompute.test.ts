// Activation recomputation per layer (options.recompute 'layer') on the CPU: the same loss and gradients bit for bit
// as keeping every layer's activations (the CPU is deterministic, and the recomputed forward is the same
// arithmetic), with and without adapters, and fewer activation bytes for the same tokens.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LORA_TARGETS, Model, nativeAvailable, type LoraOptions, type ModelConfig } from '../../native/index.ts';
import { TINY, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';
const CFG: ModelConfig = { ...TINY, num_hidden_layers: 4 };

async function step(recompute: 'none' | 'layer', lora?: LoraOptions) {
  const m = Model.init(CFG, { seed: 3, threads: 2, initStd: 0.3, logitChunkTokens: 5, recompute, ...(lora ? { lora } : {}) });
  const r = rng(11);
  for (const [n, v] of m.adapter()) if (n.includes('lora_B')) for (let i = 0; i < v.data.length; i++) v.data[i] = r() - 0.5;
  const { batch, targets, responseMask } = pack(randomSeqs(rng(4), [13, 7, 9], CFG.vocab_size));
  const { loss } = await m.backwardCrossEntropy(batch, targets, responseMask);
  const grads = new Map([...m.gradients()].map(([n, v]) => [n, Float32Array.from(v.data)]));
  const bytes = m.activationBytes(29);
  await m.adamwStep({ lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0 });
  const after = await m.forward(batch, targets);
  m.dispose();
  return { loss, grads, bytes, logprobs: after.logprobs };
}

for (const [label, lora] of [['full-parameter', undefined], ['LoRA', { rank: 2, alpha: 4, targets: [...LORA_TARGETS] }]] as const) {
  test(`recompute 'layer' gives the gradients of 'none' bit for bit (${label}) with fewer activation bytes`, { skip }, async () => {
    const keep = await step('none', lora);
    const again = await step('layer', lora);
    assert.equal(again.loss, keep.loss);
    assert.equal(again.grads.size, keep.grads.size);
    for (const [n, g] of keep.grads) assert.deepEqual(again.grads.get(n), g, `${n} differs`);
    assert.deepEqual(again.logprobs, keep.logprobs);
    assert.ok(again.bytes < keep.bytes * 0.75, `activation bytes ${again.bytes} with recomputation vs ${keep.bytes} without`);
  });
}

test('recompute: a bad value fails naming the option', { skip }, () => {
  assert.throws(() => Model.init(CFG, { seed: 1, recompute: 'full' as 'layer' }), /options\.recompute must be 'none' or 'layer', got "full"/);
});
