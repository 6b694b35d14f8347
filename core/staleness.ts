// The run's one staleness bound has one default: the trainer's section (trainer.staleness_bound) shows it, and a
// rollout worker built without one (producers/options.ts) gates with it, so both ends of the gate agree.

/** Policy versions a sample's oldest token may lag the trainer's version when it is trained. */
export const DEFAULT_STALENESS_BOUND = 2;
