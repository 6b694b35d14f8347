// Supervised warm-up: cross-entropy on the tokens a demonstration's assistant wrote (response_mask 1), never on
// prompt, tool or user tokens — the same response_mask the RL trainer uses. Sequences are packed like RL batches.
import type { Model } from '../../native/model.ts';
import { rng, shuffle } from '../../core/random.ts';
import type { SftExample } from '../../core/tasks/demonstration.ts';
import { packMicroBatches, type TrainSample } from './batch.ts';
import { learningRateAt } from './lr-schedule.ts';

export interface SftOptions {
  steps: number;
  /** Tokens per optimizer step (packed, split into micro-batches of `microBatchTokens`). */
  batchTokens: number;
  microBatchTokens: number;
  learningRate: number;
  /** Linear warm-up steps, then cosine decay to 10% of the learning rate. */
  warmupSteps: number;
  weightDecay: number;
  gradClip: number;
  seed: number;
}

export interface SftStepInfo {
  step: number;
  loss: number;
  tokens: number;
  lr: number;
}

function toSample(e: SftExample, i: number): TrainSample {
  // A whole conversation is the "response" here: promptLength 0 would predict token 0 from nothing, so
  // token 0 is the prompt and the rest is the response with the example's responseMask.
  return {
    trajectoryId: String(i),
    groupId: String(i),
    tokens: e.tokens,
    promptLength: 1,
    responseMask: e.responseMask.slice(1),
    advantages: [],
    behaviourLogprobs: [],
    staleness: 0,
    reward: 0,
    toolCalls: 0,
    toolErrors: 0,
  };
}

/** Train `model` in place; examples are drawn in a seeded shuffled order, epoch after epoch. */
export async function runSft(model: Model, examples: SftExample[], o: SftOptions, onStep?: (info: SftStepInfo) => void): Promise<SftStepInfo[]> {
  if (examples.length === 0) throw new Error('sft: no examples');
  const r = rng(o.seed);
  let order: number[] = [];
  const history: SftStepInfo[] = [];
  for (let step = 0; step < o.steps; step++) {
    const picked: TrainSample[] = [];
    let tokens = 0;
    while (tokens < o.batchTokens) {
      if (order.length === 0) order = shuffle(examples.map((_, i) => i), r);
      const i = order.pop()!;
      picked.push(toSample(examples[i]!, i));
      tokens += examples[i]!.tokens.length;
    }
    const micro = packMicroBatches(picked, o.microBatchTokens);
    const masked = micro.reduce((n, mb) => n + mb.maskedTokens, 0) || 1;
    model.zeroGrad();
    let loss = 0;
    for (const mb of micro) {
      // The kernel's loss is already the micro-batch's mean times its share of the step's tokens: the shares add up
      // to the step's token mean, whatever the packing (weighting it again made it shrink with more micro-batches).
      const res = await model.backwardCrossEntropy(mb, mb.targets, mb.responseMask, { lossScale: mb.maskedTokens / masked });
      loss += res.loss;
    }
    model.clipGradNorm(o.gradClip);
    const lr = learningRateAt(step, { name: 'cosine', learningRate: o.learningRate, warmupSteps: o.warmupSteps, totalSteps: o.steps, minLrRatio: 0.1 });
    await model.adamwStep({ lr, beta1: 0.9, beta2: 0.98, eps: 1e-8, weightDecay: o.weightDecay });
    const info = { step: step + 1, loss, tokens, lr };
    history.push(info);
    onStep?.(info);
  }
  return history;
}
