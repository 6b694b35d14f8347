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
  /** Tokens the loss covered. */
  maskedTokens: number;
  /** Wall time of the forward passes and updates. */
  computeMs: number;
}

/** A step that trained on nothing (only stale samples): it changes no weight, and every metric is 0. */
export function emptyStepMetrics(): StepMetrics {
  return { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwMax: 0, iwTrunc: 0, iwMasked: 0, gradNorm: 0, lossMetrics: [], mismatch: { mean: 0, max: 0 }, maskedTokens: 0, computeMs: 0 };
}

/**
 * Train `model` on a non-empty batch. `step` is the number of steps committed before this one (the learning rate
 * schedule's position); `ref` is the frozen reference model when the KL penalty is on.
 */
export async function trainOnBatch(model: Model, ref: Model | null, samples: TrainSample[], options: TrainerOptions, step: number): Promise<StepMetrics> {
  const t0 = performance.now();
  const micro = packMicroBatches(samples, options.maxTokensPerMicroBatch);
  // Proximal log-probs: the current weights before this step's updates (decoupled PPO, AReaL).
  const prox = await Promise.all(micro.map(async (mb) => (await model.forward(mb, mb.targets)).logprobs));
  const refLp = ref ? await Promise.all(micro.map(async (mb) => (await ref.forward(mb, mb.targets)).logprobs)) : null;
  const mismatch = logprobMismatch(micro, prox);
  const totalMasked = micro.reduce((n, mb) => n + mb.maskedTokens, 0);
  const sums = { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwMax: 0, iwTrunc: 0, iwMasked: 0, gradNorm: 0, updates: 0 };
  const loss = options.policyLoss;
  const lossMetricFns = Object.entries(policyLosses.get(loss.name).metrics);
  const lossMetricSums = lossMetricFns.map(() => 0);
  const perMini = Math.ceil(micro.length / options.miniBatches);
  for (let epoch = 0; epoch < options.ppoEpochs; epoch++) {
    for (let m = 0; m < micro.length; m += perMini) {
      const chunk = micro.slice(m, m + perMini).map((mb, j) => ({ mb, k: m + j }));
      const chunkMasked = chunk.reduce((n, { mb }) => n + mb.maskedTokens, 0) || 1;
      model.zeroGrad();
      for (const { mb, k } of chunk) {
        const metrics: PolicyLossMetrics = await model.backwardPolicyLoss(
          mb,
          { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox[k]!, ...(refLp ? { refLogprobs: refLp[k]! } : {}) },
          // Compiled once with the options (compileTrainerOptions); a micro-batch only sets its share.
          withLossScale(options.lossOptions, mb.maskedTokens / chunkMasked),
        );
        const w = mb.maskedTokens / (totalMasked * options.ppoEpochs || 1);
        sums.loss += metrics.loss * w;
        sums.pgLoss += metrics.pgLoss * w;
        sums.clip += metrics.clipFraction * w;
        sums.approxKl += metrics.approxKl * w;
        sums.entropy += metrics.entropy * w;
        sums.kl += metrics.kl * w;
        sums.iwMean += metrics.iwMean * w;
        sums.iwTrunc += metrics.iwTruncatedFraction * w;
        sums.iwMasked += metrics.iwMaskedFraction * w;
        lossMetricFns.forEach(([, f], i) => (lossMetricSums[i]! += f(metrics) * w));
        sums.iwMax = Math.max(sums.iwMax, metrics.iwMax);
      }
      sums.gradNorm += model.clipGradNorm(options.gradClip);
      sums.updates++;
      await model.adamwStep({ lr: learningRateAt(step, options.lrSchedule), beta1: options.beta1, beta2: options.beta2, eps: options.adamEps, weightDecay: options.weightDecay });
    }
  }
  const lossMetrics = lossMetricFns.map(([name], i) => ({ name: `loss/${loss.name}/${name}`, value: lossMetricSums[i]! }));
  const { updates, ...means } = sums;
  return { ...means, gradNorm: sums.gradNorm / Math.max(1, updates), lossMetrics, mismatch, maskedTokens: totalMasked, computeMs: performance.now() - t0 };
}

function logprobMismatch(micro: { responseMask: Float32Array; behaviourLogprobs: Float32Array }[], recomputed: Float32Array[]): { mean: number; max: number } {
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
  return { mean: n ? sum / n : 0, max };
}
