// The step's metrics are the batch's, not the packing's: the same samples trained in micro-batches of any token
// budget (one micro-batch per mini-batch, or many) give the same loss, entropy, clip fraction and mismatch,
// because each micro-batch's values are weighted by its masked tokens. The kernel's loss is scaled by the
// micro-batch's share of its mini-batch (for the gradient); the recorded loss must not be (it was, so many small
// micro-batches recorded a smaller loss than one large one).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Model, nativeAvailable } from '../../native/index.ts';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { trainOnBatch } from '../../consumers/trainer/step.ts';
import { runSft } from '../../consumers/trainer/sft.ts';
import { randomGroups } from './parallel/dp-fixtures.ts';
import { TINY_CONFIG } from './fixtures/synthetic.ts';

const skip = nativeAvailable() ? false : 'the native addon is not built (npm run build:native)';

test('the same batch in micro-batches of 40, 96 and 4,096 tokens records the same step metrics', { skip }, async () => {
  for (const seed of [1, 2, 3]) {
    const samples = randomGroups(seed, 9).flatMap((g) => g.samples);
    const runs = [];
    for (const budget of [40, 96, 4096]) {
      const model = Model.init(TINY_CONFIG, { seed: 3, threads: 1 });
      try {
        const options = compileTrainerOptions({ max_tokens_per_micro_batch: budget, learning_rate: 1e-3, entropy_coef: 0.01 });
        runs.push({ budget, m: await trainOnBatch(model, null, samples, options, 0) });
      } finally {
        model.dispose();
      }
    }
    const [small, , whole] = runs;
    assert.ok(Math.abs(whole!.m.loss) > 1e-4, `seed ${seed}: the loss is not ~0 (${whole!.m.loss})`);
    for (const { budget, m } of runs) {
      for (const key of ['loss', 'pgLoss', 'entropy', 'clip', 'approxKl', 'iwMean'] as const) {
        assert.ok(Math.abs(m[key] - whole!.m[key]) <= 1e-5 * Math.max(1, Math.abs(whole!.m[key])), `seed ${seed}, micro-batches of ${budget} tokens: ${key} ${m[key]} vs ${whole!.m[key]} in one micro-batch`);
      }
      assert.equal(m.maskedTokens, whole!.m.maskedTokens);
    }
    console.log(`# seed ${seed}: loss ${whole!.m.loss.toExponential(4)}; micro-batches of 40 tokens: ${small!.m.loss.toExponential(4)}`);
  }
});

test("the SFT warm-up's recorded loss is the step's token mean whatever the micro-batch size", { skip }, async () => {
  const examples = randomGroups(4, 6).flatMap((g) => g.samples).map((s) => ({ tokens: s.tokens, responseMask: [0, ...Array.from({ length: s.tokens.length - 1 }, (_, i) => (i >= s.promptLength - 1 ? 1 : 0))] }));
  const losses = [];
  for (const microBatchTokens of [40, 4096]) {
    const model = Model.init(TINY_CONFIG, { seed: 3, threads: 1 });
    try {
      const history = await runSft(model, examples, { steps: 1, batchTokens: 200, microBatchTokens, learningRate: 1e-3, warmupSteps: 0, weightDecay: 0, gradClip: 1, seed: 1 });
      losses.push(history[0]!.loss);
    } finally {
      model.dispose();
    }
  }
  // a random 32-token model's cross-entropy is about ln 32
  assert.ok(Math.abs(losses[1]! - Math.log(32)) < 0.5, `one micro-batch: ${losses[1]}`);
  assert.ok(Math.abs(losses[0]! - losses[1]!) <= 1e-5 * losses[1]!, `micro-batches of 40 tokens: ${losses[0]} vs ${losses[1]} in one`);
});
