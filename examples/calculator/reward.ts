// Reward of the calculator task: 1 when the last "answer is N" in the response equals the ground truth.
export interface CalculatorScore {
  score: number;
  correct: boolean;
}

const ANSWER = /answer is\s*(-?\d+(?:\.\d+)?)/g;

export function extractAnswer(solution: string): string | null {
  let last: string | null = null;
  for (const m of solution.matchAll(ANSWER)) last = m[1] ?? null;
  return last;
}

export function calculatorReward(_dataSource: string, solution: string, groundTruth: string): CalculatorScore {
  const answer = extractAnswer(solution);
  const correct = answer !== null && Number(answer) === Number(groundTruth);
  return { score: correct ? 1 : 0, correct };
}
