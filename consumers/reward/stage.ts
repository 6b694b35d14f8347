// The reward stage as functions of a trajectory and the run's reward settings: which function scores it (one for
// every data_source, or the data_source's own), an outside agent's reward taking its place, and the shaping
// terms. The live reward consumer, `rlstream replay` and `rlstream score` all call these, so a replay of a run
// or an offline score gives the run's rewards bit for bit.
import { RlstreamError, describeError } from '../../core/errors.ts';
import type { RewardInfo, Trajectory } from '../../schemas/generated/types.ts';
import type { RewardRegistry } from './registry.ts';
import { composeReward, normalizeOutcome, type ShapingOptions } from './shaping.ts';
import type { RewardFn } from '../../core/tasks/reward-fn.ts';

export interface RewardStage {
  /** Functions by data_source: the built-ins and the run's task's. */
  registry: RewardRegistry;
  /** One function for every data_source (reward.name or reward.module) and its name in reward_fn; null: by data_source. */
  fn: { fn: RewardFn; name: string } | null;
  shaping: ShapingOptions;
}

export type Outcome = ReturnType<typeof normalizeOutcome>;

/** What the outcome of one response is scored from: a trajectory's fields, or an offline row's. */
export interface OutcomeInput {
  /** Names the input in errors (a trajectory id, a line). */
  id: string;
  dataSource: string;
  solution: string;
  groundTruth: string;
  extraInfo: Record<string, unknown>;
  /** The outcome an outside agent gave (Trajectory.external_reward): it is the outcome, and no function is called. */
  externalReward: number | null;
}

/** A trajectory's fields as an outcome input; extra_info_json that is not a JSON object is INPUT_INVALID. */
export function trajectoryInput(traj: Trajectory): OutcomeInput {
  let extra: unknown;
  try {
    extra = JSON.parse(traj.extra_info_json || '{}');
  } catch {
    throw new RlstreamError('INPUT_INVALID', `extra_info_json of ${traj.trajectory_id} is not JSON`);
  }
  if (extra === null || typeof extra !== 'object' || Array.isArray(extra)) throw new RlstreamError('INPUT_INVALID', `extra_info_json of ${traj.trajectory_id} is not a JSON object`);
  return { id: traj.trajectory_id, dataSource: traj.data_source, solution: traj.response_text, groundTruth: traj.ground_truth, extraInfo: extra as Record<string, unknown>, externalReward: traj.external_reward };
}

/**
 * The outcome of one response and the name of what gave it. `optional`: a missing function is no error (a reward
 * model scores the response instead) and the outcome is null; otherwise REWARD_FAILED names what is registered.
 */
export async function rewardOutcome(stage: Pick<RewardStage, 'registry' | 'fn'>, input: OutcomeInput, optional = false): Promise<{ outcome: Outcome | null; fnName: string }> {
  if (input.externalReward !== null) return { outcome: normalizeOutcome(input.externalReward, `the external reward of ${input.id}`), fnName: 'external' };
  const fn = stage.fn?.fn ?? stage.registry.get(input.dataSource);
  const fnName = stage.fn?.name ?? input.dataSource;
  if (!fn) {
    if (optional) return { outcome: null, fnName: '' };
    stage.registry.require(input.dataSource);
  }
  let value;
  try {
    value = await fn!(input.dataSource, input.solution, input.groundTruth, input.extraInfo);
  } catch (err) {
    throw new RlstreamError('REWARD_FAILED', `reward function ${fnName} threw: ${describeError(err)}`, { cause: err });
  }
  return { outcome: normalizeOutcome(value, `reward function ${fnName}`), fnName };
}

/** The whole stage for one trajectory without a reward model: its outcome and the shaping terms, as RewardInfo. */
export async function rewardTrajectory(stage: RewardStage, traj: Trajectory): Promise<RewardInfo> {
  const { outcome, fnName } = await rewardOutcome(stage, trajectoryInput(traj));
  return composeReward(traj, outcome!, fnName, stage.shaping);
}
