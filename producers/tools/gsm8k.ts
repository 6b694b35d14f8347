// verl's GSM8K reward tool (verl.tools.gsm8k_tool.Gsm8kTool), `calc_gsm8k_reward`: the model submits an answer,
// the tool scores "#### <answer>" against the row's ground truth with verl's flexible GSM8K extraction and
// replies with verl's text, `Current parsed answer='72' reward=1.0` (Python's f"{answer=} {reward=}", so the
// model reads the same bytes as under verl). Its step reward is verl's: 0 when the score improved on the
// instance's previous one, else -0.05. The instance lives for the trajectory (verl's BaseTool lifecycle), so a
// resubmitted correct answer is penalised; verl's current ToolAgentLoop creates a fresh instance per call, where
// "improved" reduces to "correct".
import { extractGsm8kAnswer } from '../../core/tasks/gsm8k.ts';
import type { ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { StatefulTool, type ToolResult } from './types.ts';

export const GSM8K_TOOL_NAME = 'calc_gsm8k_reward';

/** The schema verl's Gsm8kTool documents (a tool YAML's tool_schema replaces it, as in verl). */
const GSM8K_TOOL_SCHEMA: ChatTool = {
  type: 'function',
  function: {
    name: GSM8K_TOOL_NAME,
    description: 'A tool for calculating the reward of gsm8k',
    parameters: { type: 'object', properties: { answer: { type: 'string', description: 'The answer to the question' } }, required: ['answer'] },
  },
};

/** Step reward of a submission that does not raise the instance's score. */
const NO_IMPROVEMENT_PENALTY = -0.05;

interface State {
  response: string;
  groundTruth: string | null;
  /** The last score (verl starts at 0.0). */
  reward: number;
}

/** Python's repr() of a str: the quote it picks, its escapes, and non-printable characters as \x, \u, \U. */
export function pyRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const cp = ch.codePointAt(0)!;
    if (ch === quote || ch === '\\') out += '\\' + ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (ch !== ' ' && /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u.test(ch)) {
      out += cp < 0x100 ? `\\x${cp.toString(16).padStart(2, '0')}` : cp < 0x10000 ? `\\u${cp.toString(16).padStart(4, '0')}` : `\\U${cp.toString(16).padStart(8, '0')}`;
    } else out += ch;
  }
  return out + quote;
}

/** Python's str() of a JSON value (what verl does to a non-string answer); JSON cannot tell 72 from 72.0. */
export function pyStr(v: unknown): string {
  if (typeof v === 'string') return v;
  if (v === null || v === undefined) return 'None';
  if (typeof v === 'boolean') return v ? 'True' : 'False';
  if (typeof v === 'number') return String(v);
  const inner = (x: unknown): string => (typeof x === 'string' ? pyRepr(x) : pyStr(x));
  if (Array.isArray(v)) return `[${v.map(inner).join(', ')}]`;
  return `{${Object.entries(v as Record<string, unknown>).map(([k, x]) => `${pyRepr(k)}: ${inner(x)}`).join(', ')}}`;
}

/** A Python float's repr for the scores this tool sees (0, 1 and verl's format_score 0.0). */
function pyFloat(x: number): string {
  return Number.isInteger(x) ? x.toFixed(1) : String(x);
}

export class Gsm8kTool extends StatefulTool<State> {
  readonly schema: ChatTool;
  /** verl hands the tool whatever JSON object the model wrote and str()s a non-string answer: no schema check. */
  readonly checksOwnArguments = true;

  constructor(schema: ChatTool = GSM8K_TOOL_SCHEMA) {
    super();
    this.schema = schema;
  }

  protected initialState(createKwargs: Record<string, unknown>): State {
    const gt = createKwargs['ground_truth'];
    return { response: '', groundTruth: gt === undefined || gt === null ? null : String(gt), reward: 0 };
  }

  execute(instanceId: string, args: Record<string, unknown>): ToolResult {
    const state = this.state(instanceId)!;
    if (args === null || typeof args !== 'object' || Array.isArray(args)) {
      // verl calls parameters.get(...) on it, which raises; its loop reports the exception with reward 0.
      return { text: `Error when executing tool: arguments must be a JSON object, got ${pyStr(args)}`, reward: 0, isError: true };
    }
    const answer = pyStr(args['answer'] ?? '');
    state.response = answer.startsWith('#### ') ? answer : `#### ${answer}`;
    // verl's gsm8k.compute_score(method="flexible", format_score=0.0, score=1.0): no number → the int 0.
    const parsed = extractGsm8kAnswer(state.response, 'flexible');
    const reward = parsed !== null && parsed === state.groundTruth ? 1 : 0;
    const rewardText = parsed === null ? '0' : pyFloat(reward);
    const stepReward = reward > state.reward ? 0 : NO_IMPROVEMENT_PENALTY;
    state.reward = reward;
    return { text: `Current parsed answer=${pyRepr(answer)} reward=${rewardText}`, reward: stepReward };
  }
}
