// GSM8K → the rows verl's GSM8K tool examples write, value for value and in verl's key order:
// examples/data_preprocess/gsm8k_multiturn_w_tool.py (no agent_name column) and gsm8k_tool_agent_loop.py (the
// same rows with `agent_name: tool_agent` after data_source). A verl user's Parquet from either script and
// `rlstream preprocess gsm8k` output are interchangeable, so the key order and the exact texts matter: they
// are part of what the model is trained on (the system prompt) and of what a Parquet reader sees (columns).
import { RlstreamError } from '../../core/errors.ts';
import type { ParquetType } from './parquet-writer.ts';

export const VERL_GSM8K_DATA_SOURCE = 'openai/gsm8k';
/** The tool verl's rows offer and key their tools_kwargs by (verl.tools.gsm8k_tool.Gsm8kTool's schema name). */
const VERL_GSM8K_TOOL_NAME = 'calc_gsm8k_reward';

const VERL_GSM8K_SYSTEM_PROMPT =
  'You are a math expert. You are given a question and you need to solve it step by step. ' +
  'Reasoning step by step before any tool call. ' +
  `You should use the \`${VERL_GSM8K_TOOL_NAME}\` tool after step by step solving the question, ` +
  'before generate final answer at least once and refine your answer if necessary. ' +
  'Put your final answer in the format of `#### <answer>`.';

export const VERL_GSM8K_INSTRUCTION = "Let's think step by step and output the final answer after `####`.";

/** The ground truth as verl's extract_solution takes it: the FIRST `#### <number>` (one space), commas removed. */
export function verlGsm8kSolution(answer: string): string {
  // Python's re.search("#### (\-?[0-9\.\,]+)"): the first match, not the last; dots and commas anywhere.
  const m = /#### (-?[0-9.,]+)/.exec(answer);
  if (!m?.[1]) throw new RlstreamError('INPUT_INVALID', `GSM8K answer has no "#### <number>": ${JSON.stringify(answer.slice(-80))}`);
  return m[1].replaceAll(',', '');
}

/** One row of verl's GSM8K tool dataset; the interfaces spell out its key order (verl's dict order). */
export interface VerlGsm8kRow {
  data_source: string;
  agent_name?: string;
  prompt: { role: string; content: string }[];
  ability: string;
  reward_model: { style: string; ground_truth: string };
  extra_info: {
    split: string;
    index: number;
    answer: string;
    question: string;
    need_tools_kwargs: boolean;
    tools_kwargs: Record<string, { create_kwargs: { ground_truth: string } }>;
    interaction_kwargs: { query: string; ground_truth: string };
  };
}

export interface VerlGsm8kOptions {
  /** Add `agent_name` (gsm8k_tool_agent_loop.py writes "tool_agent"); absent in gsm8k_multiturn_w_tool.py's rows. */
  agentName?: string;
}

/** The row for raw record number `index` (0-based within its split) of GSM8K ({question, answer}). */
export function verlGsm8kRow(raw: { question: unknown; answer: unknown }, index: number, split: string, options: VerlGsm8kOptions = {}): VerlGsm8kRow {
  if (typeof raw.question !== 'string' || typeof raw.answer !== 'string') {
    throw new RlstreamError('INPUT_INVALID', `GSM8K record ${index}: question and answer must be strings`);
  }
  const solution = verlGsm8kSolution(raw.answer);
  const question = `${raw.question} ${VERL_GSM8K_INSTRUCTION}`;
  return {
    data_source: VERL_GSM8K_DATA_SOURCE,
    ...(options.agentName === undefined ? {} : { agent_name: options.agentName }),
    prompt: [
      { role: 'system', content: VERL_GSM8K_SYSTEM_PROMPT },
      { role: 'user', content: question },
    ],
    ability: 'math',
    reward_model: { style: 'rule', ground_truth: solution },
    extra_info: {
      split,
      index,
      answer: raw.answer,
      question: raw.question,
      need_tools_kwargs: true,
      tools_kwargs: { [VERL_GSM8K_TOOL_NAME]: { create_kwargs: { ground_truth: solution } } },
      interaction_kwargs: { query: question, ground_truth: solution },
    },
  };
}

/** The Parquet columns `datasets.Dataset.to_parquet` writes for these rows (pyarrow's inference from verl's dicts). */
export function verlGsm8kColumns(options: VerlGsm8kOptions = {}): [string, ParquetType][] {
  const text = 'string' as const;
  return [
    ['data_source', text],
    ...(options.agentName === undefined ? [] : [['agent_name', text] as [string, ParquetType]]),
    ['prompt', { list: { struct: [['role', text], ['content', text]] } }],
    ['ability', text],
    ['reward_model', { struct: [['style', text], ['ground_truth', text]] }],
    [
      'extra_info',
      {
        struct: [
          ['split', text],
          ['index', 'int64'],
          ['answer', text],
          ['question', text],
          ['need_tools_kwargs', 'bool'],
          ['tools_kwargs', { struct: [[VERL_GSM8K_TOOL_NAME, { struct: [['create_kwargs', { struct: [['ground_truth', text]] }]] }]] }],
          ['interaction_kwargs', { struct: [['query', text], ['ground_truth', text]] }],
        ],
      },
    ],
  ];
}
