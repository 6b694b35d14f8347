// Turns a trajectory and its outcome reward into RewardInfo: the outcome, tool and interaction rewards, and
// the shaping terms from config, each a named component; the score is their sum (so a trainer or a SQL query
// can always tell where a reward came from).
import { RlstreamError } from '../../core/errors.ts';
import type { NamedValue, RewardInfo, Trajectory } from '../../schemas/generated/types.ts';
import type { RewardValue } from '../../core/tasks/reward-fn.ts';

export interface ShapingOptions {
  /** Added once per successful tool call. Default 0. */
  toolSuccessBonus?: number;
  /** Subtracted once per invalid or failed tool call. Default 0 (give it as a positive number). */
  invalidCallPenalty?: number;
  /** Subtracted when the trajectory ended at the turn limit. Default 0 (positive number). */
  maxTurnsPenalty?: number;
  /**
   * DAPO's soft overlong punishment: the last `overlongBufferLen` response tokens before `maxResponseLength`
   * cost up to `overlongPenaltyFactor`, linearly (the full factor at the limit). 0 / unset: off.
   */
  overlongBufferLen?: number;
  overlongPenaltyFactor?: number;
  /** The rollout's response_length (the limit the buffer ends at); needed with overlongBufferLen. */
  maxResponseLength?: number;
  /** DAPO's overlong filtering: a trajectory cut at the token limit is kept out of the loss (RewardInfo.exclude_from_loss). */
  maskTruncated?: boolean;
}

/** DAPO's soft overlong penalty of a response of `length` tokens: 0 before the buffer, -factor at or past the limit. */
export function overlongPenalty(length: number, maxLength: number, bufferLen: number, factor: number): number {
  if (bufferLen <= 0) return 0;
  const over = length - (maxLength - bufferLen);
  return over <= 0 ? 0 : -factor * Math.min(1, over / bufferLen);
}

function finite(name: string, v: number, what: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new RlstreamError('REWARD_NON_FINITE', `${what} returned ${name} = ${String(v)}`);
  return v;
}

/** Validate what a reward function returned; NaN / Inf anywhere → REWARD_NON_FINITE, malformed → REWARD_FAILED. */
export function normalizeOutcome(value: RewardValue, what: string): { components: NamedValue[]; score: number; correct: boolean | null } {
  if (typeof value === 'number') {
    const score = finite('score', value, what);
    return { score, components: [{ name: 'outcome', value: score }], correct: null };
  }
  if (value === null || typeof value !== 'object' || typeof value.score !== 'number') {
    throw new RlstreamError('REWARD_FAILED', `${what} returned ${JSON.stringify(value)}; expected a number or {score, components?, correct?}`);
  }
  const score = finite('score', value.score, what);
  const correct = typeof value.correct === 'boolean' ? value.correct : null;
  if (value.components === undefined) return { score, components: [{ name: 'outcome', value: score }], correct };
  const list = Array.isArray(value.components) ? value.components : Object.entries(value.components).map(([name, v]) => ({ name, value: v }));
  const components = list.map((c) => ({ name: String(c.name), value: finite(`component ${c.name}`, c.value, what) }));
  const sum = components.reduce((a, c) => a + c.value, 0);
  // Components are the outcome's breakdown: a score that is not their sum would make the total ambiguous.
  if (Math.abs(sum - score) > 1e-9 * Math.max(1, Math.abs(score))) {
    throw new RlstreamError('REWARD_FAILED', `${what} returned components summing to ${sum}, not its score ${score}`);
  }
  return { score, components, correct };
}

function sum(xs: number[]): number {
  let s = 0;
  for (const x of xs) s += x;
  return s;
}

export function composeReward(
  traj: Trajectory,
  outcome: { components: NamedValue[]; correct: boolean | null },
  rewardFn: string,
  shaping: ShapingOptions = {},
  extra: NamedValue[] = [],
): RewardInfo {
  const components: NamedValue[] = [...outcome.components, ...extra];
  if (traj.tool_rewards.length > 0) components.push({ name: 'tool', value: finite('tool reward', sum(traj.tool_rewards), 'trajectory') });
  if (traj.interaction_rewards.length > 0) components.push({ name: 'interaction', value: finite('interaction reward', sum(traj.interaction_rewards), 'trajectory') });
  const failed = traj.num_tool_errors + traj.num_invalid_tool_calls;
  const succeeded = Math.max(0, traj.num_tool_calls - failed);
  if (shaping.toolSuccessBonus && succeeded > 0) components.push({ name: 'shaping.tool_success', value: shaping.toolSuccessBonus * succeeded });
  if (shaping.invalidCallPenalty && failed > 0) components.push({ name: 'shaping.invalid_call', value: -shaping.invalidCallPenalty * failed });
  if (shaping.maxTurnsPenalty && traj.termination === 'max_turns') components.push({ name: 'shaping.max_turns', value: -shaping.maxTurnsPenalty });
  if (shaping.overlongBufferLen) {
    if (!shaping.maxResponseLength) throw new RlstreamError('CONFIG_INVALID', 'shaping.overlongBufferLen needs maxResponseLength (the rollout response_length)');
    const p = overlongPenalty(traj.response_ids.length, shaping.maxResponseLength, shaping.overlongBufferLen, shaping.overlongPenaltyFactor ?? 1);
    if (p < 0) components.push({ name: 'shaping.overlong', value: p });
  }
  const score = sum(components.map((c) => c.value));
  if (!Number.isFinite(score)) throw new RlstreamError('REWARD_NON_FINITE', `reward of ${traj.trajectory_id} sums to ${score}`);
  // The contract carries the exclusion as a field of its own, so the trainer never reads meaning into a component's name.
  const excludeFromLoss = shaping.maskTruncated === true && traj.termination === 'max_tokens';
  return { score, components, reward_fn: rewardFn, correct: outcome.correct, token_rewards: null, exclude_from_loss: excludeFromLoss };
}
