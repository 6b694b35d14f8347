// The policy-loss registry: a loss is one named entry with its options (the `trainer.<name>:` section of a run
// config), the native kernel it runs (one C++ function each, native/src/losses.cpp) and its metrics, recorded
// with each TrainStep as `loss/<name>/<metric>`. `trainer.policy_loss` names one; an unknown name fails at
// start-up (and in `rlstream config check`) with the known names and the closest one. Adding a loss: a kernel
// function and its table row in losses.cpp, its name in native/model.ts, and an entry here.
import { Type, type Static, type TObject } from '@sinclair/typebox';
import { Registry, type RegistryShape } from '../../core/config/registry.ts';
import { compileValue, numberOrNull } from '../../core/config/validate.ts';
import type { PolicyLossMetrics, PolicyLossName, PolicyLossOptions } from '../../native/index.ts';

/** The loss-specific part of the native options. */
export type PolicyLossClip = Required<Pick<PolicyLossOptions, 'loss' | 'clipLow' | 'clipHigh' | 'dualClipC'>>;

export interface PolicyLossPlugin<S extends TObject = TObject> {
  /** The native kernel it runs. */
  kernel: PolicyLossName;
  /** Its section's schema (snake_case keys with defaults, ranges and meaning; docs/configuration.md shows it). */
  options: S;
  /** The validated section (defaults filled) as native options. */
  compile(section: Static<S>): PolicyLossClip;
  /** Its metrics from one micro-batch's PolicyLossMetrics; the trainer averages them over the step's tokens. */
  metrics: Readonly<Record<string, (m: PolicyLossMetrics) => number>>;
}

/** A registered loss: its section is validated against the loss's own schema (defaults filled), then compiled. */
export interface RegisteredPolicyLoss extends Omit<PolicyLossPlugin, 'compile'> {
  compile(section: unknown, path: string): PolicyLossClip;
}

const shape: RegistryShape<RegisteredPolicyLoss> = {
  description: 'an object { kernel, options, compile, metrics }',
  accept: (v) => {
    const p = v as Partial<RegisteredPolicyLoss> | null;
    return p && typeof p === 'object' && typeof p.kernel === 'string' && typeof p.compile === 'function' && typeof p.metrics === 'object' && p.options !== undefined ? (p as RegisteredPolicyLoss) : null;
  },
};

export const policyLosses = new Registry<RegisteredPolicyLoss>('policy loss', shape);

/** An entry typed by its own section schema; the registry holds it with its validation in front. */
function entry<S extends TObject>(p: PolicyLossPlugin<S>): RegisteredPolicyLoss {
  return { ...p, compile: (section, path) => p.compile(compileValue(p.options, section ?? {}, path)) };
}

const PpoOptions = Type.Object(
  {
    clip_low: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: 0.2, description: 'PPO ratio clip below 1 (1 - clip_low).' }),
    clip_high: Type.Number({ minimum: 0, default: 0.28, description: 'PPO ratio clip above 1 (1 + clip_high; DAPO clip-higher).' }),
    dual_clip_c: numberOrNull({ exclusiveMinimum: 1, default: 3, description: 'Dual-clip constant c > 1 for negative advantages (null: off).' }),
  },
  { additionalProperties: false, default: {}, description: 'Options of the ppo loss: the token-level clipped surrogate (verl vanilla, dual clip).' },
);

policyLosses.register('ppo', entry({
  kernel: 'ppo',
  options: PpoOptions,
  compile: (s) => ({ loss: 'ppo', clipLow: s.clip_low, clipHigh: s.clip_high, dualClipC: s.dual_clip_c }),
  metrics: { clip_frac: (m) => m.clipFraction, dual_clip_frac: (m) => m.dualClipFraction },
}));

const GspoOptions = Type.Object(
  {
    clip_low: Type.Number({ minimum: 0, exclusiveMaximum: 1, default: 3e-4, description: 'Sequence-ratio clip below 1 (1 - clip_low); the GSPO paper uses 3e-4.' }),
    clip_high: Type.Number({ minimum: 0, default: 4e-4, description: 'Sequence-ratio clip above 1 (1 + clip_high); the GSPO paper uses 4e-4.' }),
  },
  { additionalProperties: false, default: {}, description: 'Options of the gspo loss: the clipped surrogate on the sequence ratio (geometric mean of its token ratios), GSPO.' },
);

policyLosses.register('gspo', entry({
  kernel: 'gspo',
  options: GspoOptions,
  compile: (s) => ({ loss: 'gspo', clipLow: s.clip_low, clipHigh: s.clip_high, dualClipC: null }),
  metrics: { clip_frac: (m) => m.clipFraction },
}));

const CispoOptions = Type.Object(
  {
    clip_low: Type.Number({ minimum: 0, maximum: 1, default: 1, description: 'IS-weight clip below 1 (1 - clip_low; 1: no lower bound, as MiniMax-M1).' }),
    clip_high: Type.Number({ minimum: 0, default: 0.28, description: 'IS-weight clip above 1 (1 + clip_high).' }),
  },
  { additionalProperties: false, default: {}, description: 'Options of the cispo loss: the clipped IS weight as a stop-gradient coefficient on the log-prob, every token keeping its gradient (MiniMax-M1).' },
);

policyLosses.register('cispo', entry({
  kernel: 'cispo',
  options: CispoOptions,
  compile: (s) => ({ loss: 'cispo', clipLow: s.clip_low, clipHigh: s.clip_high, dualClipC: null }),
  metrics: { clip_frac: (m) => m.clipFraction },
}));
