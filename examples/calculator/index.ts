// The calculator task as rlstream sees it, registered as the task `calculator`: dataset rows in verl's shape
// (train and held-out streams), the reward under its data_source, the tool set offered to the agent loop,
// held-out correctness and the SFT demonstrations.
import { Type } from '@sinclair/typebox';
import { oneOf } from '../../core/config/validate.ts';
import { rng } from '../../core/random.ts';
import { registerReward } from '../../consumers/reward/registry.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { registerTask } from '../../producers/tasks.ts';
import { loadToolConfig } from '../../producers/tools/config.ts';
import type { ToolSet } from '../../producers/tools/tool-set.ts';
import { promptMessages } from './conversation.ts';
import { demonstrationExample } from './demos.ts';
import { calculatorReward } from './reward.ts';
import { EASY, HARD, MEDIUM, problems, take, type Difficulty, type Problem, type Split } from './task.ts';

export const CALCULATOR_DATA_SOURCE = 'rlstream/calculator';

export function difficultyByName(name: unknown, field: string): Difficulty {
  if (name === 'easy') return EASY;
  if (name === 'medium') return MEDIUM;
  if (name === 'hard') return HARD;
  throw new Error(`${field} must be "easy", "medium" or "hard" (got ${JSON.stringify(name)})`);
}

/** A problem as a dataset row; `difficulty` goes into extra_info, where evaluations break their figures down by it. */
export function problemRow(p: Problem, index: number, difficulty?: Difficulty): DatasetRow {
  return {
    data_source: CALCULATOR_DATA_SOURCE,
    agent_name: 'tool_agent',
    prompt: promptMessages(p),
    reward_model: { style: 'rule', ground_truth: String(p.answer) },
    extra_info: { split: p.split, index, expression: p.expression, steps: p.steps, ...(difficulty ? { difficulty } : {}) },
  };
}

/** An unbounded, seeded stream of rows of one split. */
export function* problemRows(seed: number, split: Split, difficulty: Difficulty): Generator<DatasetRow> {
  let i = 0;
  for (const p of problems(seed, split, difficulty)) yield problemRow(p, i++, difficulty);
}

export const TOOLS_YAML = join(dirname(fileURLToPath(import.meta.url)), 'tools.yaml');

export function calculatorTools(): Promise<ToolSet> {
  return loadToolConfig(TOOLS_YAML, { defaultTimeoutMs: 5_000 });
}

let registered = false;
export function registerCalculatorReward(): void {
  if (registered) return;
  registerReward(CALCULATOR_DATA_SOURCE, (_ds, solution, groundTruth) => calculatorReward(_ds, solution, groundTruth));
  registered = true;
}

const DIFFICULTIES = ['easy', 'medium', 'hard'] as const;

registerTask('calculator', {
  options: Type.Object(
    {
      train: oneOf(DIFFICULTIES, { default: 'hard', description: 'Difficulty of the training problems (easy: 1-2 steps; medium: 2 steps; hard: 2-3 steps, larger numbers).' }),
      heldout: oneOf(DIFFICULTIES, { default: 'medium', description: 'Difficulty of the held-out problems.' }),
    },
    { additionalProperties: false },
  ),
  sftOptions: Type.Object(
    {
      difficulty: oneOf(DIFFICULTIES, { default: 'easy', description: 'Difficulty of the demonstrations.' }),
      direct_fraction: Type.Number({ minimum: 0, maximum: 1, default: 0, description: 'Fraction of demonstrations that answer without the tool (see examples/calculator/conversation.ts).' }),
    },
    { additionalProperties: false },
  ),
  create(options, env) {
    return {
      datasetName: 'calculator',
      trainRows: () => problemRows(env.seed, 'train', difficultyByName(options.train, 'task.train')),
      heldoutRows: (n) => Promise.resolve(take(problemRows(env.seed + 7, 'heldout', difficultyByName(options.heldout, 'task.heldout')), n)),
      rewards: { [CALCULATOR_DATA_SOURCE]: calculatorReward },
      tools: calculatorTools,
      correct: (t) => calculatorReward(t.data_source, t.response_text, t.ground_truth).correct,
      sftExamples(tok, stage) {
        const difficulty = difficultyByName(stage.options['difficulty'] ?? 'easy', 'sft.difficulty');
        const direct = Number(stage.options['direct_fraction'] ?? 0);
        const pick = rng(stage.seed + 2000);
        return take(problems(stage.seed + 1000, 'train', difficulty), stage.problems).map((p) => demonstrationExample(tok, p, pick() < direct));
      },
    };
  },
});
