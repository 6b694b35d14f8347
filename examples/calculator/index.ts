// The calculator task as rlstream sees it: dataset rows in verl's shape (train and held-out streams),
// the reward registered under its data_source, and the tool set offered to the agent loop.
import { registerReward } from '../../consumers/reward/registry.ts';
import type { DatasetRow } from '../../producers/dataset/types.ts';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadToolConfig } from '../../producers/tools/config.ts';
import type { ToolSet } from '../../producers/tools/tool-set.ts';
import { promptMessages } from './conversation.ts';
import { calculatorReward } from './reward.ts';
import { EASY, HARD, MEDIUM, problems, type Difficulty, type Problem, type Split } from './task.ts';

export const CALCULATOR_DATA_SOURCE = 'rlstream/calculator';

export function difficultyByName(name: unknown, field: string): Difficulty {
  if (name === 'easy') return EASY;
  if (name === 'medium') return MEDIUM;
  if (name === 'hard') return HARD;
  throw new Error(`${field} must be "easy", "medium" or "hard" (got ${JSON.stringify(name)})`);
}

export function problemRow(p: Problem, index: number): DatasetRow {
  return {
    data_source: CALCULATOR_DATA_SOURCE,
    agent_name: 'tool_agent',
    prompt: promptMessages(p),
    reward_model: { style: 'rule', ground_truth: String(p.answer) },
    extra_info: { split: p.split, index, expression: p.expression, steps: p.steps },
  };
}

/** An unbounded, seeded stream of rows of one split. */
export function* problemRows(seed: number, split: Split, difficulty: Difficulty): Generator<DatasetRow> {
  let i = 0;
  for (const p of problems(seed, split, difficulty)) yield problemRow(p, i++);
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
