// Gradient checks: native fp32 analytic gradients of every parameter tensor against central finite differences
// of the independent float64 reference (native/reference.ts), for cross-entropy and the policy losses (ppo, gspo,
// cispo) with each rollout-correction mode.
//
// Tolerance: float64 central differences with h = 1e-5 are accurate to ~1e-9 relative, so the gap measures
// the native gradient's fp32 rounding (~1e-6 relative) plus any bug. A tensor passes when
// ||g_native - g_fd|| / ||g_fd|| < 1e-3 and every element is within 1e-3 * max|g_fd| + 1e-3 * |g_fd|: a wrong
// term, index or sign moves whole tensors by O(1) relative, far beyond that.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Model, nativeAvailable, type ModelConfig, type PolicyLossInputs, type PolicyLossOptions } from '../../native/index.ts';
import { referenceCrossEntropy, referenceForward, referencePolicyLoss, toReferenceParams } from '../../native/reference.ts';
import { TINY, checkGradients as check, pack, randomSeqs, rng } from './helpers.ts';

const skip = nativeAvailable() ? false : 'native addon not built (npm run build:native)';

function setup(cfg: ModelConfig, lengths: number[], seed: number) {
  const model = Model.init(cfg, { seed, threads: 2, initStd: 0.4, logitChunkTokens: 4 });
  const data = pack(randomSeqs(rng(seed + 100), lengths, cfg.vocab_size));
  return { model, ...data };
}

test('cross-entropy gradients match finite differences (GQA, q/k/v bias, untied head, chunked logits)', { skip }, async () => {
  const { model, batch, targets, responseMask } = setup(TINY, [6, 4, 5], 7);
  responseMask[2] = 0; // a masked-out position inside a sequence
  await model.backwardCrossEntropy(batch, targets, responseMask, { lossScale: 0.7 });
  const params = toReferenceParams(model.parameters());
  check(model.gradients(), params, (p) => referenceCrossEntropy(TINY, p, batch, targets, responseMask, 0.7));
  model.dispose();
});

test('cross-entropy gradients match finite differences (tied embeddings, multi-head, no bias)', { skip }, async () => {
  const cfg: ModelConfig = { ...TINY, tie_word_embeddings: true, num_key_value_heads: 4, attention_bias: false, num_hidden_layers: 1 };
  const { model, batch, targets, responseMask } = setup(cfg, [9, 3], 8);
  await model.backwardCrossEntropy(batch, targets, responseMask);
  check(model.gradients(), toReferenceParams(model.parameters()), (p) => referenceCrossEntropy(cfg, p, batch, targets, responseMask));
  model.dispose();
});

test('cross-entropy gradients match finite differences (Qwen3 q/k norms, head_dim != hidden/heads, Llama 3.1 rope scaling)', { skip }, async () => {
  const cfg: ModelConfig = {
    ...TINY,
    model_type: 'qwen3',
    attention_bias: false,
    head_dim: 8,
    rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 },
  };
  const { model, batch, targets, responseMask } = setup(cfg, [7, 5], 21);
  await model.backwardCrossEntropy(batch, targets, responseMask);
  const names = [...model.gradients().keys()];
  assert.ok(names.includes('model.layers.1.self_attn.q_norm.weight') && names.includes('model.layers.1.self_attn.k_norm.weight'));
  check(model.gradients(), toReferenceParams(model.parameters()), (p) => referenceCrossEntropy(cfg, p, batch, targets, responseMask));
  model.dispose();
});

test('cross-entropy gradients match finite differences with sequences spanning several attention blocks', { skip }, async () => {
  // the CPU attention works on 64-row blocks: 150 and 70 tokens exercise full, partial and off-diagonal blocks
  const cfg: ModelConfig = { ...TINY, max_position_embeddings: 256, num_hidden_layers: 1 };
  const { model, batch, targets, responseMask } = setup(cfg, [150, 70], 13);
  await model.backwardCrossEntropy(batch, targets, responseMask);
  // the attention projections carry every attention block's gradient; the other tensors are covered above
  check(model.gradients(), toReferenceParams(model.parameters()), (p) => referenceCrossEntropy(cfg, p, batch, targets, responseMask), /self_attn\.[qkv]_proj\.weight/);
  model.dispose();
});

/** Inputs around the current policy so that some tokens clip, some are dual-clipped, some truncated. */
async function policyInputs(model: Model, d: ReturnType<typeof setup>, seed: number): Promise<PolicyLossInputs> {
  const r = rng(seed);
  const { logprobs } = await model.forward(d.batch, d.targets);
  const T = logprobs.length;
  const prox = new Float32Array(T);
  const behav = new Float32Array(T);
  const ref = new Float32Array(T);
  const adv = new Float32Array(T);
  for (let t = 0; t < T; t++) {
    if (d.responseMask[t] === 0) continue;
    prox[t] = logprobs[t]! + (r() - 0.5) * 0.8;
    behav[t] = prox[t]! + (r() - 0.5) * 2;
    ref[t] = logprobs[t]! + (r() - 0.5) * 1.5;
    adv[t] = (r() - 0.5) * 4;
  }
  return { targets: d.targets, responseMask: d.responseMask, advantages: adv, behaviourLogprobs: behav, proximalLogprobs: prox, refLogprobs: ref };
}

const VARIANTS: [string, PolicyLossOptions][] = [
  ['token-mean, dual clip, decoupled IW, k3 KL, entropy bonus', { clipLow: 0.2, clipHigh: 0.28, dualClipC: 3, iwCap: 2, klCoef: 0.1, klType: 'k3', entropyCoef: 0.01, aggregation: 'token-mean' }],
  ['seq-mean-token-sum, k1 KL, loss scale', { clipLow: 0.1, clipHigh: 0.1, iwCap: 1.5, klCoef: 0.05, klType: 'k1', aggregation: 'seq-mean-token-sum', lossScale: 0.5 }],
  ['seq-mean-token-mean, k2 KL, IW disabled', { clipLow: 0.2, clipHigh: 0.2, iwCap: null, klCoef: 0.2, klType: 'k2', entropyCoef: -0.02, aggregation: 'seq-mean-token-mean' }],
];

// The registry's other kernels and the rollout-correction modes. GSPO's clip is widened from the paper's 3e-4/4e-4
// so that with these inputs some sequences clip and some do not (at 4e-4 every sequence clips and only the KL
// term would be checked).
const LOSS_VARIANTS: [string, PolicyLossOptions][] = [
  ['gspo, seq-mean-token-mean, token truncate', { loss: 'gspo', clipLow: 0.05, clipHigh: 0.05, iwCap: 1.5, aggregation: 'seq-mean-token-mean' }],
  ['gspo, token-mean, sequence responseMask, k3 KL', { loss: 'gspo', clipLow: 0.05, clipHigh: 0.05, correction: { mode: 'mask', level: 'sequence', low: 0.2, high: 5 }, klCoef: 0.1, aggregation: 'token-mean' }],
  ['cispo, no lower bound, token mask', { loss: 'cispo', clipLow: 1, clipHigh: 0.2, correction: { mode: 'mask', low: 0.5, high: 2 }, aggregation: 'token-mean' }],
  ['cispo, seq-mean-token-sum, sequence truncate, entropy bonus', { loss: 'cispo', clipLow: 0.2, clipHigh: 0.28, correction: { mode: 'truncate', level: 'sequence', cap: 1.2 }, entropyCoef: 0.01, aggregation: 'seq-mean-token-sum' }],
  ['ppo, sequence truncate, dual clip', { clipLow: 0.2, clipHigh: 0.28, dualClipC: 3, correction: { mode: 'truncate', level: 'sequence', cap: 1.2 } }],
];

const CASES: [string, PolicyLossOptions, number[]][] = [...VARIANTS.map(([l, o]): [string, PolicyLossOptions, number[]] => [l, o, [7, 5]]), ...LOSS_VARIANTS.map(([l, o]): [string, PolicyLossOptions, number[]] => [l, o, [7, 5, 6]])];

for (const [label, options, lengths] of CASES) {
  test(`policy loss gradients match finite differences (${label})`, { skip }, async () => {
    const d = setup(TINY, lengths, 11);
    const inputs = await policyInputs(d.model, d, 5);
    const metrics = await d.model.backwardPolicyLoss(d.batch, inputs, options);
    if (lengths.length === 3) {
      // not vacuous: each check has clipped and unclipped tokens, corrected and uncorrected ones
      assert.ok(metrics.clipFraction > 0 && metrics.clipFraction < 1, `clip fraction ${metrics.clipFraction}`);
      const corrected = metrics.iwTruncatedFraction + metrics.iwMaskedFraction;
      assert.ok(corrected > 0 && corrected < 1, `truncated or masked fraction ${corrected}`);
    }
    const params = toReferenceParams(d.model.parameters());
    // CISPO's clipped weight is a stop-gradient factor: finite differences probe it held at the base point.
    const detached = referenceForward(TINY, params, d.batch, inputs.targets).logprobs;
    const refLoss = referencePolicyLoss(TINY, params, d.batch, inputs, options);
    assert.ok(Math.abs(metrics.loss - refLoss) < 1e-5 * Math.max(1, Math.abs(refLoss)), `loss ${metrics.loss} vs reference ${refLoss}`);
    check(d.model.gradients(), params, (p) => referencePolicyLoss(TINY, p, d.batch, inputs, options, detached));
    d.model.dispose();
  });
}

test('reference forward is consistent with itself under packing (sanity of the checker)', { skip }, () => {
  const d = setup(TINY, [4, 4], 3);
  const p = toReferenceParams(d.model.parameters());
  const both = referenceForward(TINY, p, d.batch, d.targets).logprobs;
  const first = pack([Array.from(d.batch.tokens.subarray(0, 4))]);
  const alone = referenceForward(TINY, p, first.batch, first.targets).logprobs;
  for (let t = 0; t < 4; t++) assert.ok(Math.abs(both[t]! - alone[t]!) < 1e-12);
  d.model.dispose();
});
