// Offline scoring of JSON lines ({solution_str, ground_truth, data_source?, extra_info?}), the code path of
// `rlstream score`: the same registry and validation as the reward consumer, without a log.
import { RlstreamError } from '../../core/errors.ts';
import { gsm8kReward, type Gsm8kMethod } from './gsm8k.ts';
import { mathNumericReward } from './math_numeric.ts';
import { defaultRewards, type RewardRegistry } from './registry.ts';
import { normalizeOutcome } from './shaping.ts';
import type { RewardFn } from './types.ts';

export interface ScoreOptions {
  reward: string;
  method?: Gsm8kMethod;
  formatScore?: number;
  score?: number;
  registry?: RewardRegistry;
}

/** The function `--reward <name>` names; gsm8k and math_numeric take the command's parameters. */
export function offlineRewardFn(options: ScoreOptions): RewardFn {
  const params = { formatScore: options.formatScore, score: options.score };
  if (options.reward === 'gsm8k' || options.reward === 'openai/gsm8k') return gsm8kReward({ ...params, method: options.method });
  if (options.reward === 'math_numeric') return mathNumericReward(params);
  return (options.registry ?? defaultRewards).require(options.reward);
}

export interface ScoreInput {
  row: Record<string, unknown>;
  solution: string;
  groundTruth: string;
  extraInfo: Record<string, unknown>;
}

/** One JSONL row as a score input, or what is wrong with it. */
export function scoreInput(r: Record<string, unknown>): ScoreInput | string {
  if (typeof r['solution_str'] !== 'string') return '"solution_str" must be a string';
  if (typeof r['ground_truth'] !== 'string') return '"ground_truth" must be a string';
  const extra = r['extra_info'];
  return { row: r, solution: r['solution_str'], groundTruth: r['ground_truth'], extraInfo: extra && typeof extra === 'object' ? (extra as Record<string, unknown>) : {} };
}

/** The row with "score" added, as a JSON line; throws (REWARD_FAILED) when the function throws or returns no score. */
export async function scoreRow(fn: RewardFn, options: ScoreOptions, l: ScoreInput): Promise<string> {
  const dataSource = typeof l.row['data_source'] === 'string' ? l.row['data_source'] : options.reward;
  let value;
  try {
    value = await fn(dataSource, l.solution, l.groundTruth, l.extraInfo);
  } catch (err) {
    throw new RlstreamError('REWARD_FAILED', `reward ${options.reward} threw: ${(err as Error).message}`, { cause: err });
  }
  const { score } = normalizeOutcome(value, `reward ${options.reward}`);
  return JSON.stringify({ ...l.row, score });
}
