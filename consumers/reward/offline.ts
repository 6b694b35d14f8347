// Offline scoring of JSON lines ({solution_str, ground_truth, data_source?, extra_info?, external_reward?}), the code path of
// `rlstream score`: the reward stage's outcome (stage.ts, as the reward consumer scores), without a log. Shaping
// terms are counted from a trajectory's turns and tool calls, which a row does not have.
import type { Gsm8kMethod } from '../../core/tasks/gsm8k.ts';
import { gsm8kReward } from '../../core/tasks/gsm8k.ts';
import { mathNumericReward } from '../../core/tasks/math-numeric.ts';
import { rewardOutcome, type OutcomeInput, type RewardStage } from './stage.ts';
import type { RewardFn } from '../../core/tasks/reward-fn.ts';

export interface BuiltinParams {
  method?: Gsm8kMethod;
  formatScore?: number;
  score?: number;
}

/** The built-in functions that take `rlstream score`'s parameters (gsm8k, math_numeric); null for any other name. */
export function parameterizedReward(name: string, params: BuiltinParams): RewardFn | null {
  const p = { formatScore: params.formatScore, score: params.score };
  if (name === 'gsm8k' || name === 'openai/gsm8k') return gsm8kReward({ ...p, method: params.method });
  if (name === 'math_numeric') return mathNumericReward(p);
  return null;
}

/** One JSONL row as an outcome input (`line` names it), or what is wrong with it. */
export function scoreInput(r: Record<string, unknown>, line: number, stage: Pick<RewardStage, 'fn'>): { row: Record<string, unknown>; input: OutcomeInput } | string {
  if (typeof r['solution_str'] !== 'string') return '"solution_str" must be a string';
  if (typeof r['ground_truth'] !== 'string') return '"ground_truth" must be a string';
  const ds = r['data_source'];
  if (ds !== undefined && typeof ds !== 'string') return '"data_source" must be a string';
  // Without one function for every row, the row's data_source picks it, as in the run.
  if (ds === undefined && !stage.fn) return '"data_source" must be given: the run\'s reward picks its function by data source (or name one: --reward <name>)';
  const extra = r['extra_info'];
  if (extra !== undefined && extra !== null && (typeof extra !== 'object' || Array.isArray(extra))) return '"extra_info" must be an object';
  // An outside reward has the name it has in the event contract (Trajectory.external_reward); null or absent: scored.
  const external = r['external_reward'];
  if (external !== undefined && external !== null && typeof external !== 'number') return `"external_reward" must be a number or null (got ${JSON.stringify(external)})`;
  return { row: r, input: { id: `line ${line}`, dataSource: ds ?? stage.fn!.name, solution: r['solution_str'], groundTruth: r['ground_truth'], extraInfo: (extra ?? {}) as Record<string, unknown>, externalReward: external ?? null } };
}

/** The row with "score" added, as a JSON line; throws (REWARD_FAILED, REWARD_NON_FINITE, INPUT_INVALID) as the reward stage does. */
export async function scoreRow(stage: RewardStage, l: { row: Record<string, unknown>; input: OutcomeInput }): Promise<string> {
  const { outcome } = await rewardOutcome(stage, l.input);
  return JSON.stringify({ ...l.row, score: outcome!.score });
}
