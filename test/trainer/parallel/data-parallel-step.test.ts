// A data-parallel step of the native model (CPU) over N reference ranks against one process training the
// concatenated batch: the same micro-batches' policy-loss gradients, summed over ranks in buckets (fp32, odd bucket
// sizes) then clipped, and the ZeRO-1 AdamW update, for N in 1..4, with mini-batches and PPO epochs. With one
// rank the step is bit for bit the single-process one; with more, the gradient sums run in another order, and the
// results agree within the tolerances stated below (measured, with their margins, in the test's output).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Model, nativeAvailable, type InitOptions } from '../../../native/index.ts';
import { packMicroBatches } from '../../../consumers/trainer/batch.ts';
import { compileTrainerOptions } from '../../../consumers/trainer/options.ts';
import { trainOnBatch } from '../../../consumers/trainer/step.ts';
import { referenceGroup } from '../../../native/collectives/reference-collective.ts';
import { DataParallelRank } from '../../../consumers/trainer/parallel/rank-step.ts';
import { shardStep } from '../../../consumers/trainer/parallel/shard.ts';
import { flat, randomGroups, singleProcess } from './dp-fixtures.ts';
import { TINY_CONFIG } from '../fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';

function maxDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

async function compare(n: number, bucketBytes: number, extra: Record<string, unknown>, seed: number, dtype: 'fp32' | 'bf16' = 'fp32', groupCount = 11, init: InitOptions = { seed: 3, threads: 1 }, step = 0): Promise<{ grad: number; param: number; moved: number; baseMoved: number }> {
  const options = compileTrainerOptions({ max_tokens_per_micro_batch: 48, grad_clip: 1, learning_rate: 1e-3, weight_decay: 0.01, ...extra });
  const groups = randomGroups(seed, groupCount);
  const { shards } = shardStep(groups, n, 'idle');
  const rankSamples = shards.map((s) => s.flatMap((g) => g.samples));
  const group = referenceGroup(n);
  const models = Array.from({ length: n }, () => Model.init(TINY_CONFIG, init));
  const ref = Model.init(TINY_CONFIG, init);
  const startViews = new Map([...ref.parameters()].map(([n, v]) => [n, v.data.slice()]));
  try {
    const ranks = models.map((m, k) => new DataParallelRank(m, group[k]!, options, { bucketBytes, dtype }));
    // the single process's mini-batches, as the ranks cut theirs
    const perRank = rankSamples.map((s) => packMicroBatches(s, options.maxTokensPerMicroBatch));
    const minis = Array.from({ length: options.miniBatches }, (_, mi) =>
      perRank.flatMap((micro) => {
        const per = Math.max(1, Math.ceil(micro.length / options.miniBatches));
        return micro.slice(mi * per, (mi + 1) * per);
      }),
    );
    const want = await singleProcess(ref, minis, options, step);
    // the ranks' first update alone, for the gradient comparison, then the whole step on fresh ranks
    const metrics = await Promise.all(ranks.map((rk, k) => rk.step(rankSamples[k]!, step)));
    // every rank knows the step's masked tokens: all of the samples', each counted on one rank
    const totalMasked = groups.flatMap((g) => g.samples).reduce((a, s) => a + s.responseMask.filter((x) => x === 1).length, 0);
    for (const mt of metrics) assert.equal(mt.maskedTokens, totalMasked);
    assert.equal(metrics.reduce((a, x) => a + x.rankMaskedTokens, 0), totalMasked);
    // the step's metrics, on every rank, are the one-process trainer's over all the samples (token-weighted means
    // before the update: the packing differs, the values only by summation order)
    if (options.miniBatches === 1 && options.ppoEpochs === 1 && dtype === 'fp32') {
      const one = Model.init(TINY_CONFIG, init);
      try {
        const m1 = await trainOnBatch(one, null, rankSamples.flat(), options, step);
        for (const mt of metrics) {
          for (const key of ['loss', 'pgLoss', 'entropy', 'clip', 'approxKl', 'iwMean', 'iwMax', 'iwTrunc', 'gradNorm'] as const) {
            assert.ok(Math.abs(mt[key] - m1[key]) <= 1e-5 * Math.max(1, Math.abs(m1[key])), `N=${n}: ${key} ${mt[key]} vs one process ${m1[key]}`);
          }
          assert.ok(Math.abs(mt.mismatch.mean - m1.mismatch.mean) <= 1e-6 && mt.mismatch.max === m1.mismatch.max, `N=${n}: mismatch ${JSON.stringify(mt.mismatch)} vs ${JSON.stringify(m1.mismatch)}`);
          assert.deepEqual(mt.lossMetrics.map((x) => x.name), m1.lossMetrics.map((x) => x.name));
          mt.lossMetrics.forEach((x, i) => assert.ok(Math.abs(x.value - m1.lossMetrics[i]!.value) <= 1e-5, `N=${n}: ${x.name}`));
        }
      } finally {
        one.dispose();
      }
    }
    const params = models.map((m) => flat(m.parameters()));
    for (let k = 1; k < n; k++) assert.deepEqual(params[k], params[0], `rank ${k}'s weights are rank 0's, bit for bit`);
    let grad = 0;
    if (options.miniBatches === 1 && options.ppoEpochs === 1) grad = maxDiff(flat(models[0]!.gradients()), want.firstGrads);
    const moved = params[0]!.filter((x, i) => Math.abs(x - want.params[i]!) > WEIGHT_TOL).length / params[0]!.length;
    // outside the trained tensors (LoRA's frozen base), nothing may move on any rank
    const trained = new Set(ref.trainedLayout().map((t) => t.name));
    let baseMoved = 0;
    for (const m of models) for (const [name, v] of m.parameters()) if (!trained.has(name)) baseMoved += v.data.filter((x, i) => x !== startViews.get(name)![i]).length;
    return { moved, grad, param: maxDiff(params[0]!, want.params), baseMoved };
  } finally {
    for (const m of [...models, ref]) m.dispose();
  }
}

// Tolerances: the gradient is clipped to norm 1, so its elements are at most 1; a sum in another order moves each
// by a few fp32 ulps of the largest term (measured: at most 1.5e-8). AdamW's update lr × m/(√v + eps) is ±lr
// whatever the gradient's size except where the gradient is within a few eps of 0, so the weights differ where such
// an element's rounding moved (measured: at most 1.4e-6 at lr 1e-3, over up to four updates; a sign flipped by
// rounding could move one by 2 lr, which the bound below would catch).
const GRAD_TOL = 1e-7;
const WEIGHT_TOL = 1e-5;

test('one rank: the data-parallel step is the single-process step bit for bit (fp32 buckets, odd sizes)', { skip }, async () => {
  for (const bucketBytes of [4, 4 * 13, 1 << 20]) {
    const d = await compare(1, bucketBytes, {}, 5);
    assert.equal(d.grad, 0, `gradient, buckets of ${bucketBytes} bytes`);
    assert.equal(d.param, 0, `weights after the step, buckets of ${bucketBytes} bytes`);
  }
  const d = await compare(1, 4 * 7, { mini_batches: 2, ppo_epochs: 2 }, 6);
  assert.equal(d.param, 0, 'two mini-batches, two epochs');
  // the step's learning rate is the schedule's: the third step of a five-step warm-up takes 3/5 of the peak
  const w = await compare(1, 4 * 7, { warmup_steps: 5, max_steps: 20 }, 7, 'fp32', 11, { seed: 3, threads: 1 }, 2);
  assert.equal(w.param, 0, 'a warm-up step');
});

test('N = 2, 3, 4 ranks: gradients and weights equal the single-process step on the concatenated batch within float tolerance', { skip }, async () => {
  for (const n of [2, 3, 4]) {
    for (const bucketBytes of [4 * 7, 4 * 1001]) {
      const d = await compare(n, bucketBytes, {}, 10 + n);
      console.log(`# N=${n} buckets=${bucketBytes}B: max |grad - ref| ${d.grad.toExponential(2)}, max |w - ref| ${d.param.toExponential(2)}`);
      assert.ok(d.grad <= GRAD_TOL, `N=${n}: gradient differs by ${d.grad}`);
      assert.ok(d.param <= WEIGHT_TOL, `N=${n}: weights differ by ${d.param}`);
    }
    const b = await compare(n, 2 * 7, {}, 30 + n, 'bf16');
    console.log(`# N=${n} bf16 buckets of 14B: max |grad - ref| ${b.grad.toExponential(2)}, max |w - ref| ${b.param.toExponential(2)}, weights off by more than ${WEIGHT_TOL}: ${(100 * b.moved).toFixed(2)}%`);
    // bf16 keeps 8 bits: each gradient element within 2^-8 (relative) of the fp32 sum, the clip's norm with it.
    // A near-0 element whose sign the rounding flipped moves its weight by up to 2 lr (AdamW's first update is
    // ±lr); those must stay a small share.
    assert.ok(b.grad <= 2 ** -7, `N=${n} bf16: gradient differs by ${b.grad}`);
    assert.ok(b.param <= 2 * 1e-3 * 1.001, `N=${n} bf16: weights differ by ${b.param}`);
    assert.ok(b.moved <= 0.02, `N=${n} bf16: ${(100 * b.moved).toFixed(2)}% of the weights off by more than ${WEIGHT_TOL}`);
    const d = await compare(n, 4 * 7, { mini_batches: 2, ppo_epochs: 2 }, 20 + n);
    console.log(`# N=${n} two mini-batches, two epochs: max |w - ref| ${d.param.toExponential(2)}`);
    assert.ok(d.param <= WEIGHT_TOL, `N=${n}, 4 updates: weights differ by ${d.param}`);
    const c = await compare(n, 4 * 7, { lr_schedule: 'cosine', warmup_steps: 2, max_steps: 10 }, 50 + n, 'fp32', 11, { seed: 3, threads: 1 }, 6);
    assert.ok(c.param <= WEIGHT_TOL, `N=${n}, step 7 of a cosine schedule: weights differ by ${c.param}`);
  }
});

test('fewer groups than ranks, the extra ranks idle: they add zero gradients and the step is the single-process one', { skip }, async () => {
  for (const [n, groupCount] of [[3, 2], [4, 1], [4, 3]] as const) {
    const d = await compare(n, 4 * 7, { mini_batches: 2 }, 40 + n + groupCount, 'fp32', groupCount);
    console.log(`# N=${n}, ${groupCount} group(s): max |w - ref| ${d.param.toExponential(2)}`);
    assert.ok(d.param <= WEIGHT_TOL, `N=${n} with ${groupCount} group(s): weights differ by ${d.param}`);
  }
});

test('LoRA: N = 2, 3 ranks train the adapters alone, as one process does, and leave the base weights untouched', { skip }, async () => {
  const init: InitOptions = { seed: 3, threads: 1, lora: { rank: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'up_proj'] } };
  for (const n of [1, 2, 3]) {
    const d = await compare(n, 4 * 5, { learning_rate: 1e-2 }, 60 + n, 'fp32', 11, init);
    console.log(`# LoRA, N=${n}: max |grad - ref| ${d.grad.toExponential(2)}, max |w - ref| ${d.param.toExponential(2)}`);
    if (n === 1) assert.equal(d.param, 0, 'one rank: bit for bit');
    assert.ok(d.grad <= GRAD_TOL, `LoRA N=${n}: gradient differs by ${d.grad}`);
    assert.ok(d.param <= WEIGHT_TOL, `LoRA N=${n}: weights differ by ${d.param}`);
    assert.equal(d.baseMoved, 0, `LoRA N=${n}: frozen base weights moved`);
  }
});
