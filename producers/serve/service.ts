// The serving endpoint's state behind its routes: open trajectories (sessions) by id and by conversation, their
// events published to rollout.events keyed by group_id as they happen (TrajectoryStarted on the first call,
// TurnCompleted / ToolCallCompleted per call, TrajectoryCompleted on complete or time-out), groups of n samples,
// and the limits (open sessions, idle time-out). Routes (server.ts) only translate HTTP to these calls.
import { setMaxListeners } from 'node:events';
import { describeError } from '../../core/errors.ts';
import { deriveId, newId } from '../../core/ids.ts';
import type { Logger } from '../../core/telemetry.ts';
import type { SamplingParams, Termination } from '../../schemas/generated/types.ts';
import { TrajectoryRecorder, type TrajectoryMeta } from '../agent/recorder.ts';
import { toolParser } from '../agent/tool-parser.ts';
import type { AgentContext, AgentLimits } from '../agent/types.ts';
import type { LlmBackend } from '../backends/types.ts';
import { Counters } from '../metrics.ts';
import type { RolloutOptions } from '../options.ts';
import type { EventPublisher } from '../publisher.ts';
import type { ChatMessage, ChatTokenizer, ChatTool } from '../tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from '../tokenizer/delta.ts';
import type { ToolChoice } from './constrain.ts';
import { ServeError } from './errors.ts';
import { OFFLOAD_MIN_CHARS, promptChars, type TokenizeOffload } from './offload.ts';
import { templateMessage } from './openai.ts';
import { ServeSession, conversationKey, type ClientMessage, type ServedTurn } from './session.ts';

export interface ServeLimits {
  /** Trajectories open at once; a new one beyond it is refused with 429. Default 1024. */
  maxSessions: number;
  /** A trajectory without a call for this long is completed as `aborted`. Default 600 000 ms. */
  idleTimeoutMs: number;
  /** Trajectories one token may hold open at once (its fair share of maxSessions; 429 above). Default maxSessions. */
  maxSessionsPerToken?: number;
  /** Calls one token may have in flight at once (429 above). Default 256. */
  maxCallsPerToken?: number;
  /** Longest prompt in tokens; a longer one is refused with 400 before anything is generated. Default: no limit here. */
  maxPromptTokens?: number;
}

/** Who makes a call: the name of its bearer token (fair shares are counted per holder). */
export const ANONYMOUS = '';

export interface ServeServiceDeps {
  runId: string;
  backend: LlmBackend;
  tokenizer: ChatTokenizer;
  publisher: EventPublisher;
  /** The run's rollout options: sampling defaults, response budget, tool parser, tokenization check, template kwargs. */
  rollout: RolloutOptions;
  limits: ServeLimits;
  /** Recorded as data_source when the client names none (the reward consumer scores by it). */
  dataSource: string;
  /** Recorded in DatasetRef.name. */
  datasetName: string;
  /** Where big prompts are tokenized, off the event loop (absent: all on it). */
  offload?: TokenizeOffload;
  logger: Logger;
}

/** How the client names the trajectory of a call (header or metadata; see docs/serve.md). */
export interface SessionNaming {
  trajectoryId?: string;
  groupId?: string;
  groupSize?: number;
  sampleIndex?: number;
  dataSource?: string;
  groundTruth?: string;
  agentName?: string;
}

export interface ChatCall {
  /** The conversation as the client sends it. */
  messages: ClientMessage[];
  tools: ChatTool[];
  sampling: SamplingParams;
  n: number;
  naming: SessionNaming;
  /** The token holder making the call (fair shares). */
  holder?: string;
  /** What this call's turn may return, besides the sampling: see TurnOptions. */
  turn?: TurnOptions;
}

/** Per-call options of a generated turn (OpenAI's stop, tool_choice, parallel_tool_calls false, top_logprobs). */
export interface TurnOptions {
  /** The returned text ends before the first of these the policy generated; generation ends at the token completing it. */
  stop?: readonly string[];
  /**
   * none: no tool call is read out of the turn (its text is the content); required / a named function: the turn
   * is forced to open a call (constrain.ts). Default auto.
   */
  toolChoice?: ToolChoice;
  /** At most this many calls are returned (parallel_tool_calls false: 1). */
  maxCalls?: number;
  /** Alternatives per token from the backend (top_logprobs), at most backend.maxTopLogprobs. */
  topLogprobs?: number;
}

export interface ChoiceResult {
  session: ServeSession;
  /** Null when the trajectory's response budget was spent before anything could be generated. */
  served: ServedTurn | null;
  /** Set when this call completed the trajectory. */
  completed: Termination | null;
  promptTokens: number;
}

/** Completed trajectory ids remembered (a late call names a completed one: 409, not a new trajectory). */
const REMEMBERED = 65_536;

export class ServeService {
  readonly counters = new Counters();
  private readonly sessions = new Map<string, ServeSession>();
  private readonly byConversation = new Map<string, string>();
  private readonly done = new Map<string, Termination>();
  private readonly nextIndex = new Map<string, number>();
  /** Per token holder: trajectories open and calls in flight (their fair shares). */
  private readonly held = new Map<string, { sessions: number; calls: number }>();
  private readonly delta: DeltaTokenizer;
  private readonly abort = new AbortController();
  private readonly sweeper: NodeJS.Timeout;
  private checkCounter = 0;
  private datasetIndex = 0;
  private closed = false;

  constructor(private readonly deps: ServeServiceDeps) {
    this.delta = new DeltaTokenizer(deps.tokenizer, { ...deps.rollout.templateKwargs });
    setMaxListeners(0, this.abort.signal);
    this.sweeper = setInterval(() => void this.sweep(), Math.max(50, Math.min(5_000, deps.limits.idleTimeoutMs / 4)));
    this.sweeper.unref();
  }

  get openSessions(): number {
    return this.sessions.size;
  }

  /** Default sampling of the run, with what a request sets. */
  sampling(request: { temperature?: number | null; top_p?: number | null; top_k?: number | null; max_tokens?: number | null; max_completion_tokens?: number | null; seed?: number | null }): SamplingParams {
    const d = this.deps.rollout.sampling;
    return {
      temperature: request.temperature ?? d.temperature,
      top_p: request.top_p ?? d.top_p,
      top_k: request.top_k ?? d.top_k,
      max_new_tokens: request.max_completion_tokens ?? request.max_tokens ?? d.max_new_tokens,
      seed: request.seed ?? d.seed,
      stop_token_ids: [...d.stop_token_ids],
    };
  }

  session(id: string): ServeSession {
    const s = this.sessions.get(id);
    if (s) return s;
    const t = this.done.get(id);
    if (t) throw new ServeError('SRV_ERR_TRAJECTORY_DONE', { id, termination: t });
    throw new ServeError('SRV_ERR_TRAJECTORY_UNKNOWN', { id });
  }

  /** One chat call: continue the trajectory it names (or whose conversation it continues), or open new ones. */
  async chat(call: ChatCall): Promise<ChoiceResult[]> {
    this.checkTurn(call.turn ?? {}, call.tools);
    const existing = this.find(call);
    if (existing) {
      if (call.n !== 1) throw new ServeError('SRV_ERR_GROUP', { detail: 'n > 1 opens a group of new trajectories; a continued trajectory takes n = 1' }, { param: 'n' });
      const names = call.tools.map((t) => t.function.name).join(',');
      const had = existing.ctx.tools.map((t) => t.function.name).join(',');
      if (names !== had) throw new ServeError('SRV_ERR_TOOLS_CHANGED', { detail: `now [${names}], started with [${had}]` }, { param: 'tools' });
      return [await this.held_(call.holder, () => this.turn(existing, call, true))];
    }
    return this.held_(call.holder, async () => this.openAndServe([{ call, rendered: await this.render(call) }]));
  }

  private find(call: ChatCall): ServeSession | null {
    const id = call.naming.trajectoryId;
    if (id !== undefined) {
      const s = this.sessions.get(id);
      if (s) return s;
      const t = this.done.get(id);
      if (t) throw new ServeError('SRV_ERR_TRAJECTORY_DONE', { id, termination: t });
      return null;
    }
    // Unnamed: the conversation up to its last assistant message is the key of the trajectory that answered it
    // (compared as values: see conversationKey).
    let last = -1;
    for (let i = call.messages.length - 1; i >= 0; i--) {
      if (call.messages[i]!.role === 'assistant') {
        last = i;
        break;
      }
    }
    if (last < 0) return null;
    const sid = this.byConversation.get(conversationKey(call.tools, call.messages.slice(0, last + 1)));
    return sid === undefined ? null : (this.sessions.get(sid) ?? null);
  }

  /**
   * Text completions: each prompt is tokenized as it is (no chat template) and opens its own group of n
   * trajectories; each stays open for its reward until completed or timed out. All open, or none does.
   */
  async text(call: { prompts: readonly string[]; sampling: SamplingParams; n: number; naming: SessionNaming; holder?: string; turn?: TurnOptions }): Promise<ChoiceResult[]> {
    this.checkTurn(call.turn ?? {}, [], 'logprobs');
    const id = call.naming.trajectoryId;
    if (id !== undefined && (this.sessions.has(id) || this.done.has(id))) {
      throw new ServeError('SRV_ERR_HISTORY', { detail: `a text completion opens a new trajectory and ${id} exists; continue a conversation on /v1/chat/completions` });
    }
    if (call.prompts.length > 1 && (call.naming.trajectoryId !== undefined || call.naming.groupId !== undefined)) {
      throw new ServeError('SRV_ERR_GROUP', { detail: 'a list of prompts opens one group per prompt; name no trajectory or group' }, { param: 'prompt' });
    }
    return this.held_(call.holder, async () => {
      const opens = [];
      for (const [i, prompt] of call.prompts.entries()) {
        const chat: ChatCall = { messages: [{ role: 'user', content: prompt, tool_calls: [], tool_call_id: null }], tools: [], sampling: call.sampling, n: call.n, naming: call.naming, ...(call.holder !== undefined ? { holder: call.holder } : {}), turn: { ...call.turn, toolChoice: 'none' } };
        const offload = this.deps.offload;
        const ids = offload && prompt.length >= OFFLOAD_MIN_CHARS ? await offload.text(prompt) : this.deps.tokenizer.encode(prompt);
        this.checkPromptLength(ids.length, 'prompt', call.prompts.length > 1 ? ` (prompt ${i})` : '');
        opens.push({ call: chat, rendered: { prompt: [{ role: 'user', content: prompt }], ids } });
      }
      return this.openAndServe(opens, true);
    });
  }

  /** What a call's turn options ask of the backend and the tool format, checked before anything opens. */
  private checkTurn(turn: TurnOptions, tools: readonly ChatTool[], topParam = 'top_logprobs'): void {
    const k = turn.topLogprobs ?? 0;
    const most = this.deps.backend.maxTopLogprobs ?? 0;
    if (k > most) {
      const detail = most === 0 ? `the ${this.deps.backend.name} backend returns no alternatives (only the sampled tokens' log-probs)` : `the ${this.deps.backend.name} backend returns at most ${most}`;
      throw new ServeError('SRV_ERR_VALIDATION', { detail: `${topParam}: ${k} alternatives asked; ${detail}` }, { param: topParam });
    }
    const choice = turn.toolChoice ?? 'auto';
    if (choice === 'auto' || choice === 'none') return;
    const parser = toolParser(this.deps.rollout.toolParser)!;
    if (!parser.callPrefix) throw new ServeError('SRV_ERR_VALIDATION', { detail: `tool_choice: the tool-call format ${parser.name} (rollout.tool_parser) cannot be forced; only auto and none` }, { param: 'tool_choice' });
    if (tools.length === 0) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'tool_choice: a call is required but the request declares no tools' }, { param: 'tool_choice' });
    if (typeof choice === 'object' && !tools.some((t) => t.function.name === choice.name)) {
      throw new ServeError('SRV_ERR_VALIDATION', { detail: `tool_choice.function.name: ${JSON.stringify(choice.name)} is not one of the request's tools` }, { param: 'tool_choice.function.name' });
    }
  }

  /** Count a call in flight against its holder's share while it runs. */
  private async held_<T>(holder: string | undefined, run: () => Promise<T>): Promise<T> {
    const h = this.holding(holder ?? ANONYMOUS);
    const share = this.deps.limits.maxCallsPerToken ?? 256;
    if (h.calls >= share) throw new ServeError('SRV_ERR_FAIR_SHARE', { held: h.calls, share, what: 'calls in flight' });
    h.calls++;
    try {
      return await run();
    } finally {
      h.calls--;
      this.release(holder ?? ANONYMOUS);
    }
  }

  private holding(holder: string): { sessions: number; calls: number } {
    let h = this.held.get(holder);
    if (!h) this.held.set(holder, (h = { sessions: 0, calls: 0 }));
    return h;
  }

  private release(holder: string): void {
    const h = this.held.get(holder);
    if (h && h.sessions === 0 && h.calls === 0) this.held.delete(holder);
  }

  private checkPromptLength(tokens: number, param: 'messages' | 'prompt', where = ''): void {
    const limit = this.deps.limits.maxPromptTokens;
    if (limit !== undefined && tokens > limit) throw new ServeError('SRV_ERR_PROMPT_TOO_LONG', { tokens, limit, detail: where }, { param });
  }

  /**
   * Open the trajectories of one or more prompts (a group of n each) and generate their first turns. Every check
   * comes before anything opens; a trajectory whose first turn fails is dropped (its slot freed, nothing
   * published: its TrajectoryStarted goes out with its first turn), and when any fails the call fails whole:
   * the others that did start are completed as `error` (the client never learned their ids).
   */
  private async openAndServe(opens: { call: ChatCall; rendered: { prompt: ChatMessage[]; ids: number[] } }[], text = false): Promise<ChoiceResult[]> {
    if (this.closed) throw new ServeError('SRV_ERR_BACKEND', { detail: 'the endpoint is shutting down' });
    const total = opens.reduce((a, o) => a + o.call.n, 0);
    if (this.sessions.size + total > this.deps.limits.maxSessions) throw new ServeError('SRV_ERR_SESSIONS_FULL', { limit: this.deps.limits.maxSessions });
    const holder = opens[0]!.call.holder ?? ANONYMOUS;
    const h = this.holding(holder);
    const share = this.deps.limits.maxSessionsPerToken ?? this.deps.limits.maxSessions;
    if (h.sessions + total > share) throw new ServeError('SRV_ERR_FAIR_SHARE', { held: h.sessions, share, what: 'open trajectories' });
    const plans: (typeof opens[number] & ReturnType<ServeService['plan']>)[] = [];
    try {
      for (const o of opens) plans.push({ ...o, ...this.plan(o.call) });
    } catch (err) {
      for (const p of plans) p.rollback();
      throw err;
    }
    const sessions = plans.flatMap((p, k) => p.ids.map((ids) => ({ session: this.create(p.call, p.rendered.prompt, p.rendered.ids, ids), call: p.call, plan: k })));
    if (text) for (const s of sessions) s.session.parseTools = false;
    const settled = await Promise.allSettled(sessions.map((s) => this.turn(s.session, s.call, false)));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (!failed) return settled.map((r) => (r as PromiseFulfilledResult<ChoiceResult>).value);
    for (const { session } of sessions) await this.finish(session, 'error');
    // A group none of whose samples started gives its indices back (a retry fills them).
    for (const [k, p] of plans.entries()) if (!sessions.some((s) => s.plan === k && s.session.started)) p.rollback();
    throw failed.reason;
  }

  /** The ids of a new group's samples, checked (group bounds, ids free) before anything opens. */
  private plan(call: ChatCall): { ids: { trajectoryId: string; groupId: string; sampleIndex: number; groupSize: number }[]; rollback: () => void } {
    const { naming, n } = call;
    if (naming.trajectoryId !== undefined && n > 1) throw new ServeError('SRV_ERR_GROUP', { detail: 'a named trajectory is one sample; name the group (X-Rlstream-Group) or leave the trajectory unnamed with n > 1' }, { param: 'n' });
    const groupId = naming.groupId ?? newId();
    const groupSize = naming.groupSize ?? n;
    const first = naming.sampleIndex ?? (naming.groupId === undefined ? 0 : (this.nextIndex.get(groupId) ?? 0));
    if (first + n > groupSize) throw new ServeError('SRV_ERR_GROUP', { detail: `samples ${first}..${first + n - 1} do not fit a group of ${groupSize}` });
    const out: { trajectoryId: string; groupId: string; sampleIndex: number; groupSize: number }[] = [];
    for (let k = 0; k < n; k++) {
      const sampleIndex = first + k;
      const trajectoryId = naming.trajectoryId ?? deriveId(groupId, 'trajectory', sampleIndex);
      if (this.sessions.has(trajectoryId) || this.done.has(trajectoryId)) throw new ServeError('SRV_ERR_GROUP', { detail: `sample ${sampleIndex} of group ${groupId} already exists (trajectory ${trajectoryId})` });
      out.push({ trajectoryId, groupId, sampleIndex, groupSize });
    }
    // Only now, with the call accepted: a refused call takes no sample index of a named group.
    if (naming.groupId !== undefined && naming.sampleIndex === undefined) {
      if (first + n >= groupSize) this.nextIndex.delete(groupId);
      else {
        this.nextIndex.set(groupId, first + n);
        // Groups a client names and never fills must not grow the table without bound.
        if (this.nextIndex.size > REMEMBERED) this.nextIndex.delete(this.nextIndex.keys().next().value!);
      }
    }
    // A call that fails gives its sample indices back, unless a later call of the group took the next ones.
    const rollback = () => {
      if (naming.groupId === undefined || naming.sampleIndex !== undefined) return;
      const now = this.nextIndex.get(groupId);
      if (now === first + n || (now === undefined && first + n >= groupSize)) this.nextIndex.set(groupId, first);
    };
    return { ids: out, rollback };
  }

  /**
   * The prompt as the chat template renders it (once for all samples of a group), within the prompt limit; a big
   * one in the tokenizer worker (the same template and tokenizer, without the delta tokenizer's caches).
   */
  private async render(call: ChatCall): Promise<{ prompt: ChatMessage[]; ids: number[] }> {
    const toolNames = new Map<string, string>();
    for (const m of call.messages) for (const c of m.tool_calls) toolNames.set(c.id, c.name);
    const prompt: ChatMessage[] = call.messages.map((m) => templateMessage(m, toolNames));
    const tools = call.tools.length > 0 ? call.tools : null;
    const offload = this.deps.offload;
    let ids: number[];
    try {
      ids = offload && promptChars(call.messages, call.tools) >= OFFLOAD_MIN_CHARS ? await offload.chat(prompt, tools, { ...this.deps.rollout.templateKwargs }) : this.delta.promptIds(prompt, tools);
    } catch (err) {
      throw new ServeError('SRV_ERR_VALIDATION', { detail: `the chat template cannot render these messages: ${describeError(err)}` }, { cause: err });
    }
    this.checkPromptLength(ids.length, 'messages');
    return { prompt, ids };
  }

  private create(call: ChatCall, prompt: ChatMessage[], promptIds: number[], ids: { trajectoryId: string; groupId: string; sampleIndex: number; groupSize: number }): ServeSession {
    const { naming } = call;
    const o = this.deps.rollout;
    const meta: TrajectoryMeta = {
      runId: this.deps.runId,
      ...ids,
      agentName: naming.agentName ?? 'serve',
      dataSource: naming.dataSource ?? this.deps.dataSource,
      // Served trajectories are training data: the advantage consumer and the trainer take only split `train`.
      dataset: { name: this.deps.datasetName, split: 'train', index: this.datasetIndex++ },
      groundTruth: naming.groundTruth ?? '',
      extraInfoJson: JSON.stringify({ source: 'serve' }),
    };
    const publisher = this.deps.publisher;
    // TrajectoryStarted goes out just before the first turn's event: a trajectory whose first call fails
    // publishes nothing at all.
    let session: ServeSession | null = null;
    const start = () => {
      if (session && !session.started) {
        // Encoding throws before anything is queued: a trajectory whose start cannot be written stays unstarted.
        publisher.fire('TrajectoryStarted', ids.groupId, session.startedEvent(policyVersion));
        session.started = true;
      }
    };
    const recorder = new TrajectoryRecorder(meta, promptIds, this.deps.tokenizer, {
      turn: (ev) => {
        start();
        publisher.fire('TurnCompleted', ids.groupId, ev);
      },
      toolCall: (ev) => {
        start();
        publisher.fire('ToolCallCompleted', ids.groupId, ev);
      },
    });
    const limits: AgentLimits = {
      maxAssistantTurns: o.maxAssistantTurns,
      maxUserTurns: o.maxUserTurns,
      responseLength: o.responseLength,
      maxParallelToolCalls: o.maxParallelToolCalls,
      maxToolErrors: o.maxToolErrors,
      tokenizationCheck: this.checkCounter++ % o.tokenizationCheckEvery === 0 ? o.tokenizationCheck : 'off',
    };
    const ctx: AgentContext = {
      trajectoryId: ids.trajectoryId,
      row: { data_source: meta.dataSource, prompt, reward_model: { ground_truth: meta.groundTruth }, extra_info: { split: 'train' } },
      messages: [...prompt],
      tools: call.tools,
      sampling: call.sampling,
      limits,
      backend: this.deps.backend,
      tokenizer: this.deps.tokenizer,
      delta: this.delta,
      toolParser: toolParser(o.toolParser)!,
      toolSession: null,
      interaction: null,
      recorder,
      signal: this.abort.signal,
      logger: this.deps.logger,
      count: (name, by) => this.counters.add(name, by),
    };
    const policyVersion = this.deps.backend.currentPolicyVersion();
    session = new ServeSession(ctx, call.messages, new Set(call.tools.map((t) => t.function.name)), this.deps.logger, call.holder ?? ANONYMOUS);
    this.sessions.set(session.id, session);
    this.holding(session.holder).sessions++;
    this.counters.add('trajectories_started');
    return session;
  }

  private async turn(session: ServeSession, call: ChatCall, continued: boolean): Promise<ChoiceResult> {
    if (session.busy) throw new ServeError('SRV_ERR_TRAJECTORY_BUSY', { id: session.id });
    session.busy = true;
    session.lastUsedMs = Date.now();
    const before = session.key();
    try {
      const offload = this.deps.offload ? { worker: this.deps.offload, templateKwargs: { ...this.deps.rollout.templateKwargs } } : undefined;
      if (continued && !(await session.observe(call.messages, offload))) {
        return { session, served: null, completed: await this.finish(session, 'max_tokens'), promptTokens: session.recorder.contextIds().length };
      }
      const promptTokens = session.recorder.promptIds.length + session.recorder.responseLength;
      let served: ServedTurn | null;
      try {
        served = await session.generate({ ...call.sampling, stop_token_ids: [...call.sampling.stop_token_ids] }, this.abort.signal, call.turn ?? {});
      } catch (err) {
        if (err instanceof ServeError && err.code === 'SRV_ERR_MODEL_OUTPUT') {
          // The turn is recorded, but its client gets an error instead of it, so the conversation cannot go on:
          // the trajectory ends here (a new one's failure ends it, and its group, in openAndServe).
          this.counters.add('forced_calls_failed');
          if (continued) await this.finish(session, 'error');
          throw err;
        }
        if (this.abort.signal.aborted) throw new ServeError('SRV_ERR_BACKEND', { detail: 'the endpoint is shutting down' }, { cause: err });
        throw new ServeError('SRV_ERR_BACKEND', { detail: describeError(err) }, { cause: err });
      }
      this.counters.add('turns');
      let completed: Termination | null = null;
      const rec = session.recorder;
      if (!served) completed = await this.finish(session, 'max_tokens');
      else if (served.turn.gen.finishReason === 'abort') completed = await this.finish(session, 'aborted');
      // The response budget is spent: nothing more can be appended, so the trajectory ends here (as a loop's would).
      else if (rec.responseLength >= session.ctx.limits.responseLength) completed = await this.finish(session, 'max_tokens');
      else {
        this.byConversation.delete(before);
        this.byConversation.set(session.key(), session.id);
      }
      return { session, served, completed, promptTokens };
    } finally {
      session.busy = false;
      session.lastUsedMs = Date.now();
    }
  }

  /** End a trajectory (client complete, time-out, budget, shutdown) and publish TrajectoryCompleted. */
  async complete(id: string, options: { reward?: number | null; groundTruth?: string; termination?: Termination } = {}): Promise<ServeSession> {
    const session = this.session(id);
    if (session.busy) throw new ServeError('SRV_ERR_TRAJECTORY_BUSY', { id });
    const meta = session.meta;
    if (options.groundTruth !== undefined) meta.groundTruth = options.groundTruth;
    if (options.reward !== undefined && options.reward !== null) {
      if (!Number.isFinite(options.reward)) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'reward must be a finite number' });
      // Trajectory.external_reward: the reward role takes it as the outcome instead of scoring the text.
      meta.externalReward = options.reward;
    }
    await this.finish(session, options.termination ?? 'stop');
    return session;
  }

  /**
   * The one way a trajectory ends: its slot is freed, and a trajectory that started (published its
   * TrajectoryStarted with its first turn) publishes TrajectoryCompleted. One that never started publishes
   * nothing and is forgotten: a client may open it again under the same name.
   */
  private async finish(session: ServeSession, termination: Termination): Promise<Termination> {
    if (session.completed) return session.completed;
    session.completed = termination;
    this.sessions.delete(session.id);
    this.byConversation.delete(session.key());
    const h = this.holding(session.holder);
    h.sessions--;
    this.release(session.holder);
    this.deps.backend.releaseSession?.(session.id);
    if (!session.started) {
      this.counters.add('trajectories_dropped');
      return termination;
    }
    this.done.set(session.id, termination);
    if (this.done.size > REMEMBERED) this.done.delete(this.done.keys().next().value!);
    const trajectory = session.recorder.finish(termination, session.ctx.limits.responseLength);
    this.counters.add(`termination_${termination}`);
    this.counters.add('trajectories_completed');
    this.counters.add('tokenization_mismatches_total', session.recorder.tokenizationMismatches);
    try {
      await this.deps.publisher.publish('TrajectoryCompleted', session.meta.groupId, { event_id: deriveId(session.id, 'completed'), time_ms: Date.now(), trajectory });
    } catch (err) {
      this.counters.add('completed_publish_failures');
      this.deps.logger.error('TrajectoryCompleted publish failed', { trajectory_id: session.id, error: describeError(err) });
    }
    return termination;
  }

  /** Complete, as `aborted`, every trajectory idle for longer than the time-out. */
  async sweep(now = Date.now()): Promise<number> {
    const stale = [...this.sessions.values()].filter((s) => !s.busy && now - s.lastUsedMs > this.deps.limits.idleTimeoutMs);
    for (const s of stale) {
      this.counters.add('trajectories_timed_out');
      await this.finish(s, 'aborted');
    }
    if (stale.length > 0) this.deps.logger.info('idle trajectories completed as aborted', { count: stale.length });
    return stale.length;
  }

  /** Stop serving: calls in flight are aborted, open trajectories completed as `aborted`, events flushed. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.sweeper);
    this.abort.abort();
    for (let i = 0; i < 100 && [...this.sessions.values()].some((s) => s.busy); i++) await new Promise((r) => setTimeout(r, 10));
    for (const s of [...this.sessions.values()]) await this.finish(s, 'aborted');
    await this.deps.offload?.close();
    await this.deps.publisher.flush();
  }
}
