// One trajectory served through the OpenAI-compatible endpoint. The client holds the conversation and sends it
// whole on every call; the session holds what was actually rendered and generated, checks that the client's
// history is its own, and turns only the new messages into a turn: tool results (loss mask 0, one
// ToolCallCompleted per answered call) or user messages, delta-tokenized against the previous turns with the
// tokenization sanity check. Generation and observations go through the agent loops' own steps
// (producers/agent/steps.ts) on an AgentContext the session keeps, so a served trajectory is recorded exactly as
// the rollout worker records one.
import { createHash, type Hash } from 'node:crypto';
import { deriveId } from '../../core/ids.ts';
import type { Logger } from '../../core/telemetry.ts';
import type { SamplingParams, Termination, ToolCall, TrajectoryStarted } from '../../schemas/generated/types.ts';
import { toEventMessages } from '../agent/loops.ts';
import type { TrajectoryMeta, TrajectoryRecorder } from '../agent/recorder.ts';
import { appendObservation, generateTurn, stopOfLastTurn, type GeneratedTurn, type PreparedObservation } from '../agent/steps.ts';
import type { AgentContext } from '../agent/types.ts';
import type { ChatMessage, ChatTokenizer, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import type { LlmBackend } from '../backends/types.ts';
import { checkForcedCall, forcedCallIds, forcePrefix, withTopLogprobs, wrapGenerate } from './constrain.ts';
import { ServeError } from './errors.ts';
import { OFFLOAD_MIN_CHARS, promptChars, type TokenizeOffload } from './offload.ts';
import type { TurnOptions } from './service.ts';

/** A message as the client sees it (and sends back): what identity checks compare. */
export interface ClientMessage {
  role: string;
  content: string;
  tool_calls: { id: string; name: string; arguments: string }[];
  tool_call_id: string | null;
}

/** A running hash of a conversation: the tools' names, then each message as it is appended. */
function keyHash(tools: readonly ChatTool[]): Hash {
  return createHash('sha256').update(JSON.stringify(tools.map((t) => t.function.name)));
}

/**
 * A JSON text as a value: parsed and written back with sorted keys and no spacing, so two serialisations of the
 * same arguments (LangChain's `{"a": 1}` for the policy's `{"a":1}`, keys in another order, 1.0 for 1) are one.
 * Text that is not JSON stays itself, marked so that it never equals a JSON value's form.
 */
export function canonicalJson(text: string): string {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return '\u0001' + text;
  }
  const write = (v: unknown): string => {
    if (Array.isArray(v)) return `[${v.map(write).join(',')}]`;
    if (v !== null && typeof v === 'object') {
      const o = v as Record<string, unknown>;
      return `{${Object.keys(o).sort().map((k) => `${JSON.stringify(k)}:${write(o[k])}`).join(',')}}`;
    }
    return JSON.stringify(v);
  };
  return write(value);
}

/** A message as a value: what a conversation's key hashes and what the history check compares. */
function canonicalMessage(m: ClientMessage): string {
  return JSON.stringify([m.role, m.content, m.tool_calls.map((c) => [c.id, c.name, canonicalJson(c.arguments)]), m.tool_call_id]);
}

function hashMessage(h: Hash, m: ClientMessage): void {
  h.update('\u0000' + canonicalMessage(m));
}

/**
 * The key of a conversation as the client sees it (the per-conversation session lookup), over its messages as
 * values: whatever client serialised them (argument spacing and key order, content as a string or as text
 * parts, null or empty content), the same conversation has the same key.
 */
export function conversationKey(tools: readonly ChatTool[], messages: readonly ClientMessage[]): string {
  const h = keyHash(tools);
  for (const m of messages) hashMessage(h, m);
  return h.digest('base64url');
}

/** The one comparison the history check and the lookup key share. */
function sameMessage(a: ClientMessage, b: ClientMessage): boolean {
  return canonicalMessage(a) === canonicalMessage(b);
}

/** A generated turn as the endpoint answers it. */
export interface ServedTurn {
  turn: GeneratedTurn;
  /** Calls returned to the client (those naming a declared tool). */
  calls: ToolCall[];
  /** Calls refused: they name a tool the session did not declare. */
  refused: ToolCall[];
  /** The assistant message as returned (and as the client must send it back). */
  message: ClientMessage;
}

export class ServeSession {
  /** The conversation as the client sees it (prompt, returned assistant messages, observations); grows through append(). */
  private readonly history: ClientMessage[] = [];
  /**
   * conversationKey(tools, history), kept as a running hash: the key is read before and after every turn, and
   * hashing the whole conversation each time would grow with its length.
   */
  private readonly running: Hash;
  private cachedKey: string | null = null;
  /** Calls returned to the client and not answered yet, by id. */
  private readonly pending = new Map<string, { turnIndex: number; call: ToolCall; sentMs: number }>();
  lastUsedMs = Date.now();
  busy = false;
  completed: Termination | null = null;
  /** Read tool calls out of generated turns (chat); text completions do not. */
  parseTools = true;
  /** Its TrajectoryStarted is published (with its first turn): only then does its end publish anything. */
  started = false;

  constructor(
    readonly ctx: AgentContext,
    prompt: readonly ClientMessage[],
    readonly declaredTools: ReadonlySet<string>,
    private readonly logger: Logger,
    /** The token holder that opened it (fair shares). */
    readonly holder: string,
  ) {
    this.running = keyHash(ctx.tools);
    this.append(prompt);
  }

  private append(messages: readonly ClientMessage[]): void {
    for (const m of messages) {
      this.history.push(m);
      hashMessage(this.running, m);
    }
    this.cachedKey = null;
  }

  get id(): string {
    return this.ctx.trajectoryId;
  }

  get recorder(): TrajectoryRecorder {
    return this.ctx.recorder;
  }

  get meta(): TrajectoryMeta {
    return this.ctx.recorder.meta;
  }

  /** conversationKey of the conversation so far. */
  key(): string {
    this.cachedKey ??= this.running.copy().digest('base64url');
    return this.cachedKey;
  }

  /** The TrajectoryStarted event of this session (the first call's prompt, tools and sampling). */
  startedEvent(policyVersion: number): TrajectoryStarted {
    const m = this.meta;
    return {
      event_id: deriveId(m.trajectoryId, 'started'),
      time_ms: Date.now(),
      run_id: m.runId,
      trajectory_id: m.trajectoryId,
      group_id: m.groupId,
      sample_index: m.sampleIndex,
      group_size: m.groupSize,
      agent_name: m.agentName,
      data_source: m.dataSource,
      dataset: m.dataset,
      prompt_messages: toEventMessages(this.ctx.messages),
      prompt_token_ids: [...this.recorder.promptIds],
      tools: this.ctx.tools.map((t) => ({ name: t.function.name, description: t.function.description ?? '', parameters_json: JSON.stringify(t.function.parameters ?? {}) })),
      sampling: this.ctx.sampling,
      policy_version: policyVersion,
      ground_truth: m.groundTruth,
      extra_info_json: m.extraInfoJson,
    };
  }

  /**
   * Check the client's conversation against the session's history and append what is new as one masked turn.
   * Returns false when the new messages do not fit in the response budget (the session is then out of tokens).
   * With `offload`, new messages of OFFLOAD_MIN_CHARS or more (a big tool result) are tokenized, and checked, in
   * its worker thread; nothing is recorded before that answers.
   */
  async observe(messages: readonly ClientMessage[], offload?: { worker: TokenizeOffload; templateKwargs: Record<string, unknown> }): Promise<boolean> {
    const n = this.history.length;
    if (messages.length < n) throw new ServeError('SRV_ERR_HISTORY', { detail: `the conversation has ${messages.length} messages, the trajectory already ${n}` });
    for (let i = 0; i < n; i++) {
      if (!sameMessage(messages[i]!, this.history[i]!)) throw new ServeError('SRV_ERR_HISTORY', { detail: `message ${i} (${messages[i]!.role}) differs from what the trajectory recorded` });
    }
    const fresh = messages.slice(n);
    if (fresh.length === 0) {
      // A retry of the same conversation: the client asks for the next assistant turn of what it already has.
      if (this.history[n - 1]?.role === 'assistant') throw new ServeError('SRV_ERR_HISTORY', { detail: 'no new message after the last assistant turn' });
      return true;
    }
    const now = Date.now();
    const observation: ChatMessage[] = [];
    const answered: { turnIndex: number; call: ToolCall; text: string; latencyMs: number }[] = [];
    for (const [j, m] of fresh.entries()) {
      if (m.role === 'assistant') throw new ServeError('SRV_ERR_HISTORY', { detail: `message ${n + j} is an assistant message the endpoint did not generate; only tool and user messages may follow` });
      if (m.role === 'tool') {
        const p = m.tool_call_id === null ? undefined : this.pending.get(m.tool_call_id);
        if (!p) throw new ServeError('SRV_ERR_TOOL_CALL', { detail: `message ${n + j}: tool_call_id ${JSON.stringify(m.tool_call_id)} is not a call of this trajectory awaiting its result` });
        if (answered.some((a) => a.call.id === p.call.id)) throw new ServeError('SRV_ERR_TOOL_CALL', { detail: `message ${n + j}: call ${p.call.id} is answered twice` });
        answered.push({ turnIndex: p.turnIndex, call: p.call, text: m.content, latencyMs: now - p.sentMs });
        observation.push({ role: 'tool', content: m.content, tool_call_id: p.call.id, name: p.call.name });
      } else observation.push({ role: m.role, content: m.content });
    }
    const allTools = fresh.every((m) => m.role === 'tool');
    const latencyMs = answered.reduce((a, x) => Math.max(a, x.latencyMs), 0);
    let prepared: PreparedObservation | undefined;
    if (offload && promptChars(fresh, []) >= OFFLOAD_MIN_CHARS) {
      const ctx = this.ctx;
      prepared = await offload.worker.observe(observation, stopOfLastTurn(ctx), offload.templateKwargs, {
        mode: ctx.limits.tokenizationCheck,
        context: this.recorder.contextIds(),
        conversation: [...ctx.messages, ...observation],
        tools: ctx.tools.length > 0 ? ctx.tools : null,
      });
    }
    // As in the tool agent loop, the calls are recorded (ToolCallCompleted) before their results' turn.
    for (const a of answered) {
      this.pending.delete(a.call.id);
      // The client ran the tool: its result text is what it sends; the endpoint cannot tell a failure from a
      // result, so every answered call is 'ok' with no tool reward.
      this.recorder.addToolCall(a.turnIndex, a.call, { status: 'ok', text: a.text, reward: 0, metrics: {}, latencyMs: a.latencyMs });
      this.recorder.toolMs += a.latencyMs;
    }
    this.append(fresh);
    const appended = appendObservation(this.ctx, allTools ? 'tool' : 'user', observation, latencyMs, prepared);
    // appendObservation ran the check on what it appended; counted so a run shows the check ran (and found nothing).
    if (appended && this.ctx.limits.tokenizationCheck !== 'off') this.ctx.count('tokenization_checks');
    return appended;
  }

  /**
   * Generate the next assistant turn with this call's sampling and options; null when the response budget is
   * spent. With stop strings the turn ends at the token that completes the first one generated: the tokens
   * recorded are exactly those generated up to it, and the text returned ends before it.
   */
  async generate(sampling: SamplingParams, signal: AbortSignal, options: TurnOptions = {}): Promise<ServedTurn | null> {
    const stops = options.stop ?? [];
    const choice = options.toolChoice ?? 'auto';
    let backend = this.ctx.backend;
    if ((options.topLogprobs ?? 0) > 0) backend = withTopLogprobs(backend, options.topLogprobs!);
    const forced = forcedCallIds(choice, [...this.declaredTools], this.ctx.toolParser, this.ctx.tokenizer);
    if (forced) backend = forcePrefix(backend, forced);
    if (stops.length > 0) backend = stopAt(backend, stops, this.ctx.tokenizer);
    const limits = options.maxCalls === undefined ? this.ctx.limits : { ...this.ctx.limits, maxParallelToolCalls: Math.min(options.maxCalls, this.ctx.limits.maxParallelToolCalls) };
    const ctx: AgentContext = { ...this.ctx, sampling, signal, backend, limits };
    const turn = await generateTurn(ctx, choice !== 'none' && this.parseTools);
    if (!turn) return null;
    if (stops.length > 0) turn.parsed.content = cutAtStop(turn.parsed.content, stops);
    const calls: ToolCall[] = [];
    const refused: ToolCall[] = [];
    for (const c of turn.calls) (this.declaredTools.has(c.name) ? calls : refused).push(c);
    for (const c of refused) {
      // A call of a tool the session never offered is never handed to the client: it is recorded as the
      // rollout worker records one (unknown_tool), and the client sees only the turn's text.
      this.recorder.addToolCall(turn.turnIndex, c, { status: 'unknown_tool', text: `Error: the tool "${c.name}" is not declared in this trajectory's tools`, reward: 0, metrics: {}, latencyMs: 0 });
      this.ctx.count('tool_calls_refused');
    }
    for (let i = 0; i < turn.parsed.errors.length; i++) this.recorder.addParseFailure();
    const sent = Date.now();
    for (const c of calls) this.pending.set(c.id, { turnIndex: turn.turnIndex, call: c, sentMs: sent });
    const message: ClientMessage = {
      role: 'assistant',
      content: turn.parsed.content,
      tool_calls: calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments_json })),
      tool_call_id: null,
    };
    this.append([message]);
    if (refused.length > 0) this.logger.debug('tool call refused: tool not declared', { trajectory_id: this.id, tools: refused.map((c) => c.name) });
    // Recorded as generated; a forced call the policy did not complete validly fails the call (the service then
    // ends the trajectory: its client never got the turn).
    checkForcedCall(choice, turn, calls, refused);
    return { turn, calls, refused, message };
  }
}

/** The text before the first stop string in it (all of it when none occurs). */
export function cutAtStop(text: string, stops: readonly string[]): string {
  let end = text.length;
  for (const s of stops) {
    const i = text.indexOf(s);
    if (i >= 0 && i < end) end = i;
  }
  return text.slice(0, end);
}

/**
 * A backend whose turns end at the token that completes the first stop string generated (OpenAI's `stop`): the
 * backend generates the whole turn, and what follows that token is dropped before anything records it, so the
 * recorded tokens and their log-probs are a prefix of what the policy sampled (sampling a prefix does not
 * depend on what came after it). The finish reason is then `stop`.
 */
export function stopAt(backend: LlmBackend, stops: readonly string[], tokenizer: ChatTokenizer): LlmBackend {
  return wrapGenerate(backend, async (request, signal) => {
    const out = await backend.generate(request, signal);
    const ids = out.tokenIds;
    const has = (k: number) => {
      const text = tokenizer.decode(ids.slice(0, k));
      return cutAtStop(text, stops).length < text.length;
    };
    if (ids.length === 0 || !has(ids.length)) return out;
    // The shortest prefix whose text holds a stop string (a longer prefix's text extends a shorter one's).
    let lo = 1;
    let hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (has(mid)) hi = mid;
      else lo = mid + 1;
    }
    return {
      ...out,
      tokenIds: ids.slice(0, lo),
      logprobs: out.logprobs.slice(0, lo),
      policyVersions: out.policyVersions.length === ids.length ? out.policyVersions.slice(0, lo) : out.policyVersions,
      ...(out.topLogprobs ? { topLogprobs: out.topLogprobs.slice(0, lo) } : {}),
      ...(out.forced !== undefined ? { forced: Math.min(out.forced, lo) } : {}),
      finishReason: 'stop',
    };
  });
}
