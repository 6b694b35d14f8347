// A math reward that compares numbers, not strings: "18.00" = "18" = "$18" = "36/2" = "\frac{36}{2}", and
// "1,800" = "1800" (commas as thousands separators only). The answer is the last `#### x` or `\boxed{x}` in
// the solution, else its last number. Exact rationals (BigInt), so no float rounding decides equality.
import { parseDecimal, rational, type Rational } from '../rational.ts';
import type { RewardFn } from './reward-fn.ts';

/** Parse "18", "-18.50", "1,234", "$5", "3/4", "\frac{3}{4}", "50%" (as 50) into an exact rational. */
function parseNumber(text: string): Rational | null {
  let s = text.trim().replace(/^\$|\$$/g, '').replace(/\\[,!;: ]/g, '').replace(/\s+/g, '');
  s = s.replace(/^\\?\$/, '').replace(/\\%$|%$/, '').replace(/\.$/, '');
  const frac = /^(-?)\\d?frac\{([^{}]+)\}\{([^{}]+)\}$/.exec(s);
  if (frac) s = `${frac[1]}${frac[2]}/${frac[3]}`;
  if (/^-?\d{1,3}(,\d{3})+(\.\d*)?$/.test(s)) s = s.replaceAll(',', '');
  const slash = s.split('/');
  if (slash.length === 2) {
    const a = parseDecimal(slash[0]!);
    const b = parseDecimal(slash[1]!);
    if (!a || !b || b.num === 0n) return null;
    return rational(a.num * b.den, a.den * b.num);
  }
  return slash.length === 1 ? parseDecimal(s) : null;
}

export function numericEqual(a: string, b: string): boolean {
  const x = parseNumber(a);
  const y = parseNumber(b);
  return x !== null && y !== null && x.num === y.num && x.den === y.den;
}

const MARKED = /####\s*([^\n]+)|\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}/g;
const NUMBER = /-?\d[\d,]*(?:\.\d+)?(?:\s*\/\s*\d+(?:\.\d+)?)?/g;

export function extractMathAnswer(solution: string): string | null {
  let last: string | null = null;
  for (const m of solution.matchAll(MARKED)) last = (m[1] ?? m[2] ?? '').trim();
  if (last !== null) return last;
  for (const m of solution.matchAll(NUMBER)) last = m[0];
  return last;
}

export interface MathNumericOptions {
  score?: number;
  formatScore?: number;
}

export function mathNumericReward(options: MathNumericOptions = {}): RewardFn {
  return (_dataSource, solution, groundTruth) => {
    const answer = extractMathAnswer(solution);
    if (answer === null) return { score: 0, correct: false };
    const correct = numericEqual(answer, groundTruth);
    return { score: correct ? (options.score ?? 1) : (options.formatScore ?? 0), correct };
  };
}
