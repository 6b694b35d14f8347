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

interface ScoreLine {
  row: Record<string, unknown>;
  solution: string;
  groundTruth: string;
  extraInfo: Record<string, unknown>;
}

/** Parse every line first: a malformed line rejects the whole input, naming its line number. */
export function parseScoreLines(text: string): ScoreLine[] {
  const out: ScoreLine[] = [];
  const errors: string[] = [];
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    const n = i + 1;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (err) {
      errors.push(`line ${n}: not JSON (${(err as Error).message})`);
      return;
    }
    if (row === null || typeof row !== 'object' || Array.isArray(row)) return void errors.push(`line ${n}: expected a JSON object`);
    const r = row as Record<string, unknown>;
    if (typeof r['solution_str'] !== 'string') return void errors.push(`line ${n}: "solution_str" must be a string`);
    if (typeof r['ground_truth'] !== 'string') return void errors.push(`line ${n}: "ground_truth" must be a string`);
    const extra = r['extra_info'];
    out.push({ row: r, solution: r['solution_str'], groundTruth: r['ground_truth'], extraInfo: extra && typeof extra === 'object' ? (extra as Record<string, unknown>) : {} });
  });
  if (errors.length > 0) throw new RlstreamError('INPUT_INVALID', errors.slice(0, 20).join('\n') + (errors.length > 20 ? `\n(${errors.length - 20} more)` : ''));
  return out;
}

export async function scoreLines(text: string, options: ScoreOptions): Promise<string[]> {
  const fn = offlineRewardFn(options);
  const lines = parseScoreLines(text);
  const out: string[] = [];
  for (const [i, l] of lines.entries()) {
    const dataSource = typeof l.row['data_source'] === 'string' ? l.row['data_source'] : options.reward;
    let value;
    try {
      value = await fn(dataSource, l.solution, l.groundTruth, l.extraInfo);
    } catch (err) {
      throw new RlstreamError('REWARD_FAILED', `input ${i + 1}: reward ${options.reward} threw: ${(err as Error).message}`, { cause: err });
    }
    const { score } = normalizeOutcome(value, `reward ${options.reward}`);
    out.push(JSON.stringify({ ...l.row, score }));
  }
  return out;
}
