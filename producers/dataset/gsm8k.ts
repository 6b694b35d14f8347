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

/** The number after `#### ` in a GSM8K answer, with commas removed ("1,200" → "1200"). */
export function extractGsm8kAnswer(answer: string): string {
  const m = /####\s*(-?[\d,]*\.?\d+)/.exec(answer);
  if (!m?.[1]) throw new RlstreamError('INPUT_INVALID', `GSM8K answer has no "#### <number>" line: ${JSON.stringify(answer.slice(-80))}`);
  return m[1].replace(/,/g, '');
}

export function gsm8kRow(raw: { question: string; answer: string }, index: number, split: string): DatasetRow {
  if (typeof raw.question !== 'string' || typeof raw.answer !== 'string') {
    throw new RlstreamError('INPUT_INVALID', `GSM8K record ${index}: question and answer must be strings`);
  }
  const groundTruth = extractGsm8kAnswer(raw.answer);
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
