// What the data-parallel step tests share: generated groups of trajectories, and the single-process step a data-
// parallel one must equal (data-parallel-step.test.ts on the CPU, nccl.test.ts on a GPU).
import { rng } from '../../../core/random.ts';
import type { Model } from '../../../native/index.ts';
import type { PackedMicroBatch, TrainSample } from '../../../consumers/trainer/batch.ts';
import type { TrainerOptions } from '../../../consumers/trainer/options.ts';
import { learningRateAt } from '../../../consumers/trainer/lr-schedule.ts';
import type { StepGroup } from '../../../consumers/trainer/parallel/shard.ts';
import { TINY_CONFIG } from '../fixtures/synthetic.ts';

export function randomGroups(seed: number, count: number): StepGroup<TrainSample>[] {
  const r = rng(seed);
  return Array.from({ length: count }, (_, g) => {
    const samples = Array.from({ length: 1 + Math.floor(r() * 5) }, (_, k): TrainSample => {
      const promptLength = 2 + Math.floor(r() * 5);
      const length = promptLength + 2 + Math.floor(r() * 30);
      const responseLength = length - promptLength;
      const adv = r() < 0.5 ? 1 : -1;
      return {
        trajectoryId: `t${g}.${k}`,
        groupId: `g${g}`,
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

/**
 * One process over the same mini-batches: mini-batch m is every rank's m-th share of its micro-batches (the data-
 * parallel step's definition), each micro-batch's loss scaled by its share of the mini-batch's masked tokens;
 * proximal log-probs before any update; the gradient clipped; the native AdamW over the whole vector at the
 * schedule's rate for `step` (steps committed before this one).
 */
export async function singleProcess(model: Model, minis: PackedMicroBatch[][], o: TrainerOptions, step: number): Promise<{ params: Float32Array; firstGrads: Float32Array }> {
  const prox = new Map<PackedMicroBatch, Float32Array>();
  for (const mb of minis.flat()) prox.set(mb, (await model.forward(mb, mb.targets)).logprobs);
  const adam = { lr: learningRateAt(step, o.lrSchedule), beta1: o.beta1, beta2: o.beta2, eps: o.adamEps, weightDecay: o.weightDecay };
  let firstGrads: Float32Array | null = null;
  for (let epoch = 0; epoch < o.ppoEpochs; epoch++) {
    for (const mini of minis) {
      const masked = mini.reduce((n, mb) => n + mb.maskedTokens, 0) || 1;
      model.zeroGrad();
      for (const mb of mini) {
        const l = o.policyLoss;
        await model.backwardPolicyLoss(mb, { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox.get(mb)! }, { loss: l.loss, clipLow: l.clipLow, clipHigh: l.clipHigh, dualClipC: l.dualClipC, correction: o.rolloutCorrection, klCoef: 0, klType: o.klType, entropyCoef: o.entropyCoef, aggregation: o.aggregation, lossScale: mb.maskedTokens / masked });
      }
      model.clipGradNorm(o.gradClip);
      firstGrads ??= flat(model.gradients());
      await model.adamwStep(adam);
    }
  }
  return { params: flat(model.parameters()), firstGrads: firstGrads! };
}

/** A model's tensors in block order as one vector (on a GPU model, a snapshot of the device's copy). */
export function flat(views: Map<string, { data: Float32Array }>): Float32Array {
  return Float32Array.from([...views.values()].flatMap((t) => [...t.data]));
}
