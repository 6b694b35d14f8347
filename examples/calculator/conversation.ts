// The messages of the calculator task: the prompt a rollout starts from, and the ideal demonstration
// (tool call, tool response, final answer) that SFT warm-up learns the format from.
import { CALCULATOR_SCHEMA } from '../../producers/tools/calculator.ts';
import type { ChatMessage, ChatTool } from '../../producers/tokenizer/chat-tokenizer.ts';

export type { ChatMessage };
import type { Problem } from './task.ts';

export const SYSTEM_PROMPT = 'Solve the problem. Use the calculator, then give the answer.';

/** The tool offered in prompts: the calculator's own schema, exactly as the rollout worker renders it. */
export const CALCULATOR_TOOL: ChatTool = CALCULATOR_SCHEMA;

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

export function demonstration(p: Problem): ChatMessage[] {
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
