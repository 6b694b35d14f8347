// Offline advantages over JSON lines ({trajectory_id, group_id, reward, response_mask, token_rewards?,
// values?}), the code path of `rlstream advantage`: every good line is one batch, as verl sees a batch; or, with
// a run's config, each group on its own through the run's advantage stage (stage.ts), as its consumer computes it.
import { DEFAULT_ESTIMATOR_OPTIONS, getEstimator, type EstimatorOptions, type EstimatorResult, type EstimatorSample } from './estimators.ts';
import { advantageGroup, type AdvantageStage } from './stage.ts';

function numberArray(v: unknown, allow01: boolean): number[] | null {
  if (!Array.isArray(v)) return null;
  for (const x of v) {
    if (typeof x !== 'number' || !Number.isFinite(x)) return null;
    if (allow01 && x !== 0 && x !== 1) return null;
  }
  return v as number[];
}

export interface AdvantageInput {
  line: number;
  row: Record<string, unknown>;
  sample: EstimatorSample;
}

/** One JSONL row as an estimator sample, or what is wrong with it. */
export function advantageInput(r: Record<string, unknown>): Omit<AdvantageInput, 'line'> | string {
  if (typeof r['trajectory_id'] !== 'string') return '"trajectory_id" must be a string';
  if (typeof r['group_id'] !== 'string') return '"group_id" must be a string';
  if (typeof r['reward'] !== 'number' || !Number.isFinite(r['reward'])) return '"reward" must be a finite number';
  const responseMask = numberArray(r['response_mask'], true);
  if (!responseMask) return '"response_mask" must be an array of 0 and 1';
  const tokenRewards = r['token_rewards'] === undefined || r['token_rewards'] === null ? null : numberArray(r['token_rewards'], false);
  if (tokenRewards === null && r['token_rewards'] != null) return '"token_rewards" must be an array of finite numbers';
  if (tokenRewards && tokenRewards.length !== responseMask.length) return `"token_rewards" has ${tokenRewards.length} entries, "response_mask" ${responseMask.length}`;
  const values = r['values'] === undefined || r['values'] === null ? null : numberArray(r['values'], false);
  if (values === null && r['values'] != null) return '"values" must be an array of finite numbers';
  if (values && values.length !== responseMask.length) return `"values" has ${values.length} entries, "response_mask" ${responseMask.length}`;
  return { row: r, sample: { groupId: r['group_id'], score: r['reward'], responseMask, tokenRewards, values } };
}

/**
 * Groups whose reward statistics overflow: the mean and the standard deviation every advantaged trajectory
 * carries (and GRPO divides by) must be finite, else huge but finite rewards (±1e200) come out as advantages
 * of 0 that look valid.
 */
function overflowingGroups(inputs: readonly AdvantageInput[]): Set<string> {
  const groups = new Map<string, number[]>();
  for (const i of inputs) groups.set(i.sample.groupId, [...(groups.get(i.sample.groupId) ?? []), i.sample.score]);
  const out = new Set<string>();
  for (const [g, scores] of groups) {
    const mean = scores.reduce((a, b) => a + b, 0) / scores.length;
    const variance = scores.reduce((a, b) => a + (b - mean) ** 2, 0);
    if (!Number.isFinite(mean) || !Number.isFinite(variance)) out.add(g);
  }
  return out;
}

/**
 * Advantages of one batch (every good line of the input), as JSON lines with "advantages" added; a line whose
 * group statistics overflow or whose advantages are not finite is an error instead.
 */
export function advantageBatch(inputs: readonly AdvantageInput[], estimator: string, options: Partial<EstimatorOptions> = {}): ({ line: number; out: string } | { line: number; error: string })[] {
  const fn = getEstimator(estimator);
  const overflow = overflowingGroups(inputs);
  const ok = inputs.filter((i) => !overflow.has(i.sample.groupId));
  const results = ok.length > 0 ? fn(ok.map((i) => i.sample), { ...DEFAULT_ESTIMATOR_OPTIONS, ...options }) : [];
  const byLine = new Map(ok.map((i, k) => [i.line, results[k]!]));
  return inputs.map((i) => {
    if (overflow.has(i.sample.groupId)) return { line: i.line, error: `the rewards of group "${i.sample.groupId}" overflow its mean or standard deviation (keep |reward| well below 1e154)` };
    const advantages = Array.from(byLine.get(i.line)!.advantages);
    if (!advantages.every(Number.isFinite)) return { line: i.line, error: `${estimator} gave non-finite advantages (overflow in the estimator)` };
    return { line: i.line, out: JSON.stringify({ ...i.row, advantages }) };
  });
}

export type AdvantageLine = { line: number; out: string } | { line: number; error: string } | { line: number; filtered: string };

/**
 * Advantages as the run's advantage stage computes them: each group (lines sharing group_id, in line order) on
 * its own, the group dynamic sampling filters left out (`filtered`, with the reason). Overflowing groups and
 * non-finite advantages are errors, as in advantageBatch.
 */
export function advantageByStage(inputs: readonly AdvantageInput[], stage: AdvantageStage): AdvantageLine[] {
  const overflow = overflowingGroups(inputs);
  const groups = new Map<string, AdvantageInput[]>();
  for (const i of inputs) if (!overflow.has(i.sample.groupId)) groups.set(i.sample.groupId, [...(groups.get(i.sample.groupId) ?? []), i]);
  const results = new Map<number, EstimatorResult | 'filtered'>();
  for (const members of groups.values()) {
    const r = advantageGroup(stage, members, (m) => ({ sampleIndex: m.line, sample: m.sample }), members.length);
    if (r.filtered) for (const m of members) results.set(m.line, 'filtered');
    else for (const { member, result } of r.members) results.set(member.line, result);
  }
  return inputs.map((i) => {
    if (overflow.has(i.sample.groupId)) return { line: i.line, error: `the rewards of group "${i.sample.groupId}" overflow its mean or standard deviation (keep |reward| well below 1e154)` };
    const r = results.get(i.line)!;
    if (r === 'filtered') return { line: i.line, filtered: `group "${i.sample.groupId}" left out by dynamic sampling (advantage.dynamic_sampling: its rewards are all equal)` };
    const advantages = Array.from(r.advantages);
    if (!advantages.every(Number.isFinite)) return { line: i.line, error: `${stage.estimator} gave non-finite advantages (overflow in the estimator)` };
    return { line: i.line, out: JSON.stringify({ ...i.row, advantages }) };
  });
}
