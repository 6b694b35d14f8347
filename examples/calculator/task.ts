// The built-in task, "arithmetic with a calculator": procedurally generated multi-step word problems whose
// exact answer is easiest to reach by calling the calculator tool. Seeded and unbounded; train and held-out
// problems are disjoint by construction (a problem's split is a hash of its canonical expression).
import { createHash } from 'node:crypto';
import { rng } from '../../core/random.ts';

export { rng };

export type Split = 'train' | 'heldout';

export interface Difficulty {
  /** Number of operations after the starting quantity (1 = one step). */
  minSteps: number;
  maxSteps: number;
  /** Largest operand of + and -. */
  maxAddend: number;
  /** Largest factor of ×. */
  maxFactor: number;
}

export const EASY: Difficulty = { minSteps: 1, maxSteps: 2, maxAddend: 99, maxFactor: 9 };
export const MEDIUM: Difficulty = { minSteps: 2, maxSteps: 2, maxAddend: 99, maxFactor: 9 };
export const HARD: Difficulty = { minSteps: 2, maxSteps: 3, maxAddend: 999, maxFactor: 19 };

export interface Problem {
  question: string;
  /** The expression a perfect tool call would evaluate. */
  expression: string;
  answer: number;
  split: Split;
  steps: number;
}

const NAMES = ['Tom', 'Ana', 'Ravi', 'Mia', 'Leo', 'Sara', 'Omar', 'Lena', 'Kai', 'Nora'];
const ITEMS = ['apples', 'coins', 'stamps', 'books', 'marbles', 'cards', 'shells', 'pens'];

function int(r: () => number, lo: number, hi: number): number {
  return lo + Math.floor(r() * (hi - lo + 1));
}

/** 1 in 5 expressions belongs to the held-out split, decided by the expression's hash alone. */
export function splitOf(expression: string): Split {
  const h = createHash('sha256').update(expression).digest();
  return (h[0] ?? 0) % 5 === 0 ? 'heldout' : 'train';
}

function generateOne(r: () => number, d: Difficulty): Problem {
  const name = NAMES[int(r, 0, NAMES.length - 1)] ?? 'Tom';
  const item = ITEMS[int(r, 0, ITEMS.length - 1)] ?? 'apples';
  const steps = int(r, d.minSteps, d.maxSteps);
  let value = int(r, 2, d.maxAddend);
  let expression = String(value);
  const sentences = [`${name} has ${value} ${item}.`];
  for (let s = 0; s < steps; s++) {
    const op = int(r, 0, 2);
    // Parenthesise the running expression before × so left-to-right word order matches evaluation order.
    if (op === 0) {
      const b = int(r, 2, d.maxAddend);
      sentences.push(`${s === 0 ? name : 'Then ' + name} gets ${b} more.`);
      expression = `${expression}+${b}`;
      value += b;
    } else if (op === 1 && value > 2) {
      const b = int(r, 1, Math.min(d.maxAddend, value - 1));
      sentences.push(`${s === 0 ? name : 'Then ' + name} gives away ${b}.`);
      expression = `${expression}-${b}`;
      value -= b;
    } else {
      const b = int(r, 2, d.maxFactor);
      sentences.push(`${s === 0 ? name : 'Then ' + name} gets ${b} times as many.`);
      expression = s === 0 ? `${expression}*${b}` : `(${expression})*${b}`;
      value *= b;
    }
  }
  sentences.push(`How many ${item} does ${name} have now?`);
  return { question: sentences.join(' '), expression, answer: value, split: splitOf(expression), steps };
}

/** An unbounded stream of problems of one split, deterministic for a seed. */
export function* problems(seed: number, split: Split, difficulty: Difficulty): Generator<Problem> {
  const r = rng(seed);
  for (;;) {
    const p = generateOne(r, difficulty);
    if (p.split === split) yield p;
  }
}

export function take<T>(it: Iterator<T>, n: number): T[] {
  const out: T[] = [];
  for (let i = 0; i < n; i++) {
    const x = it.next();
    if (x.done) break;
    out.push(x.value);
  }
  return out;
}
