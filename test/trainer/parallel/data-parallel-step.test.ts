// A data-parallel step of the native model (CPU) over N reference ranks against one process training the
// concatenated batch: the same micro-batches' policy-loss gradients, summed over ranks in buckets (fp32, odd bucket
// sizes) then clipped, and the ZeRO-1 AdamW update, for N in 1..4, with mini-batches and PPO epochs. With one
// rank the step is bit for bit the single-process one; with more, the gradient sums run in another order, and the
// results agree within the tolerances stated below (measured, with their margins, in the test's output).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rng } from '../../../core/random.ts';
import { Model, nativeAvailable } from '../../../native/index.ts';
import { packMicroBatches, type PackedMicroBatch, type TrainSample } from '../../../consumers/trainer/batch.ts';
import { compileTrainerOptions, type TrainerOptions } from '../../../consumers/trainer/options.ts';
import { referenceGroup } from '../../../consumers/trainer/parallel/reference-collective.ts';
import { DataParallelRank } from '../../../consumers/trainer/parallel/rank-step.ts';
import { shardStep, type StepGroup } from '../../../consumers/trainer/parallel/shard.ts';
import { adamwFlat } from '../../../consumers/trainer/parallel/zero1.ts';
import { TINY_CONFIG } from '../fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';

function randomGroups(seed: number, count: number): StepGroup<TrainSample>[] {
  const r = rng(seed);
  return Array.from({ length: count }, (_, g) => {
    const samples = Array.from({ length: 1 + Math.floor(r() * 5) }, (_, k): TrainSample => {
      const promptLength = 2 + Math.floor(r() * 5);
      const length = promptLength + 2 + Math.floor(r() * 30);
      const responseLength = length - promptLength;
      const adv = r() < 0.5 ? 1 : -1;
      return {
        trajectoryId: `t${g}.${k}`,
        tokens: Array.from({ length }, () => Math.floor(r() * TINY_CONFIG.vocab_size)),
        promptLength,
        responseMask: Array.from({ length: responseLength }, () => (r() < 0.85 ? 1 : 0)),
        advantages: Array.from({ length: responseLength }, () => adv * (0.5 + r())),
        behaviourLogprobs: Array.from({ length: responseLength }, () => -3.47 + (r() - 0.5) * 0.2),
        staleness: 0,
        reward: adv > 0 ? 1 : 0,
        toolCalls: 0,
        toolErrors: 0,
      };
    });
    return { groupId: `g${g}`, samples, tokens: samples.reduce((n, s) => n + s.tokens.length, 0) };
  });
}

const flat = (m: Map<string, { data: Float32Array }>): Float32Array => Float32Array.from([...m.values()].flatMap((t) => [...t.data]));

function maxDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/**
 * One process over the same mini-batches: mini-batch m is every rank's m-th share of its micro-batches (the data-
 * parallel step's definition), each micro-batch's loss scaled by its share of the mini-batch's masked tokens;
 * proximal log-probs before any update; the gradient clipped; AdamW over the whole vector, in TypeScript (the
 * arithmetic of the ZeRO-1 slices) and, for the first update, the native kernel.
 */
async function singleProcess(model: Model, minis: PackedMicroBatch[][], o: TrainerOptions): Promise<{ params: Float32Array; firstGrads: Float32Array; nativeParams: Float32Array }> {
  const prox = new Map<PackedMicroBatch, Float32Array>();
  for (const mb of minis.flat()) prox.set(mb, (await model.forward(mb, mb.targets)).logprobs);
  const start = flat(model.parameters());
  const p = start.slice();
  const m = new Float32Array(p.length);
  const v = new Float32Array(p.length);
  const adam = { lr: o.learningRate, beta1: o.beta1, beta2: o.beta2, eps: o.adamEps, weightDecay: o.weightDecay };
  let firstGrads: Float32Array | null = null;
  let nativeParams: Float32Array | null = null;
  let step = 0;
  for (let epoch = 0; epoch < o.ppoEpochs; epoch++) {
    for (const mini of minis) {
      const masked = mini.reduce((n, mb) => n + mb.maskedTokens, 0) || 1;
      model.zeroGrad();
      for (const mb of mini) {
        const l = o.policyLoss;
        await model.backwardPolicyLoss(mb, { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox.get(mb)! }, { loss: l.loss, clipLow: l.clipLow, clipHigh: l.clipHigh, dualClipC: l.dualClipC, correction: o.rolloutCorrection, klCoef: 0, klType: o.klType, entropyCoef: o.entropyCoef, aggregation: o.aggregation, lossScale: mb.maskedTokens / masked });
      }
      model.clipGradNorm(o.gradClip);
      const g = flat(model.gradients());
      adamwFlat(p, g, m, v, ++step, adam);
      if (firstGrads === null) {
        firstGrads = g;
        await model.adamwStep(adam);
        nativeParams = flat(model.parameters());
      }
      // the model trains on from the TypeScript update, as each rank does
      const views = [...model.parameters().values()];
      let at = 0;
      for (const t of views) {
        t.data.set(p.subarray(at, at + t.data.length));
        at += t.data.length;
      }
    }
  }
  return { params: p, firstGrads: firstGrads!, nativeParams: nativeParams! };
}

async function compare(n: number, bucketBytes: number, extra: Record<string, unknown>, seed: number, dtype: 'fp32' | 'bf16' = 'fp32', groupCount = 11): Promise<{ grad: number; param: number; native: number; scale: number; moved: number }> {
  const options = compileTrainerOptions({ max_tokens_per_micro_batch: 48, grad_clip: 1, learning_rate: 1e-3, weight_decay: 0.01, ...extra });
  const groups = randomGroups(seed, groupCount);
  const { shards } = shardStep(groups, n, 'idle');
  const rankSamples = shards.map((s) => s.flatMap((g) => g.samples));
  const group = referenceGroup(n);
  const models = Array.from({ length: n }, () => Model.init(TINY_CONFIG, { seed: 3, threads: 1 }));
  const ref = Model.init(TINY_CONFIG, { seed: 3, threads: 1 });
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
    const want = await singleProcess(ref, minis, options);
    // the ranks' first update alone, for the gradient comparison, then the whole step on fresh ranks
    const metrics = await Promise.all(ranks.map((rk, k) => rk.step(rankSamples[k]!)));
    // every rank knows the step's masked tokens: all of the samples', each counted on one rank
    const totalMasked = groups.flatMap((g) => g.samples).reduce((a, s) => a + s.responseMask.filter((x) => x === 1).length, 0);
    for (const mt of metrics) assert.equal(mt.maskedTokens, totalMasked);
    assert.equal(metrics.reduce((a, x) => a + x.rankMaskedTokens, 0), totalMasked);
    const params = models.map((m) => flat(m.parameters()));
    for (let k = 1; k < n; k++) assert.deepEqual(params[k], params[0], `rank ${k}'s weights are rank 0's, bit for bit`);
    const scale = want.params.reduce((a, x) => Math.max(a, Math.abs(x)), 0);
    let grad = 0;
    if (options.miniBatches === 1 && options.ppoEpochs === 1) grad = maxDiff(flat(models[0]!.gradients()), want.firstGrads);
    const moved = params[0]!.filter((x, i) => Math.abs(x - want.params[i]!) > WEIGHT_TOL).length / params[0]!.length;
    return { moved, grad, param: maxDiff(params[0]!, want.params), native: options.miniBatches === 1 && options.ppoEpochs === 1 ? maxDiff(params[0]!, want.nativeParams) : 0, scale };
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
    // the native AdamW kernel fuses multiply-adds where the compiler may: within a few ulps of the weights
    assert.ok(d.native <= 4 * 2 ** -23 * d.scale, `native AdamW differs by ${d.native}`);
  }
  const d = await compare(1, 4 * 7, { mini_batches: 2, ppo_epochs: 2 }, 6);
  assert.equal(d.param, 0, 'two mini-batches, two epochs');
});

test('N = 2, 3, 4 ranks: gradients and weights equal the single-process step on the concatenated batch within float tolerance', { skip }, async () => {
  for (const n of [2, 3, 4]) {
    for (const bucketBytes of [4 * 7, 4 * 1001]) {
      const d = await compare(n, bucketBytes, {}, 10 + n);
      console.log(`# N=${n} buckets=${bucketBytes}B: max |grad - ref| ${d.grad.toExponential(2)}, max |w - ref| ${d.param.toExponential(2)}, vs native AdamW ${d.native.toExponential(2)}`);
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
  }
});

test('fewer groups than ranks, the extra ranks idle: they add zero gradients and the step is the single-process one', { skip }, async () => {
  for (const [n, groupCount] of [[3, 2], [4, 1], [4, 3]] as const) {
    const d = await compare(n, 4 * 7, { mini_batches: 2 }, 40 + n + groupCount, 'fp32', groupCount);
    console.log(`# N=${n}, ${groupCount} group(s): max |w - ref| ${d.param.toExponential(2)}`);
    assert.ok(d.param <= WEIGHT_TOL, `N=${n} with ${groupCount} group(s): weights differ by ${d.param}`);
  }
});
