// The registry's kernels beyond their gradient checks: each rollout-correction mode reports exactly the fraction
// of tokens it truncated or masked (per token, and per sequence where one weight covers a whole sequence), and the
// losses differ where they are meant to: CISPO keeps a gradient on tokens PPO's clip silences, and GSPO clips
// whole sequences.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Model, nativeAvailable, type PolicyLossInputs, type PolicyLossOptions } from '../../native/index.ts';
import { TINY, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';

async function fixture(seed: number, spread: number) {
  const model = Model.init(TINY, { seed, threads: 2, initStd: 0.3 });
  const d = pack(randomSeqs(rng(seed + 10), [9, 6, 12, 4], TINY.vocab_size));
  const { logprobs } = await model.forward(d.batch, d.targets);
  const r = rng(seed + 20);
  const prox = logprobs.map((x) => x + (r() - 0.5) * 0.4);
  const behav = prox.map((x) => x + (r() - 0.5) * spread);
  const adv = logprobs.map(() => r() - 0.5);
  for (let t = 0; t < logprobs.length; t++) if (!d.responseMask[t]) prox[t] = behav[t] = adv[t] = 0;
  const inputs: PolicyLossInputs = { targets: d.targets, responseMask: d.responseMask, advantages: adv, behaviourLogprobs: behav, proximalLogprobs: prox };
  return { model, d, inputs, logprobs };
}

/** Fraction of masked tokens whose correction weight (token, or sequence = product) satisfies `hit`. */
function fraction(inputs: PolicyLossInputs, seqStarts: Int32Array, level: 'token' | 'sequence', hit: (w: number) => boolean): number {
  let n = 0;
  let k = 0;
  for (let s = 0; s + 1 < seqStarts.length; s++) {
    let seqLog = 0;
    for (let t = seqStarts[s]!; t < seqStarts[s + 1]!; t++) seqLog += inputs.responseMask[t]! * (inputs.proximalLogprobs![t]! - inputs.behaviourLogprobs[t]!);
    for (let t = seqStarts[s]!; t < seqStarts[s + 1]!; t++) {
      if (!inputs.responseMask[t]) continue;
      n++;
      const w = Math.exp(level === 'token' ? inputs.proximalLogprobs![t]! - inputs.behaviourLogprobs[t]! : seqLog);
      if (hit(w)) k++;
    }
  }
  return k / n;
}

test('each correction mode reports the fraction of tokens it truncated or masked, per token and per sequence', { skip }, async () => {
  const { model, d, inputs } = await fixture(3, 1.5);
  const cases: [PolicyLossOptions['correction'] & object, 'truncate' | 'mask', (w: number) => boolean][] = [
    [{ mode: 'truncate', level: 'token', cap: 1.3 }, 'truncate', (w) => w > 1.3],
    [{ mode: 'truncate', level: 'sequence', cap: 2 }, 'truncate', (w) => w > 2],
    [{ mode: 'mask', level: 'token', low: 0.7, high: 1.4 }, 'mask', (w) => w < 0.7 || w > 1.4],
    [{ mode: 'mask', level: 'sequence', low: 0.2, high: 5 }, 'mask', (w) => w < 0.2 || w > 5],
  ];
  for (const [correction, kind, hit] of cases) {
    const m = await model.backwardPolicyLoss(d.batch, inputs, { clipLow: 0.2, clipHigh: 0.2, correction });
    const expected = fraction(inputs, d.batch.seqStarts, correction.mode === 'off' ? 'token' : (correction.level ?? 'token'), hit);
    assert.ok(expected > 0 && expected < 1, `fixture: ${JSON.stringify(correction)} should hit some tokens, not all (${expected})`);
    const got = kind === 'truncate' ? m.iwTruncatedFraction : m.iwMaskedFraction;
    const other = kind === 'truncate' ? m.iwMaskedFraction : m.iwTruncatedFraction;
    assert.ok(Math.abs(got - expected) < 1e-9, `${JSON.stringify(correction)}: ${got} vs ${expected}`);
    assert.equal(other, 0);
  }
  // A masked sequence contributes nothing: masking every sequence leaves no policy gradient at all.
  model.zeroGrad();
  const all = await model.backwardPolicyLoss(d.batch, inputs, { clipLow: 0.2, clipHigh: 0.2, correction: { mode: 'mask', level: 'sequence', low: 1e6, high: 1e7 } });
  assert.ok(Math.abs(all.iwMaskedFraction - 1) < 1e-12);
  assert.equal(all.pgLoss, 0);
  assert.equal(model.gradNorm(), 0);
  model.dispose();
});

test("CISPO keeps a gradient on tokens PPO's clip silences; GSPO clips whole sequences", { skip }, async () => {
  // Every ratio pi/pi_prox far above 1 + clipHigh with a positive advantage: PPO's clipped term is constant.
  const { model, d, inputs, logprobs } = await fixture(5, 0);
  const prox = logprobs.map((x, t) => (d.responseMask[t] ? x - 1 : 0));
  const adv = logprobs.map((_, t) => (d.responseMask[t] ? 1 : 0));
  const far: PolicyLossInputs = { ...inputs, advantages: adv, proximalLogprobs: prox, behaviourLogprobs: prox };
  const ppo = await model.backwardPolicyLoss(d.batch, far, { clipLow: 0.2, clipHigh: 0.2 });
  assert.ok(Math.abs(ppo.clipFraction - 1) < 1e-12);
  assert.equal(model.gradNorm(), 0, 'PPO: no gradient through clipped tokens');
  model.zeroGrad();
  const cispo = await model.backwardPolicyLoss(d.batch, far, { loss: 'cispo', clipLow: 1, clipHigh: 0.2 });
  assert.ok(Math.abs(cispo.clipFraction - 1) < 1e-12);
  assert.ok(model.gradNorm() > 0, 'CISPO: the clipped weight still multiplies a gradient');
  model.zeroGrad();
  // GSPO on the same inputs: each sequence's ratio is e^1, so every sequence clips and the surrogate is flat.
  const gspo = await model.backwardPolicyLoss(d.batch, far, { loss: 'gspo', clipLow: 0.2, clipHigh: 0.2 });
  assert.ok(Math.abs(gspo.clipFraction - 1) < 1e-12);
  assert.equal(model.gradNorm(), 0);
  model.dispose();
});
