// How many KV-cache slots the built-in policy takes on a GPU (producers/policy/kv-sizing.ts), from the memory
// figures cudaMemGetInfo gives; and the byte counts the native core reports for a model's KV cache and a step's
// activations, which that sizing plans with. The GPU side (the backend sizing its cache on a real card) is in
// test/gpu/generate.test.ts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RlstreamError } from '../../core/errors.ts';
import { kvCacheSlots, type KvSizingInput } from '../../producers/policy/kv-sizing.ts';
import { Model, nativeAvailable } from '../../native/index.ts';
import { TINY } from '../native/helpers.ts';

const GiB = 1024 ** 3;
// An 80 GiB card with 79 free, a policy whose weights take 2 GiB, steps of 4 GiB, slots of 0.05 GiB.
const base: KvSizingInput = { totalBytes: 80 * GiB, freeBeforeBytes: 79 * GiB, freeAfterBytes: 77 * GiB, utilization: 0.5, trainerCopy: false, stepBytes: 4 * GiB, slotBytes: 0.05 * GiB, maxBatch: 128, maxLen: 1024 };

test('the KV cache takes max_batch slots when the share holds them', () => {
  const s = kvCacheSlots(base);
  assert.equal(s.slots, 128);
  assert.equal(s.weightsBytes, 2 * GiB);
  assert.equal(s.budgetBytes, 40 * GiB - 2 * GiB - 4 * GiB);
});

test('a smaller share, or less free memory than the share, gives fewer slots', () => {
  // 0.1 x 80 = 8 GiB: 8 - 2 - 4 = 2 GiB = 40 slots.
  assert.equal(kvCacheSlots({ ...base, utilization: 0.1 }).slots, 40);
  // A trainer already holds most of the card: 7 GiB free after the weights, less the step: 3 GiB = 60 slots.
  assert.equal(kvCacheSlots({ ...base, freeBeforeBytes: 9 * GiB, freeAfterBytes: 7 * GiB }).slots, 60);
  // Longer sequences: twice the bytes a slot, half the slots.
  assert.equal(kvCacheSlots({ ...base, utilization: 0.1, slotBytes: 0.1 * GiB, maxLen: 2048 }).slots, 20);
});

test('a trainer that stages its weights for the policy in the same process takes a copy of them out of the share', () => {
  // 40 - 2 (weights) - 2 (the staged copy) - 4 = 32 GiB: still the 128 slots asked for.
  const s = kvCacheSlots({ ...base, trainerCopy: true });
  assert.equal(s.stagingBytes, 2 * GiB);
  assert.equal(s.budgetBytes, 40 * GiB - 2 * GiB - 2 * GiB - 4 * GiB);
  assert.equal(kvCacheSlots(base).stagingBytes, 0);
  // 0.1 x 80 = 8 GiB: 8 - 2 - 2 - 4 = 0 GiB where 40 slots fitted without the copy; 0.125 x 80 = 10: 2 GiB = 40 slots.
  assert.throws(() => kvCacheSlots({ ...base, utilization: 0.1, trainerCopy: true }), /the copy of the trainer's weights it stages \(2\.00 GiB\)/);
  assert.equal(kvCacheSlots({ ...base, utilization: 0.125, trainerCopy: true }).slots, 40);
  // Where free memory is what limits: 7 GiB free after the weights, less the copy and the step: 1 GiB = 20 slots.
  assert.equal(kvCacheSlots({ ...base, freeBeforeBytes: 9 * GiB, freeAfterBytes: 7 * GiB, trainerCopy: true }).slots, 20);
});

test('a share that holds no slot fails at start-up naming the field and the fix', () => {
  assert.throws(
    () => kvCacheSlots({ ...base, utilization: 0.07 }),
    (e: unknown) => e instanceof RlstreamError && e.code === 'CONFIG_INVALID' && /backend\.gpu_memory_utilization 0\.07/.test(e.message) && /backend\.max_len 1024/.test(e.message) && /Raise backend\.gpu_memory_utilization, lower backend\.max_len/.test(e.message),
  );
});

test('the native core reports the bytes of a KV cache and of a step, and reserves what it reports', { skip: nativeAvailable() ? false : 'native addon not built (npm run build:native)' }, () => {
  const m = Model.init(TINY, { seed: 1 });
  try {
    const kvDim = TINY.num_key_value_heads * (TINY.hidden_size / TINY.num_attention_heads);
    assert.equal(m.kvBytes(3, 16), 2 * TINY.num_hidden_layers * 3 * 16 * kvDim * 4);
    assert.equal(m.kvBytes(6, 16), 2 * m.kvBytes(3, 16));
    const a = m.activationBytes(64);
    const b = m.activationBytes(128);
    // At least a residual stream per layer and the step's logits; more tokens, more bytes.
    assert.ok(a >= (TINY.num_hidden_layers + 1) * 64 * TINY.hidden_size * 4 + 64 * TINY.vocab_size * 4, String(a));
    assert.ok(b > a && b <= 2 * a + 64, `${a} then ${b}`);
    assert.throws(() => m.activationBytes(0), /tokens must be >= 1/);
  } finally {
    m.dispose();
  }
});
