// The messages of the calculator task: the prompt a rollout starts from, and the ideal demonstration
// (tool call, tool response, final answer) that SFT warm-up learns the format from.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import type { ChatMessage, ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';

export type { ChatMessage };
import type { Problem } from './task.ts';

export const SYSTEM_PROMPT = 'Use the calculator, then answer.';

/** The tool offered in prompts, as examples/calculator/tools.yaml declares it (one source of truth). */
export const CALCULATOR_TOOL: ChatTool = (() => {
  const doc = parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), 'tools.yaml'), 'utf8')) as { tools: { tool_schema: ChatTool }[] };
  return doc.tools[0]!.tool_schema;
})();

export function promptMessages(p: Problem): ChatMessage[] {
  return [
    { role: 'system', content: SYSTEM_PROMPT },
    { role: 'user', content: p.question },
  ];
}

/** The final answer sentence; the reward reads the number after "answer is". */
export function answerText(answer: number | string): string {
  return `The answer is ${answer}.`;
}

/**
 * The ideal episode: a calculator call, its result, the answer. With `direct`, the answer is written at once
 * without the tool — demonstrations of a habit the policy cannot really sustain (a ~1M-parameter model cannot
 * do multi-digit arithmetic in its head), which RL has to unlearn by discovering that the tool pays off.
 */
export function demonstration(p: Problem, direct = false): ChatMessage[] {
  if (direct) return [...promptMessages(p), { role: 'assistant', content: answerText(p.answer) }];
  return [
    ...promptMessages(p),
    {
      role: 'assistant',
      content: '',
      tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'calculator', arguments: JSON.stringify({ expression: p.expression }) } }],
    },
    { role: 'tool', content: String(p.answer), tool_call_id: 'call_0' },
    { role: 'assistant', content: answerText(p.answer) },
  ];
}
