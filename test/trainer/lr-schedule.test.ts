// The learning-rate schedule: `trainer.lr_schedule` compiles to the rate each step's AdamW update uses (warm-up,
// then constant, linear or cosine decay to min_lr_ratio at max_steps); a decay without an end or a warm-up as
// long as the run fails at config time naming the field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compileTrainerOptions } from '../../consumers/trainer/options.ts';
import { learningRateAt, type LrSchedule } from '../../consumers/trainer/lr-schedule.ts';
import { trainerIssues } from './fixtures/synthetic.ts';


const close = (a: number, b: number) => assert.ok(Math.abs(a - b) <= 1e-12 * Math.max(1, Math.abs(b)), `${a} vs ${b}`);

test('the default is the constant learning rate the trainer always had', () => {
  const t = compileTrainerOptions({ learning_rate: 3e-4, max_steps: 40 });
  for (const step of [0, 1, 20, 39, 1000]) assert.equal(learningRateAt(step, t.lrSchedule), 3e-4);
  assert.equal(t.lrSchedule.name, 'constant');
});

test('linear and cosine decay from the peak to min_lr_ratio × peak over max_steps, after a linear warm-up', () => {
  const s = (name: LrSchedule['name'], warmupSteps = 0): LrSchedule => compileTrainerOptions({ learning_rate: 1e-3, lr_schedule: name, warmup_steps: warmupSteps, min_lr_ratio: 0.1, max_steps: 40 }).lrSchedule;
  // Warm-up: step k (0-based) uses (k + 1)/warmup of the peak, whatever the decay.
  for (const name of ['constant', 'linear', 'cosine'] as const) {
    close(learningRateAt(0, s(name, 4)), 0.25e-3);
    close(learningRateAt(3, s(name, 4)), 1e-3);
  }
  close(learningRateAt(0, s('linear')), 1e-3);
  close(learningRateAt(20, s('linear')), 1e-3 * (0.1 + 0.9 * 0.5));
  close(learningRateAt(40, s('linear')), 1e-4);
  close(learningRateAt(0, s('cosine')), 1e-3);
  close(learningRateAt(20, s('cosine')), 1e-3 * (0.1 + 0.9 * 0.5));
  close(learningRateAt(10, s('cosine')), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + Math.SQRT1_2)));
  close(learningRateAt(40, s('cosine')), 1e-4);
  close(learningRateAt(400, s('cosine')), 1e-4);
  // Decay starts after warm-up: 4 warm-up steps leave 36 to decay over.
  close(learningRateAt(22, s('linear', 4)), 1e-3 * (0.1 + 0.9 * 0.5));
  // Monotone non-increasing after warm-up, never below the floor.
  for (const name of ['linear', 'cosine'] as const) {
    let prev = Infinity;
    for (let k = 0; k < 60; k++) {
      const lr = learningRateAt(k, s(name));
      assert.ok(lr <= prev && lr >= 1e-4 - 1e-18, `${name} step ${k}: ${lr}`);
      prev = lr;
    }
  }
});

test('a decay without max_steps, a warm-up as long as the run, an unknown schedule and a ratio above 1 fail naming the field', () => {
  assert.deepEqual(trainerIssues({ lr_schedule: 'cosine' }), ["trainer.lr_schedule: 'cosine' decays over trainer.max_steps, which is 0 (unbounded): set trainer.max_steps, or lr_schedule: constant"]);
  assert.deepEqual(trainerIssues({ lr_schedule: 'linear', max_steps: 10, warmup_steps: 10 }), ['trainer.warmup_steps: 10 warm-up steps leave none of trainer.max_steps (10): set warmup_steps below max_steps']);
  assert.match(trainerIssues({ lr_schedule: 'cosin', max_steps: 10 }).join('\n'), /^trainer\.lr_schedule: must be one of constant, linear, cosine .*did you mean cosine/);
  assert.match(trainerIssues({ min_lr_ratio: 1.5 }).join('\n'), /^trainer\.min_lr_ratio: /);
  assert.match(trainerIssues({ warmup_steps: -1 }).join('\n'), /^trainer\.warmup_steps: /);
  // A constant rate needs no end; a warm-up on an unbounded run is allowed.
  assert.deepEqual(trainerIssues({ warmup_steps: 5 }), []);
  assert.deepEqual(trainerIssues({ lr_schedule: 'cosine', max_steps: 40, warmup_steps: 4, min_lr_ratio: 0 }), []);
});
