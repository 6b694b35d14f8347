// Trainer options with documented defaults, compiled once at start-up into a frozen, fully specified
// object; every validation message names the config field.
import { Type } from '@sinclair/typebox';
import { RlstreamError } from '../../core/errors.ts';
import { numberOrNull, oneOf } from '../../core/config/validate.ts';

export interface TrainerOptions {
  /** Max policy-version lag of a sample's oldest token at intake; older samples are dropped and counted. */
  stalenessBound: number;
  /** Groups per optimizer step (trajectories per step = groups × group size). */
  groupsPerStep: number;
  /** Token budget of one packed micro-batch (gradient accumulation beyond it). */
  maxTokensPerMicroBatch: number;
  /** Mini-batches per step (one optimizer update each) and passes over the step's samples. */
  miniBatches: number;
  ppoEpochs: number;
  learningRate: number;
  beta1: number;
  beta2: number;
  adamEps: number;
  weightDecay: number;
  gradClip: number;
  clipLow: number;
  clipHigh: number;
  /** Dual-clip constant c > 1, or null to disable. */
  dualClipC: number | null;
  /** Truncation C of the decoupled importance weight π_prox/π_behaviour, or null for plain PPO. */
  iwCap: number | null;
  klCoef: number;
  klType: 'k1' | 'k2' | 'k3';
  entropyCoef: number;
  aggregation: 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean';
  /** Publish a PolicyVersion every k steps. */
  publishEvery: number;
  /** Stop after this many steps (0 = unbounded). */
  maxSteps: number;
  /** Checkpoints kept on disk. */
  keepCheckpoints: number;
  threads: number;
}

export const TRAINER_DEFAULTS: TrainerOptions = Object.freeze({
  stalenessBound: 2,
  groupsPerStep: 8,
  maxTokensPerMicroBatch: 4096,
  miniBatches: 1,
  ppoEpochs: 1,
  learningRate: 1e-4,
  beta1: 0.9,
  beta2: 0.999,
  adamEps: 1e-8,
  weightDecay: 0,
  gradClip: 1.0,
  clipLow: 0.2,
  clipHigh: 0.28,
  dualClipC: 3,
  iwCap: 2,
  klCoef: 0,
  klType: 'k3',
  entropyCoef: 0,
  aggregation: 'token-mean',
  publishEvery: 1,
  maxSteps: 0,
  keepCheckpoints: 2,
  threads: 1,
});

const SNAKE: Record<keyof TrainerOptions, string> = {
  stalenessBound: 'staleness_bound',
  groupsPerStep: 'groups_per_step',
  maxTokensPerMicroBatch: 'max_tokens_per_micro_batch',
  miniBatches: 'mini_batches',
  ppoEpochs: 'ppo_epochs',
  learningRate: 'learning_rate',
  beta1: 'beta1',
  beta2: 'beta2',
  adamEps: 'adam_eps',
  weightDecay: 'weight_decay',
  gradClip: 'grad_clip',
  clipLow: 'clip_low',
  clipHigh: 'clip_high',
  dualClipC: 'dual_clip_c',
  iwCap: 'iw_cap',
  klCoef: 'kl_coef',
  klType: 'kl_type',
  entropyCoef: 'entropy_coef',
  aggregation: 'aggregation',
  publishEvery: 'publish_every',
  maxSteps: 'max_steps',
  keepCheckpoints: 'keep_checkpoints',
  threads: 'threads',
};

function fail(path: string, msg: string): never {
  throw new RlstreamError('CONFIG_INVALID', `${path} ${msg}`);
}

/** Compile the `trainer` section of a run config (snake_case keys) into TrainerOptions. */
export function compileTrainerOptions(raw: unknown, path = 'trainer'): TrainerOptions {
  if (raw === undefined || raw === null) return TRAINER_DEFAULTS;
  if (typeof raw !== 'object' || Array.isArray(raw)) fail(path, 'must be a mapping');
  const input = raw as Record<string, unknown>;
  const known = new Set(Object.values(SNAKE));
  for (const k of Object.keys(input)) if (!known.has(k)) fail(`${path}.${k}`, `is not a trainer option (known: ${[...known].join(', ')})`);
  const out: Record<string, unknown> = { ...TRAINER_DEFAULTS };
  for (const [camel, snake] of Object.entries(SNAKE) as [keyof TrainerOptions, string][]) {
    if (input[snake] !== undefined) out[camel] = input[snake];
  }
  const o = out as unknown as TrainerOptions;
  const p = (k: keyof TrainerOptions) => `${path}.${SNAKE[k]}`;
  const intAtLeast = (k: keyof TrainerOptions, min: number) => {
    const v = o[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min) fail(p(k), `must be an integer >= ${min} (got ${JSON.stringify(v)})`);
  };
  const positive = (k: keyof TrainerOptions) => {
    const v = o[k];
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) fail(p(k), `must be a positive number (got ${JSON.stringify(v)})`);
  };
  const nonNegative = (k: keyof TrainerOptions) => {
    const v = o[k];
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) fail(p(k), `must be a number >= 0 (got ${JSON.stringify(v)})`);
  };
  intAtLeast('stalenessBound', 0);
  intAtLeast('groupsPerStep', 1);
  intAtLeast('maxTokensPerMicroBatch', 16);
  intAtLeast('miniBatches', 1);
  intAtLeast('ppoEpochs', 1);
  intAtLeast('publishEvery', 1);
  intAtLeast('maxSteps', 0);
  intAtLeast('keepCheckpoints', 1);
  intAtLeast('threads', 1);
  for (const k of ['learningRate', 'adamEps', 'gradClip'] as const) positive(k);
  for (const k of ['weightDecay', 'clipLow', 'clipHigh', 'klCoef', 'entropyCoef'] as const) nonNegative(k);
  for (const k of ['beta1', 'beta2'] as const) if (!(o[k] >= 0 && o[k] < 1)) fail(p(k), 'must be in [0, 1)');
  if (o.dualClipC !== null && !(typeof o.dualClipC === 'number' && o.dualClipC > 1)) fail(p('dualClipC'), 'must be a number > 1 or null');
  if (o.iwCap !== null && !(typeof o.iwCap === 'number' && o.iwCap >= 1)) fail(p('iwCap'), 'must be a number >= 1 or null');
  if (!['k1', 'k2', 'k3'].includes(o.klType)) fail(p('klType'), 'must be one of k1, k2, k3');
  if (!['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean'].includes(o.aggregation)) fail(p('aggregation'), 'must be one of token-mean, seq-mean-token-sum, seq-mean-token-mean');
  return Object.freeze(o);
}

const d = TRAINER_DEFAULTS;

/**
 * The `trainer:` section of a run config: the same keys, defaults and ranges as compileTrainerOptions.
 * staleness_bound is the run's one staleness bound: the rollout workers' gate takes it from here too.
 */
export const TrainerSection = Type.Object(
  {
    staleness_bound: Type.Integer({ minimum: 0, default: d.stalenessBound, description: "The run's staleness bound: the most policy versions a sample's oldest token may lag the trainer's version when it is trained. Rollout workers hold back new groups that would exceed it; the trainer drops (and counts) older samples. Changed during a run by the control command set_staleness." }),
    groups_per_step: Type.Integer({ minimum: 1, default: d.groupsPerStep, description: 'Groups per optimizer step (trajectories per step = groups × rollout.n); also sizes the rollout gate.' }),
    max_tokens_per_micro_batch: Type.Integer({ minimum: 16, default: d.maxTokensPerMicroBatch, description: 'Token budget of one packed micro-batch (gradient accumulation beyond it).' }),
    mini_batches: Type.Integer({ minimum: 1, default: d.miniBatches, description: 'Mini-batches per step (one optimizer update each).' }),
    ppo_epochs: Type.Integer({ minimum: 1, default: d.ppoEpochs, description: "Passes over the step's samples." }),
    learning_rate: Type.Number({ exclusiveMinimum: 0, default: d.learningRate, description: 'AdamW learning rate.' }),
    beta1: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: d.beta1, description: 'AdamW beta1.' }),
    beta2: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: d.beta2, description: 'AdamW beta2.' }),
    adam_eps: Type.Number({ exclusiveMinimum: 0, default: d.adamEps, description: 'AdamW epsilon.' }),
    weight_decay: Type.Number({ minimum: 0, default: d.weightDecay, description: 'AdamW weight decay.' }),
    grad_clip: Type.Number({ exclusiveMinimum: 0, default: d.gradClip, description: 'Gradient norm clip.' }),
    clip_low: Type.Number({ minimum: 0, default: d.clipLow, description: 'PPO ratio clip below 1 (1 - clip_low).' }),
    clip_high: Type.Number({ minimum: 0, default: d.clipHigh, description: 'PPO ratio clip above 1 (1 + clip_high; DAPO clip-higher).' }),
    dual_clip_c: numberOrNull({ exclusiveMinimum: 1, default: d.dualClipC, description: 'Dual-clip constant c > 1 for negative advantages (null: off).' }),
    iw_cap: numberOrNull({ minimum: 1, default: d.iwCap, description: 'Truncation of the decoupled importance weight π_prox/π_behaviour (null: plain PPO).' }),
    kl_coef: Type.Number({ minimum: 0, default: d.klCoef, description: 'KL penalty to the warm-start policy (0: off, no reference model kept).' }),
    kl_type: oneOf(['k1', 'k2', 'k3'] as const, { default: d.klType, description: 'KL estimator.' }),
    entropy_coef: Type.Number({ minimum: 0, default: d.entropyCoef, description: 'Entropy bonus coefficient.' }),
    aggregation: oneOf(['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean'] as const, { default: d.aggregation, description: 'How per-token losses are reduced.' }),
    publish_every: Type.Integer({ minimum: 1, default: d.publishEvery, description: 'Publish a policy version every k steps.' }),
    max_steps: Type.Integer({ minimum: 0, default: d.maxSteps, description: 'Stop after this many steps (0: unbounded).' }),
    keep_checkpoints: Type.Integer({ minimum: 1, default: d.keepCheckpoints, description: 'Checkpoints kept on disk.' }),
    threads: Type.Integer({ minimum: 1, default: d.threads, description: 'Native core threads.' }),
  },
  { additionalProperties: false, default: {}, description: 'The trainer (asynchronous PPO on the native core).' },
);
