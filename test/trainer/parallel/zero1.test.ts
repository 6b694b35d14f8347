// ZeRO-1 as the data-parallel rank runs it: the native model's own AdamW given a shard (Model.setOptimizerShard),
// the slices all-gathered over the model's parameter block (the tail broadcast by the last rank). Against one
// unsharded AdamW over the same gradients: bit for bit, every rank, every step, for rank counts that divide the
// trained floats and ones that leave a tail, with and without LoRA (whose trained floats start inside the block);
// each rank's moments cover its slice alone, and the slices cover every trained float once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rng } from '../../../core/random.ts';
import { Model, nativeAvailable, type InitOptions } from '../../../native/index.ts';
import { compileTrainerOptions } from '../../../consumers/trainer/options.ts';
import { referenceGroup } from '../../../native/collectives/reference-collective.ts';
import { DataParallelRank, zero1Slices } from '../../../consumers/trainer/parallel/rank-step.ts';
import { TINY_CONFIG } from '../fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';
const ADAM = { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01 };

async function zero1AgainstOne(n: number, init: InitOptions, seed: number): Promise<void> {
  const options = compileTrainerOptions({});
  const group = referenceGroup(n);
  const models = Array.from({ length: n }, () => Model.init(TINY_CONFIG, init));
  const ref = Model.init(TINY_CONFIG, init);
  try {
    const ranks = models.map((m, k) => new DataParallelRank(m, group[k]!, options, { bucketBytes: 4 * 7, dtype: 'fp32' }));
    const { offset, numel } = ref.trainRange();
    assert.deepEqual(ranks[0]!.trained, { offset, numel });
    if (init.lora) assert.ok(offset > 0, 'the adapters sit after the base weights');
    // the slices: each rank's moments cover its own, and together every trained float once
    let covered = 0;
    for (const [k, m] of models.entries()) {
      const s = m.optimizerShard();
      assert.deepEqual({ begin: s.begin, count: s.count }, ranks[k]!.shard);
      assert.equal(s.begin, covered, `rank ${k}'s slice starts where rank ${k - 1}'s ends`);
      covered += s.count;
      assert.ok(s.count <= Math.floor(numel / n) + (n - 1), `rank ${k} holds ${s.count} of ${numel} floats' moments over ${n} ranks`);
      if (n > 1) assert.throws(() => m.optimizerState(), /shard/, 'the moments of a sharded optimizer have no whole view');
    }
    assert.equal(covered, numel);
    const r = rng(seed);
    for (let step = 1; step <= 5; step++) {
      const g = Float32Array.from({ length: numel }, () => (r() * 2 - 1) * (r() < 0.1 ? 1e-6 : 0.1));
      ref.blockView('grads').set(g);
      await ref.adamwStep(ADAM);
      for (const m of models) m.blockView('grads').set(g);
      await Promise.all(models.map((m) => m.adamwStep(ADAM)));
      await Promise.all(ranks.map((rk) => rk.gatherParameters()));
      const want = ref.blockView('params');
      for (const [k, m] of models.entries()) assert.deepEqual(m.blockView('params'), want, `rank ${k} of ${n}, step ${step}`);
    }
  } finally {
    for (const m of [...models, ref]) m.dispose();
  }
}

test('ZeRO-1 over N ranks (the model\'s sharded AdamW, slices all-gathered) is one unsharded AdamW bit for bit, tails and LoRA included', { skip }, async () => {
  const numel = Model.init(TINY_CONFIG, { seed: 1, threads: 1 }).numParameters;
  for (const n of [1, 2, 3, 4, 7]) {
    const { tail } = zero1Slices(numel, n);
    await zero1AgainstOne(n, { seed: 3, threads: 1 }, 100 + n);
    console.log(`# ${n} rank(s): ${numel} floats, slices of ${Math.floor(numel / n)}, tail ${tail}: bit for bit over 5 steps`);
  }
  for (const n of [2, 3]) await zero1AgainstOne(n, { seed: 3, threads: 1, lora: { rank: 2, alpha: 4, targets: ['q_proj', 'down_proj'] } }, 200 + n);
});

test('the slices: generated sizes and rank counts cover every float once, the last rank taking the remainder', () => {
  const r = rng(7);
  for (let i = 0; i < 2000; i++) {
    const numel = Math.floor(r() * 5000);
    const size = 1 + Math.floor(r() * 16);
    const { chunk, tail, slice } = zero1Slices(numel, size);
    assert.equal(chunk * size + tail, numel);
    assert.ok(tail < size);
    let at = 0;
    for (let k = 0; k < size; k++) {
      const s = slice(k);
      assert.equal(s.begin, at);
      assert.equal(s.count, chunk + (k === size - 1 ? tail : 0));
      at += s.count;
    }
    assert.equal(at, numel);
  }
});

test('the block collectives refuse a range outside the block, naming it; one rank leaves the block as it was', { skip }, async () => {
  const m = Model.init(TINY_CONFIG, { seed: 3, threads: 1 });
  try {
    const [c] = referenceGroup(1);
    const n = m.trainRange().numel;
    await assert.rejects(c!.allReduceBlock(m, 'grads', n - 2, 3), new RegExp(`\\[${n - 2}, ${n + 1}\\) is not inside the model's grads block of ${n} floats`));
    await assert.rejects(c!.broadcastBlock(m, 'params', -1, 2, 0), /is not inside the model's params block/);
    // one rank: an all-reduce and a broadcast leave the block as it was
    const before = m.blockView('params').slice();
    await c!.allReduceBlock(m, 'params', 0, before.length);
    await c!.broadcastBlock(m, 'params', 3, 10, 0);
    assert.deepEqual(m.blockView('params'), before);
  } finally {
    m.dispose();
  }
});
