// The trainer's optimizer step over one batch: micro-batches packed by token budget, the proximal (and reference)
// log-probs from the weights before the step, then ppo_epochs passes of mini-batch updates with the configured
// policy loss, gradient clipping and AdamW. It returns the step's metrics; making the step durable is commit.ts's.
import type { NamedValue } from '../../schemas/generated/types.ts';
import { withLossScale, type Model, type PolicyLossMetrics } from '../../native/index.ts';
import { packMicroBatches, type TrainSample } from './batch.ts';
import { learningRateAt } from './lr-schedule.ts';
import type { TrainerOptions } from './options.ts';
import { policyLosses } from './policy-losses.ts';

/** A step's loss metrics, each a token-weighted mean over its updates (iwMax the maximum, gradNorm the mean per update). */
export interface StepMetrics {
  loss: number;
  pgLoss: number;
  clip: number;
  approxKl: number;
  entropy: number;
  kl: number;
  iwMean: number;
  iwMax: number;
  iwTrunc: number;
  iwMasked: number;
  gradNorm: number;
  /** The policy loss's own metrics, `loss/<name>/<metric>`. */
  lossMetrics: NamedValue[];
  /** Rollout–trainer log-prob mismatch: |behaviour − recomputed| over masked tokens, before any update. */
  mismatch: { mean: number; max: number };
  /** Tokens the loss covered (every rank's, in a data-parallel step). */
  maskedTokens: number;
  /** This rank's share of them (maskedTokens in one process). */
  rankMaskedTokens: number;
  /** Optimizer updates made (mini-batches × epochs). */
  updates: number;
  /** Wall time of the forward passes and updates. */
  computeMs: number;
}

/** A step that trained on nothing (only stale samples): it changes no weight, and every metric is 0. */
export function emptyStepMetrics(): StepMetrics {
  return { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwMax: 0, iwTrunc: 0, iwMasked: 0, gradNorm: 0, lossMetrics: [], mismatch: { mean: 0, max: 0 }, maskedTokens: 0, rankMaskedTokens: 0, updates: 0, computeMs: 0 };
}

/**
 * What a data-parallel rank adds to the step (parallel/rank-step.ts builds it over a Collective); absent in one
 * process. Every rank runs the same updates: mini-batch m is each rank's m-th share of its micro-batches, possibly
 * none, and the step's counts, gradients and metrics are summed over the ranks at fixed points.
 */
export interface StepExchange {
  /** Sums each value over the ranks, in place (one collective for the whole array). */
  sum(values: Float32Array): Promise<void>;
  /** The largest of each value over the ranks, in place. */
  max(values: Float32Array): Promise<void>;
  /** A mini-batch's gradients summed over the ranks, before they are clipped. */
  reduceGradients(): Promise<void>;
  /** After each rank's AdamW on its shard of the optimizer: every rank's updated parameters, to every rank. */
  gatherParameters(): Promise<void>;
}

/** Micro-batches cut into `count` consecutive mini-batches (the last ones empty where there are fewer micro-batches). */
function miniBatches<T>(micro: T[], count: number): { mb: T; k: number }[][] {
  const per = Math.max(1, Math.ceil(micro.length / count));
  return Array.from({ length: count }, (_, m) => micro.slice(m * per, (m + 1) * per).map((mb, j) => ({ mb, k: m * per + j })));
}

/**
 * Train `model` on a batch (non-empty in one process; a data-parallel rank's share may be empty). `step` is the
 * number of steps committed before this one (the learning rate schedule's position); `ref` is the frozen reference
 * model when the KL penalty is on. With `exchange`, this is one rank's part of a data-parallel step: the losses are
 * scaled by every rank's masked tokens, so that the summed gradient is the one process's gradient over all the
 * ranks' samples, and the metrics are the step's over all of them.
 */
export async function trainOnBatch(model: Model, ref: Model | null, samples: TrainSample[], options: TrainerOptions, step: number, exchange?: StepExchange): Promise<StepMetrics> {
  const t0 = performance.now();
  const micro = packMicroBatches(samples, options.maxTokensPerMicroBatch);
  // Proximal log-probs: the current weights before this step's updates (decoupled PPO, AReaL).
  const prox = await Promise.all(micro.map(async (mb) => (await model.forward(mb, mb.targets)).logprobs));
  const refLp = ref ? await Promise.all(micro.map(async (mb) => (await ref.forward(mb, mb.targets)).logprobs)) : null;
  // In one process an empty mini-batch is no update; across ranks every rank makes the same updates.
  const minis = miniBatches(micro, options.miniBatches).filter((c) => exchange !== undefined || c.length > 0);
  // The step's masked tokens and each mini-batch's: every rank's (one collective). fp32 holds them exactly up to
  // 2^24 tokens a step.
  const counts = Float32Array.from([micro.reduce((n, mb) => n + mb.maskedTokens, 0), ...minis.map((c) => c.reduce((n, { mb }) => n + mb.maskedTokens, 0))]);
  const rankMasked = counts[0]!;
  await exchange?.sum(counts);
  const totalMasked = counts[0]!;
  const sums = { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwTrunc: 0, iwMasked: 0 };
  let iwMax = 0;
  let gradNorm = 0;
  let updates = 0;
  const loss = options.policyLoss;
  const lossMetricFns = Object.entries(policyLosses.get(loss.name).metrics);
  const lossMetricSums = lossMetricFns.map(() => 0);
  for (let epoch = 0; epoch < options.ppoEpochs; epoch++) {
    for (const [m, chunk] of minis.entries()) {
      const chunkMasked = counts[1 + m]! || 1;
      model.zeroGrad();
      for (const { mb, k } of chunk) {
        const share = mb.maskedTokens / chunkMasked;
        const metrics: PolicyLossMetrics = await model.backwardPolicyLoss(
          mb,
          { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox[k]!, ...(refLp ? { refLogprobs: refLp[k]! } : {}) },
          // Compiled once with the options (compileTrainerOptions); a micro-batch only sets its share.
          withLossScale(options.lossOptions, share),
        );
        const w = mb.maskedTokens / (totalMasked * options.ppoEpochs || 1);
        // The kernel's loss is scaled by the micro-batch's share of its mini-batch; the step's loss is the micro-
        // batch's own, weighted by its tokens like every other metric, so that it does not depend on the packing.
        sums.loss += (share > 0 ? metrics.loss / share : 0) * w;
        sums.pgLoss += metrics.pgLoss * w;
        sums.clip += metrics.clipFraction * w;
        sums.approxKl += metrics.approxKl * w;
        sums.entropy += metrics.entropy * w;
        sums.kl += metrics.kl * w;
        sums.iwMean += metrics.iwMean * w;
        sums.iwTrunc += metrics.iwTruncatedFraction * w;
        sums.iwMasked += metrics.iwMaskedFraction * w;
        lossMetricFns.forEach(([, f], i) => (lossMetricSums[i]! += f(metrics) * w));
        iwMax = Math.max(iwMax, metrics.iwMax);
      }
      await exchange?.reduceGradients();
      // Every rank holds the same summed gradient: the same norm, the same clip.
      gradNorm += model.clipGradNorm(options.gradClip);
      updates++;
      await model.adamwStep({ lr: learningRateAt(step, options.lrSchedule), beta1: options.beta1, beta2: options.beta2, eps: options.adamEps, weightDecay: options.weightDecay });
      await exchange?.gatherParameters();
    }
  }
  const keys = Object.keys(sums) as (keyof typeof sums)[];
  const mis = logprobMismatch(micro, prox);
  if (exchange) {
    // Each rank's shares of the token-weighted means, and of the mismatch's sum and count, add up to the step's.
    const all = Float32Array.from([...keys.map((key) => sums[key]), ...lossMetricSums, mis.sum, mis.n]);
    await exchange.sum(all);
    keys.forEach((key, i) => (sums[key] = all[i]!));
    lossMetricSums.forEach((_, i) => (lossMetricSums[i] = all[keys.length + i]!));
    [mis.sum, mis.n] = [all[all.length - 2]!, all[all.length - 1]!];
    const maxes = Float32Array.of(iwMax, mis.max);
    await exchange.max(maxes);
    [iwMax, mis.max] = [maxes[0]!, maxes[1]!];
  }
  const lossMetrics = lossMetricFns.map(([name], i) => ({ name: `loss/${loss.name}/${name}`, value: lossMetricSums[i]! }));
  return {
    ...sums,
    iwMax,
    gradNorm: gradNorm / Math.max(1, updates),
    lossMetrics,
    mismatch: { mean: mis.n ? mis.sum / mis.n : 0, max: mis.max },
    maskedTokens: totalMasked,
    rankMaskedTokens: rankMasked,
    updates,
    computeMs: performance.now() - t0,
  };
}

function logprobMismatch(micro: { responseMask: Float32Array; behaviourLogprobs: Float32Array }[], recomputed: Float32Array[]): { sum: number; n: number; max: number } {
  let sum = 0;
  let n = 0;
  let max = 0;
  micro.forEach((mb, k) => {
    const lp = recomputed[k]!;
    for (let i = 0; i < mb.responseMask.length; i++) {
      if (mb.responseMask[i] !== 1) continue;
      const d = Math.abs(lp[i]! - mb.behaviourLogprobs[i]!);
      sum += d;
      n++;
      if (d > max) max = d;
    }
  });
  return { sum, n, max };
}
