// Trainer options with documented defaults: the `trainer:` section's schema (keys, ranges, defaults, meaning)
// and its compilation into a frozen, fully specified TrainerOptions; every validation message names the field.
import { Type } from '@sinclair/typebox';
import { compileValue, ConfigError, oneOf } from '../../core/config/validate.ts';
import { DEFAULT_STALENESS_BOUND } from '../../core/staleness.ts';
import { compilePolicyLossOptions, LORA_TARGETS, POLICY_LOSS_DEFAULTS, type CompiledPolicyLossOptions, type DeviceKind, type LoraTarget, type Recompute, type RolloutCorrection } from '../../native/index.ts';
import { policyLosses, type PolicyLossClip } from './policy-losses.ts';
import { compileDataParallel, DATA_PARALLEL_DEFAULTS, DataParallelSection, DevicesSchema, type DataParallelConfig } from './parallel/options.ts';
import { LR_SCHEDULES, type LrSchedule } from './lr-schedule.ts';

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
  /** The learning rate over the run's steps (learningRate is its peak); decays span maxSteps. */
  lrSchedule: LrSchedule;
  beta1: number;
  beta2: number;
  adamEps: number;
  weightDecay: number;
  gradClip: number;
  /** The policy loss (trainer.policy_loss, a policyLosses entry) and its options (trainer.<name>). */
  policyLoss: { name: string } & PolicyLossClip;
  /** Correction of the behaviour-vs-proximal mismatch (decoupled importance weight π_prox/π_behaviour). */
  rolloutCorrection: RolloutCorrection;
  klCoef: number;
  klType: 'k1' | 'k2' | 'k3';
  entropyCoef: number;
  aggregation: 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean';
  /** The native loss options of the fields above, compiled once at start-up (a micro-batch only scales them: withLossScale). */
  lossOptions: CompiledPolicyLossOptions;
  /** Publish a PolicyVersion every k steps. */
  publishEvery: number;
  /** Stop after this many steps (0 = unbounded). */
  maxSteps: number;
  /** Checkpoints kept on disk. */
  keepCheckpoints: number;
  /** Policy versions whose weights stay in the store besides those still needed (see Trainer.pruneWeights). */
  keepVersions: number;
  threads: number;
  /** Where the trainer's model runs (and the main job's SFT warm start); 'cuda' is checked at start-up (device.ts). */
  device: DeviceKind;
  /** trainer.devices and trainer.data_parallel (parallel/options.ts). */
  dataParallel: DataParallelConfig;
  /** Low-rank adapters (trainer.lora): only they train, the model's weights stay frozen; null: every weight trains. */
  lora: { rank: number; alpha: number; dropout: number; targets: readonly LoraTarget[] } | null;
  /** Activation recomputation (trainer.recompute): 'layer' keeps one layer's activations and recomputes the rest. */
  recompute: Recompute;
}

// The schema's defaults. The policy loss's own options have theirs in its registry entry (policy-losses.ts), the
// options every loss shares in native/model.ts (POLICY_LOSS_DEFAULTS), the staleness bound in core/staleness.ts.
const TRAINER_DEFAULTS = Object.freeze({
  stalenessBound: DEFAULT_STALENESS_BOUND,
  groupsPerStep: 8,
  maxTokensPerMicroBatch: 4096,
  miniBatches: 1,
  ppoEpochs: 1,
  learningRate: 1e-4,
  lrSchedule: Object.freeze({ name: 'constant' as const, learningRate: 1e-4, warmupSteps: 0, totalSteps: 0, minLrRatio: 0 }),
  beta1: 0.9,
  beta2: 0.999,
  adamEps: 1e-8,
  weightDecay: 0,
  gradClip: 1.0,
  policyLoss: POLICY_LOSS_DEFAULTS.loss,
  klCoef: POLICY_LOSS_DEFAULTS.klCoef,
  klType: POLICY_LOSS_DEFAULTS.klType,
  entropyCoef: POLICY_LOSS_DEFAULTS.entropyCoef,
  aggregation: POLICY_LOSS_DEFAULTS.aggregation,
  publishEvery: 1,
  maxSteps: 0,
  keepCheckpoints: 2,
  keepVersions: 2,
  threads: 1,
  device: 'cpu' as DeviceKind,
  dataParallel: DATA_PARALLEL_DEFAULTS,
  lora: null,
  recompute: 'none' as Recompute,
});

/** Compile the `trainer` section of a run config (snake_case keys) into TrainerOptions; errors name the field. */
export function compileTrainerOptions(raw: unknown, path = 'trainer'): TrainerOptions {
  const t = compileValue(TrainerSection, raw ?? {}, path);
  const loss = policyLosses.get(t.policy_loss, `${path}.policy_loss`);
  const c = t.rollout_correction;
  const lossSections: Record<string, unknown> = { ...t };
  if (c.mode === 'mask' && !(c.low < c.high)) throw new ConfigError([{ path: `${path}.rollout_correction`, message: `low (${c.low}) must be below high (${c.high})` }]);
  // A decay needs the step it ends at; an unbounded run has none.
  if (t.lr_schedule !== 'constant' && t.max_steps === 0) {
    throw new ConfigError([{ path: `${path}.lr_schedule`, message: `'${t.lr_schedule}' decays over trainer.max_steps, which is 0 (unbounded): set trainer.max_steps, or lr_schedule: constant` }]);
  }
  if (t.max_steps > 0 && t.warmup_steps >= t.max_steps) {
    throw new ConfigError([{ path: `${path}.warmup_steps`, message: `${t.warmup_steps} warm-up steps leave none of trainer.max_steps (${t.max_steps}): set warmup_steps below max_steps` }]);
  }
  const policyLoss = Object.freeze({ name: t.policy_loss, ...loss.compile(lossSections[t.policy_loss], `${path}.${t.policy_loss}`) });
  const rolloutCorrection: RolloutCorrection = Object.freeze(
    c.mode === 'off' ? { mode: 'off' as const } : c.mode === 'truncate' ? { mode: 'truncate' as const, level: c.level, cap: c.cap } : { mode: 'mask' as const, level: c.level, low: c.low, high: c.high },
  );
  let lossOptions: CompiledPolicyLossOptions;
  try {
    lossOptions = lossOptionsOf({ policyLoss, rolloutCorrection, klCoef: t.kl_coef, klType: t.kl_type, entropyCoef: t.entropy_coef, aggregation: t.aggregation });
  } catch (err) {
    throw new ConfigError([{ path, message: (err as Error).message }]);
  }
  return Object.freeze({
    stalenessBound: t.staleness_bound,
    groupsPerStep: t.groups_per_step,
    maxTokensPerMicroBatch: t.max_tokens_per_micro_batch,
    miniBatches: t.mini_batches,
    ppoEpochs: t.ppo_epochs,
    learningRate: t.learning_rate,
    lrSchedule: Object.freeze({ name: t.lr_schedule, learningRate: t.learning_rate, warmupSteps: t.warmup_steps, totalSteps: t.max_steps, minLrRatio: t.min_lr_ratio }),
    beta1: t.beta1,
    beta2: t.beta2,
    adamEps: t.adam_eps,
    weightDecay: t.weight_decay,
    gradClip: t.grad_clip,
    policyLoss,
    rolloutCorrection,
    klCoef: t.kl_coef,
    klType: t.kl_type,
    entropyCoef: t.entropy_coef,
    aggregation: t.aggregation,
    lossOptions,
    publishEvery: t.publish_every,
    maxSteps: t.max_steps,
    keepCheckpoints: t.keep_checkpoints,
    keepVersions: t.keep_versions,
    threads: t.threads,
    device: t.device,
    dataParallel: compileDataParallel(t.devices, t.data_parallel, { device: t.device, groupsPerStep: t.groups_per_step, klCoef: t.kl_coef }, path),
    lora: compileLora(t.lora, `${path}.lora`),
    recompute: t.recompute,
  });
}

/**
 * The native loss options of the trainer's loss keys, compiled: at start-up, and again in a data-parallel rank's
 * process, whose copy of the options came over a channel (the native core takes only options it compiled itself).
 */
export function lossOptionsOf(o: Pick<TrainerOptions, 'policyLoss' | 'rolloutCorrection' | 'klCoef' | 'klType' | 'entropyCoef' | 'aggregation'>): CompiledPolicyLossOptions {
  const { policyLoss: l } = o;
  return compilePolicyLossOptions({ loss: l.loss, clipLow: l.clipLow, clipHigh: l.clipHigh, dualClipC: l.dualClipC, correction: o.rolloutCorrection, klCoef: o.klCoef, klType: o.klType, entropyCoef: o.entropyCoef, aggregation: o.aggregation });
}

function compileLora(l: { rank: number; alpha?: number; dropout: number; targets: LoraTarget[] } | undefined, path: string): TrainerOptions['lora'] {
  if (!l) return null;
  const targets = LORA_TARGETS.filter((x) => l.targets.includes(x));
  if (targets.length !== l.targets.length) throw new ConfigError([{ path: `${path}.targets`, message: 'names a projection twice' }]);
  return Object.freeze({ rank: l.rank, alpha: l.alpha ?? 2 * l.rank, dropout: l.dropout, targets: Object.freeze(targets) });
}

const d = TRAINER_DEFAULTS;

const RolloutCorrectionSection = Type.Object(
  {
    mode: oneOf(['off', 'truncate', 'mask'] as const, { default: POLICY_LOSS_DEFAULTS.correction.mode, description: "How the weight w = π_prox/π_behaviour of the decoupled objective corrects the rollout's mismatch: 'truncate' trains with min(w, cap) (TIS), 'mask' with w where low ≤ w ≤ high and drops the rest (MIS, IcePop), 'off' with 1 (plain PPO)." }),
    level: oneOf(['token', 'sequence'] as const, { default: POLICY_LOSS_DEFAULTS.correction.level, description: "Weight per token, or per sequence (the product of its token weights; 'mask' then drops whole sequences)." }),
    cap: Type.Number({ exclusiveMinimum: 0, default: POLICY_LOSS_DEFAULTS.correction.cap, description: "'truncate': the cap C." }),
    low: Type.Number({ minimum: 0, default: 0.5, description: "'mask': the lowest weight kept." }),
    high: Type.Number({ exclusiveMinimum: 0, default: 2, description: "'mask': the highest weight kept." }),
  },
  { additionalProperties: false, default: {}, description: 'Rollout correction of the behaviour-vs-proximal mismatch; the step records the fraction of tokens truncated or masked (loss/correction/*).' },
);

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
    learning_rate: Type.Number({ exclusiveMinimum: 0, default: d.learningRate, description: "AdamW learning rate (the peak of lr_schedule's warm-up and decay)." }),
    lr_schedule: oneOf(LR_SCHEDULES, { default: d.lrSchedule.name, description: "The learning rate over the steps: 'constant' (learning_rate throughout), 'linear' or 'cosine' (after warmup_steps, from learning_rate down to min_lr_ratio × learning_rate at trainer.max_steps, which must then be set). Each step records the rate it used (TrainStep.learning_rate)." }),
    warmup_steps: Type.Integer({ minimum: 0, default: d.lrSchedule.warmupSteps, description: 'Steps of linear warm-up to learning_rate (0: none), with any lr_schedule; fewer than max_steps.' }),
    min_lr_ratio: Type.Number({ minimum: 0, maximum: 1, default: d.lrSchedule.minLrRatio, description: "The decay's floor as a fraction of learning_rate ('linear' and 'cosine')." }),
    beta1: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: d.beta1, description: 'AdamW beta1.' }),
    beta2: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: d.beta2, description: 'AdamW beta2.' }),
    adam_eps: Type.Number({ exclusiveMinimum: 0, default: d.adamEps, description: 'AdamW epsilon.' }),
    weight_decay: Type.Number({ minimum: 0, default: d.weightDecay, description: 'AdamW weight decay.' }),
    grad_clip: Type.Number({ exclusiveMinimum: 0, default: d.gradClip, description: 'Gradient norm clip.' }),
    policy_loss: oneOf(policyLosses.names(), { default: d.policyLoss, description: 'The policy loss (a registered loss); its options are the section of the same name below.' }),
    ...Object.fromEntries(policyLosses.names().map((n) => [n, policyLosses.get(n).options])),
    rollout_correction: RolloutCorrectionSection,
    kl_coef: Type.Number({ minimum: 0, default: d.klCoef, description: 'KL penalty to the warm-start policy (0: off, no reference model kept).' }),
    kl_type: oneOf(['k1', 'k2', 'k3'] as const, { default: d.klType, description: 'KL estimator.' }),
    entropy_coef: Type.Number({ minimum: 0, default: d.entropyCoef, description: 'Entropy bonus coefficient.' }),
    aggregation: oneOf(['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean'] as const, { default: d.aggregation, description: 'How per-token losses are reduced.' }),
    publish_every: Type.Integer({ minimum: 1, default: d.publishEvery, description: 'Publish a policy version every k steps.' }),
    max_steps: Type.Integer({ minimum: 0, default: d.maxSteps, description: 'Stop after this many steps (0: unbounded).' }),
    keep_checkpoints: Type.Integer({ minimum: 1, default: d.keepCheckpoints, description: 'Checkpoints kept on disk (the newest; a restart resumes from the newest committed one). Each holds the weights and the AdamW moments.' }),
    keep_versions: Type.Integer({ minimum: 1, default: d.keepVersions, description: "Policy versions whose weights stay in <data_dir>/weights: the newest N, plus version 0, every version within the staleness bound and every version a record read but not yet trained names; older versions' files are deleted (their PolicyVersion events stay)." }),
    threads: Type.Integer({ minimum: 1, default: d.threads, description: 'Native core threads.' }),
    lora: Type.Optional(
      Type.Object(
        {
          rank: Type.Integer({ minimum: 1, maximum: 4096, description: 'Rank r of each adapter (A [r, in], B [out, r]).' }),
          alpha: Type.Optional(Type.Number({ exclusiveMinimum: 0, description: "Scale numerator: the adapter's output is multiplied by alpha / rank (default 2 × rank)." })),
          dropout: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: 0, description: "Dropout on each adapter's input in the training passes (PEFT's lora_dropout); the log-prob passes run without it." }),
          targets: Type.Array(oneOf(LORA_TARGETS, { description: 'A projection.' }), { minItems: 1, default: [...LORA_TARGETS], description: 'The projections that carry an adapter (Hugging Face module names, PEFT target_modules).' }),
        },
        { additionalProperties: false, description: "LoRA: adapters on the attention and MLP projections train while the model's weights stay frozen (gradients and AdamW state for the adapters only); each policy version publishes the adapters, which the built-in engine folds into its weights. Absent: full-parameter training." },
      ),
    ),
    recompute: oneOf(['none', 'layer'] as const, { default: d.recompute, description: "Activation recomputation: 'none' keeps every layer's activations for the backward; 'layer' keeps each layer's input and one layer's activations, and runs each layer's forward again in the backward (one more forward's work, for long contexts). On cuda, 'layer' takes the plain (unfused) training ops." }),
    device: oneOf(['cpu', 'cuda'] as const, { default: d.device, description: "Where the trainer's model runs, with the main job's SFT warm start: 'cpu' (fp32, OpenBLAS), or 'cuda' (one NVIDIA GPU: bf16 matrix products, fp32 master weights; needs the addon built with RLSTREAM_CUDA=1, native/README.md). Checkpoints and published weights are the same files on both; rollouts stay where the backend runs." }),
    devices: DevicesSchema,
    data_parallel: DataParallelSection,
  },
  { additionalProperties: false, default: {}, description: 'The trainer (asynchronous PPO on the native core).' },
);
