// The steps agent loops are made of: generate one assistant turn within the token budget, and append
// tool / user messages as delta-tokenized, masked turns (with the tokenization sanity check).
import { deriveId } from '../../core/ids.ts';
import type { ToolCall } from '../../schemas/generated/types.ts';
import type { GenerateResult } from '../backends/types.ts';
import type { ChatMessage } from '../tokenizer/chat-tokenizer.ts';
import type { TokenizationCheck } from '../tokenizer/delta.ts';
import type { ToolParseResult } from './tool-parser.ts';
import type { AgentContext } from './types.ts';

export interface GeneratedTurn {
  turnIndex: number;
  gen: GenerateResult;
  /** The turn's text with special tokens skipped (what events carry). */
  text: string;
  /** Parsed tool calls (empty when not parsed). */
  parsed: ToolParseResult;
  calls: ToolCall[];
}

/** Generate the next assistant turn; null when the response budget is already spent. */
export async function generateTurn(ctx: AgentContext, parseTools: boolean): Promise<GeneratedTurn | null> {
  const rec = ctx.recorder;
  const remaining = ctx.limits.responseLength - rec.responseLength;
  if (remaining <= 0) return null;
  const turnIndex = rec.turnCount;
  const gen = await ctx.backend.generate(
    {
      requestId: deriveId(ctx.trajectoryId, 'generate', turnIndex),
      sessionId: ctx.trajectoryId,
      promptIds: rec.contextIds(),
      sampling: { ...ctx.sampling, max_new_tokens: Math.min(ctx.sampling.max_new_tokens, remaining) },
    },
    ctx.signal,
  );
  // A stop token at the end is the turn's terminator, not content: the template writes it itself.
  const ids = gen.tokenIds;
  const last = ids[ids.length - 1];
  const body = gen.finishReason === 'stop' && last !== undefined && ctx.tokenizer.isSpecial(last) ? ids.slice(0, -1) : ids;
  const content = ctx.tokenizer.decode(body);
  const text = ctx.tokenizer.decodeSkippingSpecial(ids, body, content);
  const parsed: ToolParseResult = parseTools ? ctx.toolParser.parse(content) : { content, calls: [], errors: [] };
  const calls: ToolCall[] = parsed.calls.slice(0, ctx.limits.maxParallelToolCalls).map((c, i) => ({
    id: `call_${turnIndex}_${i}`,
    name: c.name,
    arguments_json: c.argumentsJson,
  }));
  if (parsed.calls.length > calls.length) ctx.count('tool_calls_dropped', parsed.calls.length - calls.length);
  if (parsed.errors.length > 0) ctx.count('tool_call_parse_errors', parsed.errors.length);
  // The message keeps the raw generated text (tool-call blocks included) so that re-rendering the
  // conversation reproduces the generated tokens.
  ctx.messages.push({ role: 'assistant', content });
  rec.addAssistant(gen, text, calls, parsed.errors.length > 0 ? parsed.errors.join('; ') : null);
  ctx.count('assistant_turns');
  ctx.count('generated_tokens', gen.tokenIds.length);
  if (gen.retokenized) {
    ctx.count('retokenized_turns');
    if (gen.retokenized.mismatch) ctx.count('retokenization_mismatches');
  }
  return { turnIndex, gen, text, parsed, calls };
}

/** The end-of-turn token's text when the last turn is an assistant turn that stopped at one, else null. */
export function stopOfLastTurn(ctx: AgentContext): string | null {
  const rec = ctx.recorder;
  const last = rec.responseIds[rec.responseIds.length - 1];
  if (rec.turnRoles[rec.turnRoles.length - 1] !== 'assistant' || last === undefined || !ctx.tokenizer.isSpecial(last)) return null;
  return ctx.tokenizer.decode([last]);
}

/** Delta tokenizers whose check has reported a mismatch once (a warning), by identity. */
const warned = new WeakSet<object>();
const TEMPLATE_MISMATCH =
  "delta tokenization differs from the chat template's whole rendering of the conversation: the trajectory keeps the tokens as generated and appended (nothing is re-tokenized); this turn is flagged tokenization_mismatch and counted in tokenization_mismatches (further ones are logged at debug)";

/**
 * What appendObservation computes from the messages, computed elsewhere (serve tokenizes big observations in a
 * worker thread, with the same tokenizer, template and delta tokenization): the delta ids, their text, and the
 * tokenization check of the conversation with them (null when the check is off).
 */
export interface PreparedObservation {
  ids: number[];
  text: string;
  check: TokenizationCheck | null;
}

/**
 * Append messages (tool responses or a user turn) as one masked turn. Returns false, appending nothing,
 * when they do not fit in the response budget (verl drops them and stops the loop).
 */
export function appendObservation(ctx: AgentContext, role: 'tool' | 'user', messages: ChatMessage[], latencyMs: number, prepared?: PreparedObservation): boolean {
  const rec = ctx.recorder;
  const { ids } = prepared ?? ctx.delta.deltaIds(messages, true, stopOfLastTurn(ctx));
  if (rec.responseLength + ids.length > ctx.limits.responseLength) return false;
  ctx.messages.push(...messages);
  let mismatch = false;
  if (ctx.limits.tokenizationCheck !== 'off') {
    const check = prepared?.check ?? ctx.delta.check(ctx.limits.tokenizationCheck, rec.contextIds().concat(ids), ctx.messages, ctx.tools.length > 0 ? ctx.tools : null);
    if (check.mismatch) {
      mismatch = true;
      ctx.count('tokenization_mismatches');
      // the first one of a tokenizer is a warning (a template that breaks the property breaks it in every
      // trajectory of its shape); the rest are counted and flagged on their turns
      const first = !warned.has(ctx.delta);
      warned.add(ctx.delta);
      (first ? ctx.logger.warn : ctx.logger.debug).call(ctx.logger, first ? TEMPLATE_MISMATCH : 'delta tokenization differs from full re-tokenization', { trajectory_id: ctx.trajectoryId, detail: check.detail });
    }
  }
  rec.addObservation(role, ids, latencyMs, mismatch, prepared?.text);
  ctx.count(role === 'tool' ? 'tool_turns' : 'user_turns');
  return true;
}
