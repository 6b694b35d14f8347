// What a reward function is: verl's compute_score(data_source, solution_str, ground_truth, extra_info) shape,
// returning a number or a structured result. Rule-based functions are plain functions; batched model-based
// rewards have their own interface (consumers/reward/model.ts) because they score token ids, many at a time.
import type { NamedValue } from '../../schemas/generated/types.ts';

export interface RewardResult {
  score: number;
  /** Outcome terms by name; when given, they must sum to `score`. */
  components?: NamedValue[] | Record<string, number>;
  /** Outcome correctness, when the function knows it (accuracy metrics). */
  correct?: boolean | null;
}

export type RewardValue = number | RewardResult;

export type RewardFn = (
  dataSource: string,
  solutionStr: string,
  groundTruth: string,
  extraInfo: Record<string, unknown>,
) => RewardValue | Promise<RewardValue>;
