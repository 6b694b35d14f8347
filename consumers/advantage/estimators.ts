// Advantage estimators, registered by name with one signature, following verl's core_algos semantics
// (verl/trainer/ppo/core_algos.py). A batch is a list of samples; samples sharing a groupId are one prompt's
// group. Shapes: every per-token array has the sample's response length L_i (no padding: ragged batches).
// Where verl and rlstream differ on purpose, the function says so.
import { Type, type TObject, type TProperties } from '@sinclair/typebox';
import { Registry, type RegistryShape } from '../../core/config/registry.ts';
import { compileValue } from '../../core/config/validate.ts';
import { RlstreamError } from '../../core/errors.ts';

export interface EstimatorSample {
  groupId: string;
  /** The scalar reward (RewardInfo.score). */
  score: number;
  /** 1 for tokens the policy generated, 0 for tool / user tokens. */
  responseMask: ArrayLike<number>;
  /** Per-token rewards; when absent the score sits on the last token whose mask is 1. */
  tokenRewards?: ArrayLike<number> | null;
  /** Value estimates per token (GAE); 0 when absent. The pipeline has no critic (its GAE runs on values 0); `rlstream advantage` rows may carry them. */
  values?: ArrayLike<number> | null;
}

export interface EstimatorOptions {
  /** Discount (GAE, REINFORCE++). Default 1. */
  gamma: number;
  /** GAE lambda. Default 1. */
  lam: number;
  /** Added to the group std before dividing (GRPO). Default 1e-6. */
  epsilon: number;
  /** GRPO divides by the group std; false gives Dr.GRPO (as grpo_no_std). Default true. */
  normByStd: boolean;
}

export interface EstimatorResult {
  advantages: Float64Array;
  returns: Float64Array;
}

export type Estimator = (batch: readonly EstimatorSample[], options: EstimatorOptions) => EstimatorResult[];

/**
 * Every option an estimator may read, as written in its `advantage.<name>` section, each with its one default (the
 * docs and DEFAULT_ESTIMATOR_OPTIONS come from here).
 */
const OPTION_SCHEMAS = {
  gamma: Type.Number({ minimum: 0, maximum: 1, default: 1, description: 'Discount.' }),
  lam: Type.Number({ minimum: 0, maximum: 1, default: 1, description: 'GAE lambda.' }),
  epsilon: Type.Number({ exclusiveMinimum: 0, default: 1e-6, description: 'Added to the group std before dividing.' }),
  norm_by_std: Type.Boolean({ default: true, description: 'Divide by the group std (false: Dr.GRPO, as grpo_no_std).' }),
} as const;

export type EstimatorOptionKey = keyof typeof OPTION_SCHEMAS;

export const DEFAULT_ESTIMATOR_OPTIONS: EstimatorOptions = Object.freeze({
  gamma: OPTION_SCHEMAS.gamma.default,
  lam: OPTION_SCHEMAS.lam.default,
  epsilon: OPTION_SCHEMAS.epsilon.default,
  normByStd: OPTION_SCHEMAS.norm_by_std.default,
});

/** A registered estimator: the function, its section's schema (the options it reads) and their compilation. */
export interface RegisteredEstimator {
  estimate: Estimator;
  /** The `advantage.<name>` section: the options the estimator reads, snake_case with defaults. */
  options: TObject;
  /** The section (validated, defaults filled) as EstimatorOptions; options it does not read keep their defaults. */
  compile(section: unknown, path: string): EstimatorOptions;
}

const shape: RegistryShape<RegisteredEstimator> = {
  description: 'an object { estimate, options, compile } (registerEstimator(name, fn, reads) makes one)',
  accept: (v) => {
    const e = v as Partial<RegisteredEstimator> | null;
    return e && typeof e === 'object' && typeof e.estimate === 'function' && typeof e.compile === 'function' && e.options !== undefined ? (e as RegisteredEstimator) : null;
  },
};

/** Estimators by name (`advantage.estimator`, its options `advantage.<name>`), as the policy losses are registered. */
export const estimators = new Registry<RegisteredEstimator>('advantage estimator', shape);

/** Register an estimator that reads the options `reads` (its `advantage.<name>` section offers those keys only). */
export function registerEstimator(name: string, estimate: Estimator, reads: readonly EstimatorOptionKey[] = []): void {
  const properties: TProperties = Object.fromEntries(reads.map((k) => [k, OPTION_SCHEMAS[k]]));
  const options = Type.Object(properties, { additionalProperties: false, default: {}, description: `Options of the ${name} estimator${reads.length ? '' : ' (it reads none)'}.` });
  estimators.register(name, {
    estimate,
    options,
    compile: (section, path) => {
      const v = compileValue(options, section ?? {}, path) as Partial<Record<EstimatorOptionKey, number | boolean>>;
      const d = DEFAULT_ESTIMATOR_OPTIONS;
      return Object.freeze({ gamma: (v.gamma as number | undefined) ?? d.gamma, lam: (v.lam as number | undefined) ?? d.lam, epsilon: (v.epsilon as number | undefined) ?? d.epsilon, normByStd: (v.norm_by_std as boolean | undefined) ?? d.normByStd });
    },
  });
}

export function getEstimator(name: string): Estimator {
  return estimators.get(name, 'advantage.estimator').estimate;
}

export function estimatorNames(): string[] {
  return estimators.names();
}

// ---------------------------------------------------------------------------------------------- helpers

/** Group members' indexes by groupId, in first-seen order. */
function groupsOf(batch: readonly EstimatorSample[]): number[][] {
  const byId = new Map<string, number[]>();
  batch.forEach((s, i) => {
    const g = byId.get(s.groupId);
    if (g) g.push(i);
    else byId.set(s.groupId, [i]);
  });
  return [...byId.values()];
}

export function mean(xs: readonly number[]): number {
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Unbiased (n - 1) standard deviation, as torch.std; 0 for fewer than two values. */
export function stdUnbiased(xs: readonly number[]): number {
  if (xs.length < 2) return 0;
  const m = mean(xs);
  let s = 0;
  for (const x of xs) s += (x - m) * (x - m);
  return Math.sqrt(s / (xs.length - 1));
}

/** Scalar advantage per sample broadcast over its tokens, 0 where the mask is 0; returns = advantages. */
function broadcast(batch: readonly EstimatorSample[], scalars: number[]): EstimatorResult[] {
  return batch.map((s, i) => {
    const a = new Float64Array(s.responseMask.length);
    const v = scalars[i]!;
    for (let t = 0; t < a.length; t++) a[t] = s.responseMask[t] ? v : 0;
    return { advantages: a, returns: a };
  });
}

/** The per-token rewards of a sample: given, or the score on the last token with mask 1. */
export function tokenLevelRewards(s: EstimatorSample): Float64Array {
  const r = new Float64Array(s.responseMask.length);
  if (s.tokenRewards) {
    if (s.tokenRewards.length !== r.length) throw new RlstreamError('INPUT_INVALID', `token_rewards has ${s.tokenRewards.length} entries for ${r.length} tokens`);
    for (let t = 0; t < r.length; t++) r[t] = s.tokenRewards[t]!;
    return r;
  }
  for (let t = r.length - 1; t >= 0; t--) {
    if (s.responseMask[t]) {
      r[t] = s.score;
      break;
    }
  }
  return r;
}

/**
 * verl_F.masked_whiten over every masked token of the batch: (x - mean) / sqrt(var + 1e-8) with the masked,
 * Bessel-corrected variance; then multiplied by the mask (verl's GAE leaves whitened values on mask-0
 * positions; rlstream's contract is advantage 0 where the mask is 0).
 */
export function maskedWhiten(values: Float64Array[], masks: ArrayLike<number>[]): Float64Array[] {
  let n = 0;
  let sum = 0;
  values.forEach((v, i) => {
    const m = masks[i]!;
    for (let t = 0; t < v.length; t++) if (m[t]) {
      n++;
      sum += v[t]!;
    }
  });
  if (n === 0) return values.map((v) => new Float64Array(v.length));
  const mu = sum / n;
  let sq = 0;
  values.forEach((v, i) => {
    const m = masks[i]!;
    for (let t = 0; t < v.length; t++) if (m[t]) sq += (v[t]! - mu) * (v[t]! - mu);
  });
  // verl divides by n - 1 and fails on a single token; one token has no spread, so its variance is 0 here.
  const variance = n > 1 ? sq / (n - 1) : 0;
  const scale = 1 / Math.sqrt(variance + 1e-8);
  return values.map((v, i) => {
    const m = masks[i]!;
    const out = new Float64Array(v.length);
    for (let t = 0; t < v.length; t++) out[t] = m[t] ? (v[t]! - mu) * scale : 0;
    return out;
  });
}

// ------------------------------------------------------------------------------------------- estimators

/** GRPO (arXiv:2402.03300): (r - group mean) / (unbiased group std + eps); a group of one: mean 0, std 1. */
export const grpo: Estimator = (batch, { epsilon, normByStd }) => {
  const scalars = new Array<number>(batch.length);
  for (const g of groupsOf(batch)) {
    const rs = g.map((i) => batch[i]!.score);
    const [m, sd] = g.length === 1 ? [0, 1] : [mean(rs), stdUnbiased(rs)];
    for (const i of g) scalars[i] = normByStd ? (batch[i]!.score - m) / (sd + epsilon) : batch[i]!.score - m;
  }
  return broadcast(batch, scalars);
};

/** Dr.GRPO (arXiv:2503.20783): GRPO without the division by the std. */
export const grpoNoStd: Estimator = (batch) => {
  const scalars = new Array<number>(batch.length);
  for (const g of groupsOf(batch)) {
    const m = g.length === 1 ? 0 : mean(g.map((i) => batch[i]!.score));
    for (const i of g) scalars[i] = batch[i]!.score - m;
  }
  return broadcast(batch, scalars);
};

/** RLOO (arXiv:2402.14740): r minus the mean of the others = (r - mean) * n / (n - 1); a group of one: r. */
export const rloo: Estimator = (batch) => {
  const scalars = new Array<number>(batch.length);
  for (const g of groupsOf(batch)) {
    const n = g.length;
    const m = mean(g.map((i) => batch[i]!.score));
    for (const i of g) scalars[i] = n > 1 ? (batch[i]!.score * n) / (n - 1) - (m * n) / (n - 1) : batch[i]!.score;
  }
  return broadcast(batch, scalars);
};

/**
 * REINFORCE++ (arXiv:2501.03262): discounted token-level returns, whitened over the batch's masked tokens.
 * verl resets the running return at every mask-0 token (meant for padding after EOS); in multi-turn
 * trajectories tool tokens have mask 0 too, and the reset would cut the outcome off from earlier turns, so
 * here mask-0 tokens are skipped (carried through, as verl's GAE does for observation tokens). For
 * single-turn responses both give identical results.
 */
export const reinforcePlusPlus: Estimator = (batch, { gamma }) => {
  const returns = batch.map((s) => {
    const r = tokenLevelRewards(s);
    const out = new Float64Array(r.length);
    let running = 0;
    for (let t = r.length - 1; t >= 0; t--) {
      if (!s.responseMask[t]) continue;
      running = r[t]! + gamma * running;
      out[t] = running;
    }
    return out;
  });
  const adv = maskedWhiten(returns, batch.map((s) => s.responseMask));
  return batch.map((_, i) => ({ advantages: adv[i]!, returns: returns[i]! }));
};

/** REINFORCE++-baseline: score minus its group's mean (a group of one: mean 0), whitened over the batch. */
export const reinforcePlusPlusBaseline: Estimator = (batch) => {
  const scalars = new Array<number>(batch.length);
  for (const g of groupsOf(batch)) {
    const m = g.length === 1 ? 0 : mean(g.map((i) => batch[i]!.score));
    for (const i of g) scalars[i] = batch[i]!.score - m;
  }
  const tiled = broadcast(batch, scalars).map((r) => r.advantages);
  const adv = maskedWhiten(tiled, batch.map((s) => s.responseMask));
  return adv.map((a) => ({ advantages: a, returns: a }));
};

/**
 * GAE (arXiv:1506.02438) as verl computes it: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t +
 * gamma lambda A_{t+1}, with mask-0 (observation) tokens skipped; returns = A + V before whitening; the
 * advantages are then whitened over the batch's masked tokens.
 */
export const gae: Estimator = (batch, { gamma, lam }) => {
  const raw: Float64Array[] = [];
  const rets: Float64Array[] = [];
  for (const s of batch) {
    const r = tokenLevelRewards(s);
    const L = r.length;
    const v = new Float64Array(L);
    if (s.values) {
      if (s.values.length !== L) throw new RlstreamError('INPUT_INVALID', `values has ${s.values.length} entries for ${L} tokens`);
      for (let t = 0; t < L; t++) v[t] = s.values[t]!;
    }
    const adv = new Float64Array(L);
    let nextValue = 0;
    let lastGae = 0;
    for (let t = L - 1; t >= 0; t--) {
      const m = s.responseMask[t] ? 1 : 0;
      const delta = r[t]! + gamma * nextValue - v[t]!;
      const g = delta + gamma * lam * lastGae;
      nextValue = m ? v[t]! : nextValue;
      lastGae = m ? g : lastGae;
      adv[t] = lastGae;
    }
    const ret = new Float64Array(L);
    for (let t = 0; t < L; t++) ret[t] = adv[t]! + v[t]!;
    raw.push(adv);
    rets.push(ret);
  }
  const adv = maskedWhiten(raw, batch.map((s) => s.responseMask));
  return batch.map((_, i) => ({ advantages: adv[i]!, returns: rets[i]! }));
};

registerEstimator('grpo', grpo, ['epsilon', 'norm_by_std']);
registerEstimator('grpo_no_std', grpoNoStd);
registerEstimator('rloo', rloo);
registerEstimator('reinforce_plus_plus', reinforcePlusPlus, ['gamma']);
registerEstimator('reinforce_plus_plus_baseline', reinforcePlusPlusBaseline);
registerEstimator('gae', gae, ['gamma', 'lam']);
