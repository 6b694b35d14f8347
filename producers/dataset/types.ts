// Dataset rows in verl's shape, their validation, and sources (files, generators) as async iterables.
import { RlstreamError } from '../../core/errors.ts';
import type { ChatMessage } from '../tokenizer/chat-tokenizer.ts';

/** Per-tool keyword arguments, as verl's `tools_kwargs`: { calculator: { create_kwargs: {...} } }. */
export type ToolsKwargs = Record<string, { create_kwargs?: Record<string, unknown>; execute_kwargs?: Record<string, unknown>; [k: string]: unknown }>;

export interface DatasetRow {
  data_source: string;
  /** The agent loop to run (registered name); the worker's default when absent. */
  agent_name?: string;
  prompt: ChatMessage[];
  reward_model: { ground_truth: string; style?: string };
  extra_info?: {
    split?: string;
    index?: number;
    tools_kwargs?: ToolsKwargs;
    /** { name: <interaction>, ...kwargs } — presence turns on the user simulator for this row. */
    interaction_kwargs?: Record<string, unknown>;
    [k: string]: unknown;
  };
}

/** Anything that yields rows: a file reader, an array, a procedural task generator. */
export type RowSource = AsyncIterable<DatasetRow> | Iterable<DatasetRow>;

/** Check a parsed row; `where` names it in messages ("train.jsonl line 12"). */
export function validateRow(raw: unknown, where: string): DatasetRow {
  const fail = (what: string): never => {
    throw new RlstreamError('INPUT_INVALID', `${where}: ${what}`);
  };
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) return fail('row must be an object');
  const r = raw as Record<string, unknown>;
  if (typeof r['data_source'] !== 'string') fail('data_source must be a string');
  if (r['agent_name'] !== undefined && r['agent_name'] !== null && typeof r['agent_name'] !== 'string') fail('agent_name must be a string');
  const prompt = r['prompt'];
  if (!Array.isArray(prompt) || prompt.length === 0) fail('prompt must be a non-empty array of messages');
  (prompt as unknown[]).forEach((m, i) => {
    if (m === null || typeof m !== 'object') fail(`prompt[${i}] must be a message object`);
    const msg = m as Record<string, unknown>;
    if (typeof msg['role'] !== 'string') fail(`prompt[${i}].role must be a string`);
    if (typeof msg['content'] !== 'string') fail(`prompt[${i}].content must be a string`);
  });
  const rm = r['reward_model'];
  if (rm === null || typeof rm !== 'object') fail('reward_model must be an object with ground_truth');
  const gt = (rm as Record<string, unknown>)['ground_truth'];
  if (typeof gt !== 'string' && typeof gt !== 'number') fail('reward_model.ground_truth must be a string');
  const extra = r['extra_info'];
  if (extra !== undefined && extra !== null && (typeof extra !== 'object' || Array.isArray(extra))) fail('extra_info must be an object');
  const row = raw as DatasetRow;
  if (typeof gt === 'number') row.reward_model.ground_truth = String(gt);
  if (r['agent_name'] === null) delete row.agent_name;
  if (extra === null) delete row.extra_info;
  return row;
}

export async function* iterate(source: RowSource): AsyncGenerator<DatasetRow> {
  for await (const row of source as AsyncIterable<DatasetRow>) yield row;
}
