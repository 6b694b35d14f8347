// The advantage stage as functions of a group of rewarded trajectories and the run's advantage settings: which
// trajectories get advantages (the train split, well-formed members), DAPO's dynamic sampling, the estimator and
// its options, and the group statistics. The live advantage consumer, `rlstream replay` and `rlstream advantage
// --config` all call these, so a replay of a run gives the run's advantages bit for bit.
import { RlstreamError } from '../../core/errors.ts';
import type { AdvantagedTrajectory, GroupStats, RewardedTrajectory, Trajectory } from '../../schemas/generated/types.ts';
import type { Encodable } from '../../core/serde/events.ts';
import { DEFAULT_ESTIMATOR_OPTIONS, getEstimator, mean, stdUnbiased, type EstimatorOptions, type EstimatorResult, type EstimatorSample } from './estimators.ts';

export interface AdvantageStage {
  /** Estimator name (advantage.estimator). */
  estimator: string;
  options: EstimatorOptions;
  /** Drop groups whose rewards are all equal (advantage.dynamic_sampling). */
  dynamicSampling: boolean;
}

/** A stage with the defaults of the advantage section (grpo, no dynamic sampling) but for what is given. */
export function advantageStage(s: Partial<Omit<AdvantageStage, 'options'>> & { options?: Partial<EstimatorOptions> } = {}): AdvantageStage {
  getEstimator(s.estimator ?? 'grpo'); // an unknown name fails here, naming the known ones
  return { estimator: s.estimator ?? 'grpo', options: { ...DEFAULT_ESTIMATOR_OPTIONS, ...s.options }, dynamicSampling: s.dynamicSampling ?? false };
}

/** Only the train split gets advantages and is trained on; held-out rollouts are the run's evaluations. */
export function getsAdvantage(traj: Trajectory): boolean {
  return traj.dataset.split === 'train';
}

/** Throws (INPUT_INVALID, REWARD_NON_FINITE) when a rewarded trajectory cannot be a member of its group. */
export function checkMember(ev: RewardedTrajectory): void {
  const traj = ev.trajectory;
  const size = Math.max(1, traj.group_size);
  if (traj.sample_index < 0 || traj.sample_index >= size) {
    throw new RlstreamError('INPUT_INVALID', `trajectory ${traj.trajectory_id}: sample_index ${traj.sample_index} is not below group_size ${traj.group_size}; group_size must be the number of trajectories sent with group_id ${traj.group_id}, sample_index 0..group_size-1`);
  }
  // A non-finite reward (written by something other than the reward stage, which refuses them) would turn the
  // whole group's advantages into NaN.
  if (!Number.isFinite(ev.reward.score)) throw new RlstreamError('REWARD_NON_FINITE', `trajectory ${traj.trajectory_id}: reward score ${ev.reward.score} is not finite`);
  if (traj.response_mask.length !== traj.response_ids.length) {
    throw new RlstreamError('INPUT_INVALID', `trajectory ${traj.trajectory_id}: response_mask has ${traj.response_mask.length} entries for ${traj.response_ids.length} tokens`);
  }
}

/** An advantaged trajectory but for its event_id and time_ms, which the caller gives (the arrays as Float64Arrays). */
export type AdvantagedBody = Omit<Encodable<AdvantagedTrajectory>, 'event_id' | 'time_ms'>;

/** What the stage needs of one member: its place in the group and its estimator sample. */
export interface MemberSample {
  sampleIndex: number;
  sample: EstimatorSample;
}

export type GroupResult<M> = { filtered: true } | { filtered: false; stats: GroupStats; members: { member: M; result: EstimatorResult }[] };

/** A rewarded trajectory as a member of its group. */
export function rewardedSample(stage: AdvantageStage, ev: RewardedTrajectory): MemberSample {
  const t = ev.trajectory;
  return { sampleIndex: t.sample_index, sample: { groupId: t.group_id, score: ev.reward.score, responseMask: t.response_mask, tokenRewards: ev.reward.token_rewards, values: null } };
}

/**
 * Advantages of one closed group (`expected`: its group_size). Members are taken in sample_index order, whatever
 * order they arrived in, so the floating-point sums (mean, std, whitening) are the same in every caller. A group
 * whose rewards are all equal is filtered under dynamic sampling. Throws what the estimator throws.
 */
export function advantageGroup<M>(stage: AdvantageStage, members: readonly M[], sampleOf: (m: M) => MemberSample, expected: number): GroupResult<M> {
  const sorted = members.map((member) => ({ member, ...sampleOf(member) })).sort((a, b) => a.sampleIndex - b.sampleIndex);
  const scores = sorted.map((m) => m.sample.score);
  if (stage.dynamicSampling && scores.every((s) => s === scores[0])) return { filtered: true };
  const results = getEstimator(stage.estimator)(sorted.map((m) => m.sample), stage.options);
  const stats: GroupStats = { group_members: sorted.length, expected_size: expected, reward_mean: mean(scores), reward_std: stdUnbiased(scores), partial: sorted.length < expected };
  return { filtered: false, stats, members: sorted.map((m, i) => ({ member: m.member, result: results[i]! })) };
}

/** The advantaged trajectory of one member of a group of rewarded trajectories. */
export function advantagedBody(stage: AdvantageStage, ev: RewardedTrajectory, result: EstimatorResult, stats: GroupStats): AdvantagedBody {
  // Float64Arrays as they are: the serde writes them like plain arrays (no copy into number[] first).
  return { trajectory: ev.trajectory, reward: ev.reward, estimator: stage.estimator, advantages: result.advantages, returns: result.returns, group: stats };
}
