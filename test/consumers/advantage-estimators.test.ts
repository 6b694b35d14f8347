// Every advantage estimator against values computed by hand (verl core_algos semantics), plus properties.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DEFAULT_ESTIMATOR_OPTIONS, estimatorNames, getEstimator, type EstimatorSample } from '../../consumers/advantage/estimators.ts';

const opts = (o: Partial<typeof DEFAULT_ESTIMATOR_OPTIONS> = {}) => ({ ...DEFAULT_ESTIMATOR_OPTIONS, ...o });

function close(actual: ArrayLike<number>, expected: number[], tol = 1e-5): void {
  assert.equal(actual.length, expected.length, `length ${actual.length} vs ${expected.length}`);
  for (let i = 0; i < expected.length; i++) assert.ok(Math.abs(actual[i]! - expected[i]!) <= tol, `[${i}] ${actual[i]} vs ${expected[i]} (all: ${Array.from(actual).join(', ')})`);
}

const s = (groupId: string, score: number, responseMask: number[], extra: Partial<EstimatorSample> = {}): EstimatorSample => ({ groupId, score, responseMask, ...extra });

test('grpo: (r - mean) / (unbiased std + eps); a group of one has mean 0, std 1', () => {
  const out = getEstimator('grpo')([s('g', 1, [1, 1, 0]), s('g', 0, [1]), s('g', 0, [1, 1]), s('g', 1, [0, 1]), s('solo', 0.7, [1, 1])], opts());
  const a = 0.5 / (Math.sqrt(1 / 3) + 1e-6); // mean .5, unbiased var (4 × .25) / 3
  close(out[0]!.advantages, [a, a, 0]);
  close(out[1]!.advantages, [-a]);
  close(out[2]!.advantages, [-a, -a]);
  close(out[3]!.advantages, [0, a]);
  close(out[4]!.advantages, [0.7 / (1 + 1e-6), 0.7 / (1 + 1e-6)]);
  close(out[0]!.returns, [a, a, 0]);
});

test('grpo: all-equal rewards give 0, not NaN (eps in the denominator)', () => {
  const out = getEstimator('grpo')([s('g', 1, [1]), s('g', 1, [1])], opts());
  close(out[0]!.advantages, [0]);
});

test('grpo_no_std (Dr.GRPO): r - group mean', () => {
  const out = getEstimator('grpo_no_std')([s('g', 1, [1, 0]), s('g', 0, [1]), s('g', 0, [1]), s('g', 1, [1]), s('solo', 0.7, [1])], opts());
  close(out[0]!.advantages, [0.5, 0]);
  close(out[1]!.advantages, [-0.5]);
  close(out[4]!.advantages, [0.7]);
});

test('rloo: r × n/(n-1) - mean × n/(n-1); a group of one keeps its reward', () => {
  const out = getEstimator('rloo')([s('g', 1, [1]), s('g', 0, [1]), s('g', 0, [1]), s('g', 1, [1, 0]), s('solo', 0.7, [1])], opts());
  close(out[0]!.advantages, [2 / 3]); // 1 - mean(0, 0, 1) = 2/3
  close(out[1]!.advantages, [-2 / 3]);
  close(out[3]!.advantages, [2 / 3, 0]);
  close(out[4]!.advantages, [0.7]);
});

test('reinforce_plus_plus_baseline: group mean subtracted, whitened over all masked tokens of the batch', () => {
  const out = getEstimator('reinforce_plus_plus_baseline')([s('g', 1, [1, 1]), s('g', 0, [1, 1, 0])], opts());
  const a = 0.5 / Math.sqrt(1 / 3 + 1e-8); // tokens .5 .5 -.5 -.5: mean 0, unbiased var 1/3
  close(out[0]!.advantages, [a, a]);
  close(out[1]!.advantages, [-a, -a, 0]);
});

test('reinforce_plus_plus: discounted returns from the last masked token, whitened over the batch', () => {
  const out = getEstimator('reinforce_plus_plus')([s('g', 1, [1, 1, 1])], opts({ gamma: 0.5 }));
  close(out[0]!.returns, [0.25, 0.5, 1]);
  // mean 7/12, deviations -1/3, -1/12, 5/12, unbiased var 0.145833
  const sd = Math.sqrt(0.2916666667 / 2 + 1e-8);
  close(out[0]!.advantages, [-1 / 3 / sd, -1 / 12 / sd, 5 / 12 / sd]);
});

test('reinforce_plus_plus: tool tokens (mask 0) are skipped, not a reset of the return', () => {
  const out = getEstimator('reinforce_plus_plus')([s('g', 1, [1, 0, 1])], opts({ gamma: 0.5 }));
  close(out[0]!.returns, [0.5, 0, 1]);
  close(out[0]!.advantages, [-Math.SQRT1_2, 0, Math.SQRT1_2], 1e-4);
});

test('reinforce_plus_plus: per-token rewards are used when given', () => {
  const out = getEstimator('reinforce_plus_plus')([s('g', 9, [1, 1], { tokenRewards: [1, 2] })], opts({ gamma: 1 }));
  close(out[0]!.returns, [3, 2]);
});

test('gae: gamma = lambda = 1 with no critic is the outcome whitened over the batch', () => {
  const out = getEstimator('gae')([s('a', 1, [1, 1]), s('b', 0, [1, 1])], opts());
  const a = 0.5 / Math.sqrt(1 / 3 + 1e-8);
  close(out[0]!.advantages, [a, a]);
  close(out[1]!.advantages, [-a, -a]);
  close(out[0]!.returns, [1, 1]);
  close(out[1]!.returns, [0, 0]);
});

test('gae: TD errors with critic values, observation tokens skipped', () => {
  // t=2: δ = 1 - .6 = .4, A = .4; t=1 is a tool token (carried); t=0: δ = .9 × .6 - .5 = .04, A = .04 + .72 × .4
  const out = getEstimator('gae')([s('a', 1, [1, 0, 1], { values: [0.5, 9, 0.6] })], opts({ gamma: 0.9, lam: 0.8 }));
  close(out[0]!.returns, [0.828, 0.4 + 9, 1.0]);
  const sd = Math.sqrt((0.036 ** 2 * 2) / 1 + 1e-8);
  close(out[0]!.advantages, [-0.036 / sd, 0, 0.036 / sd], 1e-4);
});

test('properties: GRPO advantages of a group sum to zero; a masked-out token always gets 0', () => {
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let trial = 0; trial < 50; trial++) {
    const batch: EstimatorSample[] = [];
    for (let g = 0; g < 3; g++) {
      const n = 1 + Math.floor(rand() * 6);
      for (let i = 0; i < n; i++) {
        const len = 1 + Math.floor(rand() * 12);
        const mask = Array.from({ length: len }, () => (rand() < 0.7 ? 1 : 0));
        batch.push(s(`g${g}`, Math.round(rand() * 4) / 4, mask, { values: Array.from({ length: len }, () => rand()) }));
      }
    }
    const grpo = getEstimator('grpo')(batch, opts());
    for (const g of ['g0', 'g1', 'g2']) {
      // The scalar advantage of each member: its value on any token with mask 1 (members with none carry none).
      const members = batch.map((b, i) => ({ b, r: grpo[i]! })).filter(({ b }) => b.groupId === g);
      if (members.length < 2 || members.some(({ b }) => !Array.from(b.responseMask).includes(1))) continue;
      const total = members.reduce((acc, { b, r }) => acc + r.advantages[Array.from(b.responseMask).indexOf(1)]!, 0);
      assert.ok(Math.abs(total) < 1e-6, `group ${g} sums to ${total}`);
    }
    for (const name of estimatorNames()) {
      const out = getEstimator(name)(batch, opts({ gamma: 0.95, lam: 0.9 }));
      batch.forEach((b, i) => {
        for (let t = 0; t < b.responseMask.length; t++) {
          const v = out[i]!.advantages[t]!;
          assert.ok(Number.isFinite(v), `${name} gave ${v}`);
          if (!b.responseMask[t]) assert.equal(v, 0, `${name}: masked token ${t} of sample ${i} got ${v}`);
        }
      });
    }
  }
});

test('an unknown estimator names the known ones', () => {
  assert.throws(() => getEstimator('ppo2'), /unknown advantage estimator "ppo2" \(known: gae, grpo, grpo_no_std, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo\)/);
});
