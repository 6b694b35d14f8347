// Topic names: the only place they are spelled. Every rollout-side record is keyed by group_id.
export const TOPICS = {
  rolloutEvents: 'rollout.events',
  rewarded: 'rewarded',
  advantaged: 'advantaged',
  policyVersions: 'policy.versions',
  trainSteps: 'train.steps',
  control: 'control',
  deadLetter: 'dead.letter',
  schemas: '_schemas',
} as const;
