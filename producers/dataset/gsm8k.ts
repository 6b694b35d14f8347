// GSM8K → rows for the tool agent with rlstream's `calculator` tool: a system prompt offering it, the ground
// truth and instruction as verl's rows have them (verl-gsm8k.ts, which writes verl's own rows with its
// calc_gsm8k_reward tool), and tools_kwargs / interaction_kwargs carrying the ground truth.
import { RlstreamError } from '../../core/errors.ts';
import type { DatasetRow } from './types.ts';
import { VERL_GSM8K_DATA_SOURCE, VERL_GSM8K_INSTRUCTION, verlGsm8kSolution } from './verl-gsm8k.ts';

const GSM8K_SYSTEM_PROMPT =
  'You are a careful math tutor. Solve the problem step by step. Use the `calculator` tool for every ' +
  'arithmetic operation instead of computing in your head; you may call it as often as you need. ' +
  'When you are done, write the final answer on its own line as `#### <answer>`.';


export function gsm8kRow(raw: { question: string; answer: string }, index: number, split: string): DatasetRow {
  if (typeof raw.question !== 'string' || typeof raw.answer !== 'string') {
    throw new RlstreamError('INPUT_INVALID', `GSM8K record ${index}: question and answer must be strings`);
  }
  const groundTruth = verlGsm8kSolution(raw.answer);
  return {
    data_source: VERL_GSM8K_DATA_SOURCE,
    agent_name: 'tool_agent',
    prompt: [
      { role: 'system', content: GSM8K_SYSTEM_PROMPT },
      { role: 'user', content: `${raw.question} ${VERL_GSM8K_INSTRUCTION}` },
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
