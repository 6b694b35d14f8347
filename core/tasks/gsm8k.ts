// GSM8K rule-based reward with verl's reference semantics (verl/utils/reward_score/gsm8k.py): answers are
// extracted from the last 300 characters only, compared to the ground truth as strings, never as numbers.
import type { RewardFn } from './reward-fn.ts';

export type Gsm8kMethod = 'strict' | 'flexible';

export interface Gsm8kOptions {
  /** strict: the last `#### <number>`; flexible: the last number-like string. Default strict. */
  method?: Gsm8kMethod;
  /** Score of an extracted but wrong answer. Default 0. */
  formatScore?: number;
  /** Score of a correct answer. Default 1. */
  score?: number;
}

// verl clips to the tail because the final answer sits at the end and regexes over long texts are slow;
// the clip changes results (an answer earlier than 300 characters from the end is not seen), so we keep it.
const CLIP_CHARS = 300;
// Python's `#### (\-?[0-9\.\,]+)` and `(\-?[0-9\.\,]+)`: note the single space after ####, and that the
// number class takes dots and commas anywhere (so "1,000." is one match).
const STRICT = /#### (-?[0-9.,]+)/g;
const FLEXIBLE = /(-?[0-9.,]+)/g;

export function extractGsm8kAnswer(solution: string, method: Gsm8kMethod = 'strict'): string | null {
  const text = solution.length > CLIP_CHARS ? solution.slice(-CLIP_CHARS) : solution;
  if (method === 'strict') {
    let last: string | undefined;
    for (const m of text.matchAll(STRICT)) last = m[1];
    return last === undefined ? null : last.replaceAll(',', '').replaceAll('$', '');
  }
  const found = [...text.matchAll(FLEXIBLE)].map((m) => m[1]!);
  if (found.length === 0) return null;
  for (let i = found.length - 1; i >= 0; i--) if (found[i] !== '' && found[i] !== '.') return found[i]!;
  // verl's `for final_answer in reversed(answer): ... break` leaves the loop variable at the first match when
  // no candidate is valid (only "." strings): that "." is returned, and scores format_score, not 0. Kept.
  return found[0]!;
}

export function gsm8kScore(solution: string, groundTruth: string, options: Gsm8kOptions = {}): number {
  const answer = extractGsm8kAnswer(solution, options.method ?? 'strict');
  if (answer === null) return 0;
  return answer === groundTruth ? (options.score ?? 1) : (options.formatScore ?? 0);
}

/** The registered form; `correct` is true only for an exact match, whatever the score values are. */
export function gsm8kReward(options: Gsm8kOptions = {}): RewardFn {
  return (_dataSource, solution, groundTruth) => {
    const answer = extractGsm8kAnswer(solution, options.method ?? 'strict');
    if (answer === null) return { score: 0, correct: false };
    const correct = answer === groundTruth;
    return { score: correct ? (options.score ?? 1) : (options.formatScore ?? 0), correct };
  };
}
