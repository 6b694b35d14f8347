// What a served turn may be asked for beyond plain sampling, as backend wrappers around one generate call:
// alternatives per token (OpenAI's top_logprobs, from the backend's own distribution), and a forced tool call
// (tool_choice required or a named function). vLLM constrains such a turn with guided decoding; here the fixed
// opening of the family's call format (the tool parser's callPrefix) is appended to the context as tokens the
// policy did not sample (GenerateResult.forced: response_mask 0, no log-prob), and the policy writes the rest.
// Only the prefix is forced: the arguments are the policy's, and a turn that is not then a valid call of the
// function is reported as the model's failure (checkForcedCall), as OpenAI reports invalid model output.
import type { ToolCall } from '../../schemas/generated/types.ts';
import type { GeneratedTurn } from '../agent/steps.ts';
import type { ToolParser } from '../agent/tool-parser.ts';
import type { GenerateRequest, GenerateResult, LlmBackend } from '../backends/types.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import { ServeError } from './errors.ts';

/** OpenAI's tool_choice as a served turn takes it: the policy decides, must call some tool, or must call this one. */
export type ToolChoice = 'auto' | 'none' | 'required' | { name: string };

/** A backend that is `backend` for everything but generate (its methods, on its prototype, see it as `this`). */
export function wrapGenerate(backend: LlmBackend, generate: (request: GenerateRequest, signal?: AbortSignal) => Promise<GenerateResult>): LlmBackend {
  return Object.assign(Object.create(backend) as LlmBackend, { generate });
}

/** Every generate call asks for `k` alternatives per token. */
export function withTopLogprobs(backend: LlmBackend, k: number): LlmBackend {
  return wrapGenerate(backend, (request, signal) => backend.generate({ ...request, topLogprobs: k }, signal));
}

/**
 * Generate after `prefix` (token ids the caller chose): the backend continues the context with them, and the
 * result holds them first, marked `forced`, with log-prob 0, version -1 and no alternatives. The prefix counts
 * against max_new_tokens; when it does not fit, the turn is the prefix cut there (finish `length`).
 */
export function forcePrefix(backend: LlmBackend, prefix: readonly number[]): LlmBackend {
  return wrapGenerate(backend, async (request, signal) => {
    const p = prefix.length;
    const max = request.sampling.max_new_tokens;
    if (max <= p) {
      const ids = prefix.slice(0, max);
      return { tokenIds: ids, logprobs: ids.map(() => 0), policyVersions: ids.map(() => -1), finishReason: 'length', server: backend.name, latencyMs: 0, forced: ids.length, ...(request.topLogprobs ? { topLogprobs: ids.map(() => []) } : {}) };
    }
    const out = await backend.generate({ ...request, promptIds: request.promptIds.concat(prefix), sampling: { ...request.sampling, max_new_tokens: max - p } }, signal);
    return {
      ...out,
      tokenIds: [...prefix, ...out.tokenIds],
      logprobs: [...prefix.map(() => 0), ...out.logprobs],
      policyVersions: out.policyVersions.length === out.tokenIds.length ? [...prefix.map(() => -1), ...out.policyVersions] : out.policyVersions,
      ...(out.topLogprobs ? { topLogprobs: [...prefix.map(() => []), ...out.topLogprobs] } : {}),
      forced: p + (out.forced ?? 0),
    };
  });
}

/**
 * The token ids forced for a tool choice, or null when the choice forces nothing (auto, none). `required` with
 * one declared tool is that tool named; with several, the opening up to the name, which the policy writes.
 */
export function forcedCallIds(choice: ToolChoice, declared: readonly string[], parser: ToolParser, tokenizer: ChatTokenizer): number[] | null {
  if (choice === 'auto' || choice === 'none') return null;
  if (!parser.callPrefix) throw new ServeError('SRV_ERR_VALIDATION', { detail: `tool_choice: the tool parser ${parser.name} cannot force a call (only auto and none)` }, { param: 'tool_choice' });
  const name = typeof choice === 'object' ? choice.name : declared.length === 1 ? declared[0]! : null;
  return tokenizer.encode(parser.callPrefix(name));
}

/**
 * Check that a turn generated under tool_choice required / a named function is a valid call of a declared tool
 * (of that function), its arguments a JSON object; otherwise the model failed, and the call says so (500
 * SRV_ERR_MODEL_OUTPUT, as OpenAI answers invalid model output) instead of returning something else.
 */
export function checkForcedCall(choice: ToolChoice, turn: GeneratedTurn, calls: readonly ToolCall[], refused: readonly ToolCall[]): void {
  if (choice === 'auto' || choice === 'none') return;
  const want = typeof choice === 'object' ? `a call of ${choice.name}` : 'a tool call';
  const cut = turn.gen.finishReason === 'length' ? ' (generation stopped at max_tokens or the response budget first)' : '';
  const fail = (what: string) => new ServeError('SRV_ERR_MODEL_OUTPUT', { detail: `tool_choice asked for ${want}; ${what}${cut}` }, { param: 'tool_choice' });
  if (turn.parsed.errors.length > 0) throw fail(turn.parsed.errors[0]!);
  if (refused.length > 0) throw fail(`the policy called ${refused[0]!.name}, which the request does not declare`);
  if (calls.length === 0) throw fail('the turn holds no call');
  for (const c of calls) {
    if (typeof choice === 'object' && c.name !== choice.name) throw fail(`the policy called ${c.name}`);
    let args: unknown;
    try {
      args = JSON.parse(c.arguments_json);
    } catch (err) {
      throw fail(`the arguments of ${c.name} are not JSON (${(err as Error).message})`);
    }
    if (args === null || typeof args !== 'object' || Array.isArray(args)) throw fail(`the arguments of ${c.name} are not a JSON object`);
  }
}
