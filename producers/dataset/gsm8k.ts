// GSM8K → rows for the tool agent: a system prompt offering the `calculator` tool, the ground truth from
// the answer's `#### N` line (thousands separators removed), and tools_kwargs / interaction_kwargs
// carrying it, as verl's GSM8K tool example does.
import { RlstreamError } from '../../core/errors.ts';
import type { DatasetRow } from './types.ts';

export const GSM8K_DATA_SOURCE = 'openai/gsm8k';

export const GSM8K_SYSTEM_PROMPT =
  'You are a careful math tutor. Solve the problem step by step. Use the `calculator` tool for every ' +
  'arithmetic operation instead of computing in your head; you may call it as often as you need. ' +
  'When you are done, write the final answer on its own line as `#### <answer>`.';

export const GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after `####`.";

/**
 * The ground truth of a GSM8K reference answer as verl's preprocessing takes it (extract_solution): the first
 * `#### <number>` (one space; Python's `#### (\-?[0-9\.\,]+)`), commas removed ("1,200" → "1200"). Scoring a
 * model's answer is another rule, verl's reward (consumers/reward/gsm8k.ts: the last match, in the tail).
 */
export function gsm8kGroundTruth(answer: string): string {
  const m = /#### (-?[0-9.,]+)/.exec(answer);
  if (!m?.[1]) throw new RlstreamError('INPUT_INVALID', `GSM8K answer has no "#### <number>" line: ${JSON.stringify(answer.slice(-80))}`);
  return m[1].replaceAll(',', '');
}

export function gsm8kRow(raw: { question: string; answer: string }, index: number, split: string): DatasetRow {
  if (typeof raw.question !== 'string' || typeof raw.answer !== 'string') {
    throw new RlstreamError('INPUT_INVALID', `GSM8K record ${index}: question and answer must be strings`);
  }
  const groundTruth = gsm8kGroundTruth(raw.answer);
  return {
    data_source: GSM8K_DATA_SOURCE,
    agent_name: 'tool_agent',
    prompt: [
      { role: 'system', content: GSM8K_SYSTEM_PROMPT },
      { role: 'user', content: `${raw.question} ${GSM8K_INSTRUCTION}` },
    ],
    reward_model: { style: 'rule', ground_truth: groundTruth },
    extra_info: {
      split,
      index,
      question: raw.question,
      answer: raw.answer,
      need_tools_kwargs: true,
      tools_kwargs: { calculator: { create_kwargs: { ground_truth: groundTruth } } },
      interaction_kwargs: { name: 'gsm8k', query: raw.question, ground_truth: groundTruth },
    },
  };
}
