// The learning rate of an optimizer step: one implementation for the RL trainer (trainer.lr_schedule) and the
// SFT warm-up (cosine to 10%), so that a step's recorded learning_rate is the one its AdamW update used.

export const LR_SCHEDULES = ['constant', 'linear', 'cosine'] as const;
export type LrScheduleName = (typeof LR_SCHEDULES)[number];

export interface LrSchedule {
  /** Peak learning rate: reached after warm-up, kept throughout by 'constant'. */
  learningRate: number;
  name: LrScheduleName;
  /** Steps of linear warm-up from learningRate/warmupSteps to learningRate (0: none). */
  warmupSteps: number;
  /** The step count the decay spans ('linear'/'cosine' reach minLrRatio × learningRate at this step). */
  totalSteps: number;
  /** Floor of the decay as a fraction of learningRate. */
  minLrRatio: number;
}

/** The learning rate of step `step` (0-based: the first update is step 0). */
export function learningRateAt(step: number, s: LrSchedule): number {
  if (step < s.warmupSteps) return (s.learningRate * (step + 1)) / s.warmupSteps;
  if (s.name === 'constant') return s.learningRate;
  const progress = Math.min(1, (step - s.warmupSteps) / Math.max(1, s.totalSteps - s.warmupSteps));
  const shape = s.name === 'linear' ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  return s.learningRate * (s.minLrRatio + (1 - s.minLrRatio) * shape);
}
