// The rollout worker: turns dataset rows into groups of trajectories by running agent loops with
// bounded concurrency, and publishes every trajectory to TOPICS.rolloutEvents (keyed by group_id) as it
// happens: TrajectoryStarted, TurnCompleted and ToolCallCompleted, then TrajectoryCompleted.
// A staleness gate (AReaL) holds back new groups while
//   groupsStarted >= (currentPolicyVersion + stalenessBound + 1) * groupsPerStep
// or while the in-flight budget is used up; new PolicyVersion events (checksum verified, then handed to
// the backend) and Control events (pause, resume, set_staleness, stop) open or close it.
import { setMaxListeners } from 'node:events';
import type { Registry } from '../core/config/registry.ts';
import { describeError, RlstreamError } from '../core/errors.ts';
import { deriveId, newId } from '../core/ids.ts';
import { followControl } from '../core/control.ts';
import { follow, type Follower } from '../core/log/follow.ts';
import type { EventLog, LogRecord, Producer } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { silentLogger, type Logger } from '../core/telemetry.ts';
import { TOPICS } from '../core/topics.ts';
import type { Control, PolicyVersion, SamplingParams, Termination, Trajectory } from '../schemas/generated/types.ts';
import type { Interaction } from './agent/interaction.ts';
import { toEventMessages } from './agent/loops.ts';
import { TrajectoryRecorder, type TrajectoryMeta } from './agent/recorder.ts';
import { agentLoops } from './agent/registry.ts';
import { toolParser } from './agent/tool-parser.ts';
import type { AgentContext, AgentLimits, AgentLoop } from './agent/types.ts';
import type { LlmBackend } from './backends/types.ts';
import type { DatasetRow, RowSource } from './dataset/types.ts';
import { Counters, LatencyReservoir } from './metrics.ts';
import type { RolloutOptions } from './options.ts';
import { verifyPolicyVersion } from './policy-sync.ts';
import { EventPublisher } from './publisher.ts';
import { sampleKey, sampleTrajectoryId, type ResumePoint } from './resume.ts';
import type { ChatMessage, ChatTokenizer } from './tokenizer/chat-tokenizer.ts';
import { DeltaTokenizer } from './tokenizer/delta.ts';
import type { ToolSet } from './tools/tool-set.ts';

export interface RolloutWorkerDeps {
  runId: string;
  /** The log: events are produced to it; policy versions and control are consumed from it. */
  log: EventLog;
  /** Initialised serde (init() called). */
  serde: EventSerde;
  backend: LlmBackend;
  tokenizer: ChatTokenizer;
  /** Tools of the run (none by default). */
  tools?: ToolSet;
  /** User simulators by name (rows pick one with extra_info.interaction_kwargs.name). */
  interactions?: Registry<Interaction>;
  /** Agent loops (default: the built-ins). */
  agents?: Registry<AgentLoop>;
  /** A producer to share; by default the worker opens (and closes) its own. */
  producer?: Producer;
  /** Consume policy.versions and control (default true). */
  followPolicy?: boolean;
  workerId?: string;
  /**
   * What earlier lives of this run completed, and this life's tag for trajectory ids (producers/resume.ts): on a
   * restart completed samples are not run again and the others run under new ids, so a crash neither duplicates
   * nor loses a trajectory, and no (trajectory, turn_index) is published in two versions.
   */
  resume?: ResumePoint;
  logger?: Logger;
}

export interface EvaluateOptions {
  /** Default: greedy (temperature 0) with the run's other sampling settings. */
  sampling?: Partial<SamplingParams>;
  /** Samples per row (default 1). */
  n?: number;
  /** Split recorded in DatasetRef (default 'heldout': the trainer never learns from it). */
  split?: string;
}

export interface WorkerSnapshot {
  running: boolean;
  paused: boolean;
  stopping: boolean;
  /** Why no new group starts right now, or null. */
  blockedBy: 'paused' | 'staleness' | 'inflight' | null;
  policyVersion: number;
  stalenessBound: number | null;
  groupsStarted: number;
  trajectoriesStarted: number;
  trajectoriesCompleted: number;
  inflight: number;
  terminations: Record<string, number>;
  turns: number;
  toolCalls: number;
  toolSuccessRate: number;
  generatedTokens: number;
  tokensPerSecond: number;
  trajectoriesPerSecond: number;
  eventsPublished: number;
  eventsFailed: number;
  eventsPerSecond: number;
  trajectoryLatencyMs: ReturnType<LatencyReservoir['summary']>;
  generationLatencyMs: ReturnType<LatencyReservoir['summary']>;
  toolLatencyMs: ReturnType<LatencyReservoir['summary']>;
  counters: Record<string, number>;
  uptimeMs: number;
}

type SourceFactory = RowSource | ((epoch: number) => RowSource);

interface PromptCache {
  ids?: number[];
  error?: unknown;
}

/** One sample of a group to run, as startGroup builds it: what trajectory() needs. */
interface TrajectorySample {
  row: DatasetRow;
  agentName: string;
  /** The row's position in the source (the dataset index when the row names none). */
  position: number;
  groupId: string;
  /** 0..groupSize-1 within the group. */
  sampleIndex: number;
  /** The group's expected size (rollout n). */
  groupSize: number;
  split: string;
  sampling: SamplingParams;
  /** Shared by the group's samples: their prompt is rendered and tokenized once. */
  prompt: PromptCache;
}

export class RolloutWorker {
  readonly options: RolloutOptions;
  readonly workerId: string;
  private readonly logger: Logger;
  private readonly agents: Registry<AgentLoop>;
  private readonly delta: DeltaTokenizer;
  private readonly counters = new Counters();
  private readonly trajLatency = new LatencyReservoir();
  private readonly genLatency = new LatencyReservoir();
  private readonly toolLatency = new LatencyReservoir();
  private readonly abort = new AbortController();
  private readonly inflightTasks = new Set<Promise<unknown>>();
  private producer: Producer | undefined;
  private ownsProducer = false;
  private publisher: EventPublisher | undefined;
  /** Policy versions and control, while the worker is open (followPolicy). */
  private followers: Follower[] = [];
  private readonly startedMs = Date.now();
  private stalenessBound: number | null;
  /** The newest policy version the backend has applied (the staleness gate counts from it). */
  private currentPolicyVersion: number;
  private paused = false;
  private stopping = false;
  private running = false;
  private groupsStarted = 0;
  private checkCounter = 0;
  private inflight = 0;
  private slotsFree: number;
  private readonly slotWaiters: (() => void)[] = [];
  private changed: (() => void)[] = [];
  private applying: Promise<void> = Promise.resolve();

  constructor(
    private readonly deps: RolloutWorkerDeps,
    /** Compiled (producers/options.ts: compileRolloutSection, then completeRolloutOptions): validated once, at start-up. */
    options: RolloutOptions,
  ) {
    this.options = options;
    if (!deps.runId) throw new RlstreamError('CONFIG_INVALID', 'rollout worker needs a run id');
    this.workerId = deps.workerId ?? newId();
    this.logger = (deps.logger ?? silentLogger).child({ role: 'rollout', run_id: deps.runId, worker_id: this.workerId });
    this.agents = deps.agents ?? agentLoops.copy();
    if (!this.agents.has(this.options.defaultAgent)) throw new RlstreamError('CONFIG_INVALID', `rollout.default_agent: unknown agent loop "${this.options.defaultAgent}"`);
    this.delta = new DeltaTokenizer(deps.tokenizer, { ...this.options.templateKwargs });
    this.stalenessBound = this.options.stalenessBound;
    this.currentPolicyVersion = deps.backend.currentPolicyVersion();
    this.slotsFree = this.options.concurrency;
    // Every in-flight call listens on the one stop signal; thousands of listeners are expected.
    setMaxListeners(0, this.abort.signal);
  }

  // ---- lifecycle -------------------------------------------------------------------------------

  private async open(): Promise<EventPublisher> {
    if (!this.publisher) {
      this.producer = this.deps.producer ?? (await this.deps.log.producer());
      this.ownsProducer = this.deps.producer === undefined;
      this.publisher = new EventPublisher(this.producer, this.deps.serde, TOPICS.rolloutEvents, this.logger);
    }
    if ((this.deps.followPolicy ?? true) && this.followers.length === 0 && !this.closed) {
      const onError = (err: unknown, where: string, record?: LogRecord) => {
        if (where === 'decode') {
          this.counters.add('undecodable_records');
          this.logger.warn('undecodable record on a followed topic', { topic: record?.topic, offset: record?.offset, error: describeError(err) });
          return;
        }
        this.counters.add('follow_errors');
        this.logger.warn('following policy versions / control failed; retrying', { error: describeError(err) });
      };
      this.followers.push(
        follow(this.deps.log, (records) => this.onPolicyRecords(records, onError), {
          consumer: () => ({ groupId: `rollout-${this.deps.runId}-${this.workerId}`, topics: [TOPICS.policyVersions], fromBeginning: true }),
          poll: { timeoutMs: this.options.pollIntervalMs, maxRecords: 500 },
          retryDelayMs: this.options.pollIntervalMs,
          onError,
        }),
        // Its own consumer: a stop or a pause never waits behind a policy version being applied.
        followControl(this.deps.log, this.deps.serde, {
          runId: this.deps.runId,
          startedMs: this.startedMs,
          role: `rollout-${this.workerId}`,
          onControl: (c) => this.onControl(c),
          poll: { timeoutMs: this.options.pollIntervalMs, maxRecords: 500 },
          retryDelayMs: this.options.pollIntervalMs,
          onError,
        }),
      );
    }
    return this.publisher;
  }

  /**
   * Run every row of the source (epochs times; pass a function of the epoch to re-open a file per
   * epoch) through the agent loops; resolves when all trajectories are published or after stop().
   */
  async run(source: SourceFactory): Promise<void> {
    if (this.running) throw new RlstreamError('INTERNAL', 'RolloutWorker.run() is already running');
    this.running = true;
    await this.open();
    try {
      for (let epoch = 0; this.options.epochs === null || epoch < this.options.epochs; epoch++) {
        if (this.stopping) break;
        if (epoch > 0 && typeof source !== 'function' && !isReiterable(source)) break;
        const rows = typeof source === 'function' ? source(epoch) : source;
        let position = 0;
        let any = false;
        for await (const row of rows as AsyncIterable<DatasetRow>) {
          any = true;
          if (!(await this.admit())) break;
          this.startGroup(row, position++, epoch, this.rowSplit(row), this.options.sampling, this.options.n, true);
        }
        if (this.stopping || !any) break;
      }
      await this.drainInflight();
    } finally {
      this.running = false;
    }
  }

  /**
   * Evaluation: run the rows once (greedy by default), bypassing the staleness gate, and return the
   * completed trajectories in row order; events are still published, with dataset.split 'heldout'.
   */
  async evaluate(rows: readonly DatasetRow[], options: EvaluateOptions = {}): Promise<Trajectory[]> {
    await this.open();
    const sampling = { ...this.options.sampling, temperature: 0, ...options.sampling };
    const n = options.n ?? 1;
    const evalRun = deriveId(this.deps.runId, 'eval', newId());
    const results = rows.map((row, i) => this.startGroup(row, i, 0, options.split ?? 'heldout', sampling, n, false, evalRun));
    const groups = await Promise.all(results);
    return groups.flat();
  }

  /**
   * Run `fn` with the backend held at the version it serves now (passed to fn): no new policy version is applied
   * until fn settles, so an evaluation run inside it is of that one version. Rollouts go on meanwhile, on that
   * version; versions that arrive are applied after it, newest first.
   */
  async holdingPolicy<T>(fn: (version: number) => Promise<T>): Promise<T> {
    this.holds++;
    const held = this.applying.then(() => fn(this.deps.backend.currentPolicyVersion()));
    this.applying = held.then(
      () => undefined,
      () => undefined,
    );
    try {
      return await held;
    } finally {
      this.holds--;
    }
  }

  /** Holds queued or running: the follower does not wait for a version's application meanwhile. */
  private holds = 0;

  /** Stop starting groups; `abort` ends in-flight trajectories now (termination 'aborted'). */
  async stop(options: { abort?: boolean } = {}): Promise<void> {
    this.stopping = true;
    if (options.abort) this.abort.abort(new RlstreamError('BACKEND_UNAVAILABLE', 'rollout worker stopped', { retriable: false }));
    this.notify();
    await this.drainInflight();
    await this.close();
  }

  private async drainInflight(): Promise<void> {
    while (this.inflightTasks.size > 0) await Promise.allSettled([...this.inflightTasks]);
    await this.publisher?.flush();
  }

  private async close(): Promise<void> {
    const followers = this.followers;
    this.followers = [];
    this.closed = true;
    await Promise.all(followers.map((f) => f.close()));
    await this.publisher?.flush();
    if (this.ownsProducer) await this.producer?.close();
    this.producer = undefined;
    if (this.publisher) {
      this.publishedBefore += this.publisher.published;
      this.failedBefore += this.publisher.failed;
    }
    this.publisher = undefined;
  }

  private closed = false;
  private publishedBefore = 0;
  private failedBefore = 0;

  pause(): void {
    this.paused = true;
    this.notify();
  }

  resume(): void {
    this.paused = false;
    this.notify();
  }

  setStalenessBound(bound: number | null): void {
    this.stalenessBound = bound;
    this.notify();
  }

  // ---- admission (staleness gate, in-flight budget, pause) ---------------------------------------

  private blockedBy(): WorkerSnapshot['blockedBy'] {
    if (this.paused) return 'paused';
    if (this.inflight >= this.options.maxInflightTrajectories) return 'inflight';
    if (this.stalenessBound !== null && this.groupsStarted >= (this.currentPolicyVersion + this.stalenessBound + 1) * this.options.groupsPerStep) return 'staleness';
    return null;
  }

  private notify(): void {
    const waiters = this.changed;
    this.changed = [];
    for (const w of waiters) w();
  }

  /** Wait until a new group may start; false when the worker is stopping. */
  private async admit(): Promise<boolean> {
    for (;;) {
      if (this.stopping) return false;
      const why = this.blockedBy();
      if (why === null) return true;
      this.counters.add(`blocked_${why}`);
      await new Promise<void>((resolve) => this.changed.push(resolve));
    }
  }

  private rowSplit(row: DatasetRow): string {
    const s = row.extra_info?.split;
    return typeof s === 'string' && s !== '' ? s : this.options.split;
  }

  // ---- groups and trajectories ---------------------------------------------------------------------

  private startGroup(row: DatasetRow, position: number, epoch: number, split: string, sampling: SamplingParams, n: number, counted: boolean, runScope = this.deps.runId): Promise<Trajectory[]> {
    const agentName = row.agent_name ?? this.options.defaultAgent;
    if (!this.agents.has(agentName)) {
      this.counters.add('rows_skipped_unknown_agent');
      this.logger.error('row names an unknown agent loop; skipped', { agent_name: agentName, position });
      return Promise.resolve([]);
    }
    const groupId = deriveId(runScope, 'group', position, epoch);
    if (counted) this.groupsStarted++;
    this.counters.add('groups_started');
    const tasks: Promise<Trajectory>[] = [];
    // The n samples of a group share one prompt: render and tokenize it once.
    const prompt: PromptCache = {};
    for (let k = 0; k < n; k++) {
      if (counted && this.deps.resume?.completed.has(sampleKey(groupId, k))) {
        this.counters.add('trajectories_resumed_skipped');
        continue;
      }
      this.inflight++;
      const task = this.runTrajectory({ row, agentName, position, groupId, sampleIndex: k, groupSize: n, split, sampling, prompt }).finally(() => {
        this.inflight--;
        this.inflightTasks.delete(task);
        this.notify();
      });
      this.inflightTasks.add(task);
      tasks.push(task);
    }
    return Promise.all(tasks);
  }

  private async acquireSlot(): Promise<void> {
    if (this.slotsFree > 0) {
      this.slotsFree--;
      return;
    }
    await new Promise<void>((resolve) => this.slotWaiters.push(resolve));
  }

  private releaseSlot(): void {
    const next = this.slotWaiters.shift();
    if (next) next();
    else this.slotsFree++;
  }

  private async runTrajectory(sample: TrajectorySample): Promise<Trajectory> {
    await this.acquireSlot();
    try {
      return await this.trajectory(sample);
    } finally {
      this.releaseSlot();
    }
  }

  private async trajectory(sample: TrajectorySample): Promise<Trajectory> {
    const { row, agentName, position, groupId, sampleIndex, groupSize, split, sampling, prompt } = sample;
    const publisher = this.publisher!;
    const { runId, backend, tokenizer } = this.deps;
    const loop = this.agents.get(agentName);
    const trajectoryId = sampleTrajectoryId(groupId, sampleIndex, this.deps.resume?.life ?? null);
    const t0 = performance.now();
    const messages: ChatMessage[] = row.prompt.map((m) => ({ ...m }));
    const toolSet = loop.usesTools ? this.deps.tools : undefined;
    const tools = toolSet ? toolSet.schemas() : [];
    const extra = row.extra_info ?? {};
    const meta: TrajectoryMeta = {
      runId,
      trajectoryId,
      groupId,
      sampleIndex,
      groupSize,
      agentName,
      dataSource: row.data_source,
      dataset: { name: this.options.datasetName, split, index: typeof extra.index === 'number' ? extra.index : position },
      groundTruth: row.reward_model.ground_truth,
      extraInfoJson: JSON.stringify(extra),
    };
    this.counters.add('trajectories_started');
    if (prompt.ids === undefined && prompt.error === undefined) {
      try {
        prompt.ids = this.delta.promptIds(messages, tools.length > 0 ? tools : null);
      } catch (err) {
        prompt.error = err;
      }
    }
    const promptIds = prompt.ids ?? [];
    const promptError = prompt.error;
    const recorder = new TrajectoryRecorder(meta, promptIds, tokenizer, {
      turn: (ev) => {
        this.counters.add('turns');
        if (ev.role === 'assistant') this.genLatency.add(ev.latency_ms);
        publisher.fire('TurnCompleted', groupId, ev);
      },
      toolCall: (ev) => {
        this.toolLatency.add(ev.latency_ms);
        publisher.fire('ToolCallCompleted', groupId, ev);
      },
    });
    publisher.fire('TrajectoryStarted', groupId, {
      event_id: deriveId(trajectoryId, 'started'),
      time_ms: Date.now(),
      run_id: runId,
      trajectory_id: trajectoryId,
      group_id: groupId,
      sample_index: sampleIndex,
      group_size: groupSize,
      agent_name: agentName,
      data_source: row.data_source,
      dataset: meta.dataset,
      prompt_messages: toEventMessages(messages),
      prompt_token_ids: promptIds,
      tools: tools.map((t) => ({ name: t.function.name, description: t.function.description ?? '', parameters_json: JSON.stringify(t.function.parameters ?? {}) })),
      sampling,
      policy_version: backend.currentPolicyVersion(),
      ground_truth: meta.groundTruth,
      extra_info_json: meta.extraInfoJson,
    });

    const toolSession = toolSet ? toolSet.session(trajectoryId, extra.tools_kwargs ?? {}) : null;
    const ik = extra.interaction_kwargs;
    const interactionName = ik && typeof ik['name'] === 'string' ? ik['name'] : undefined;
    const interaction = interactionName && this.deps.interactions?.has(interactionName) ? this.deps.interactions.get(interactionName) : undefined;
    const limits: AgentLimits = {
      maxAssistantTurns: this.options.maxAssistantTurns,
      maxUserTurns: this.options.maxUserTurns,
      responseLength: this.options.responseLength,
      maxParallelToolCalls: this.options.maxParallelToolCalls,
      maxToolErrors: this.options.maxToolErrors,
      // Sampled by trajectory, so a checked trajectory has every observation checked.
      tokenizationCheck: this.checkCounter++ % this.options.tokenizationCheckEvery === 0 ? this.options.tokenizationCheck : 'off',
    };
    const ctx: AgentContext = {
      trajectoryId,
      row,
      messages,
      tools,
      sampling,
      limits,
      backend,
      tokenizer,
      delta: this.delta,
      toolParser: toolParser(this.options.toolParser)!,
      toolSession,
      interaction: interaction ? { interaction, instanceId: trajectoryId, kwargs: ik! } : null,
      recorder,
      signal: this.abort.signal,
      logger: this.logger,
      count: (name, by) => this.counters.add(name, by),
    };

    let termination: Termination;
    try {
      if (promptError) throw promptError;
      if (interaction?.start) await interaction.start(trajectoryId, ik!);
      termination = await loop.run(ctx);
    } catch (err) {
      if (this.abort.signal.aborted) termination = 'aborted';
      else {
        termination = 'error';
        this.counters.add('trajectory_errors');
        this.logger.error('agent loop failed', { trajectory_id: trajectoryId, agent: agentName, error: describeError(err) });
      }
    }
    if (toolSession) {
      for (const r of await toolSession.finish()) recorder.toolRewards.push(r.reward);
    }
    try {
      await interaction?.finish?.(trajectoryId);
    } catch (err) {
      this.logger.warn('interaction finish failed', { error: describeError(err) });
    }
    backend.releaseSession?.(trajectoryId);
    const trajectory = recorder.finish(termination, this.options.responseLength);
    this.counters.add(`termination_${termination}`);
    this.counters.add('trajectories_completed');
    this.trajLatency.add(performance.now() - t0);
    try {
      await publisher.publish('TrajectoryCompleted', groupId, { event_id: deriveId(trajectoryId, 'completed'), time_ms: Date.now(), trajectory });
    } catch (err) {
      this.counters.add('completed_publish_failures');
      this.logger.error('TrajectoryCompleted publish failed', { trajectory_id: trajectoryId, error: describeError(err) });
    }
    return trajectory;
  }

  // ---- policy versions and control -----------------------------------------------------------------

  /** Apply a PolicyVersion: verify the weights' checksum, hand them to the backend, open the gate. */
  async onPolicyVersion(pv: PolicyVersion): Promise<void> {
    if (pv.run_id !== this.deps.runId || pv.policy_version <= this.currentPolicyVersion) return;
    const run = async () => {
      if (pv.policy_version <= this.currentPolicyVersion) return;
      try {
        const update = await verifyPolicyVersion(pv);
        await this.deps.backend.updatePolicy?.(update);
        this.currentPolicyVersion = pv.policy_version;
        this.counters.add('policy_updates');
        this.logger.info('policy version applied', { version: pv.policy_version });
      } catch (err) {
        this.counters.add('policy_update_failures');
        this.logger.error('policy version rejected', { version: pv.policy_version, error: describeError(err) });
      }
      this.notify();
    };
    this.applying = this.applying.then(run);
    await this.applying;
  }

  /** Apply a command of this run and session (core/control.ts chooses which commands reach here). */
  onControl(c: Control): void {
    this.counters.add(`control_${c.command}`);
    this.logger.info('control', { command: c.command, reason: c.reason });
    switch (c.command) {
      case 'pause':
        this.pause();
        break;
      case 'resume':
        this.resume();
        break;
      case 'set_staleness':
        if (c.staleness_bound !== null && c.staleness_bound >= 0) this.setStalenessBound(c.staleness_bound);
        break;
      case 'stop':
        this.stopping = true;
        this.notify();
        break;
    }
  }

  /** The policy versions of the run: the newest of a batch is applied; one not newer than the applied one is ignored. */
  private async onPolicyRecords(records: LogRecord[], onError: (err: unknown, where: 'decode', record: LogRecord) => void): Promise<void> {
    let newest: PolicyVersion | undefined;
    for (const rec of records) {
      let ev;
      try {
        ev = await this.deps.serde.decode(rec.value);
      } catch (err) {
        onError(err, 'decode', rec);
        continue;
      }
      if (ev.name === 'PolicyVersion' && (!newest || ev.value.policy_version > newest.policy_version)) newest = ev.value;
    }
    if (!newest) return;
    const applied = this.onPolicyVersion(newest);
    // While a hold is on, the follower goes on reading: later versions queue behind the evaluation's, not the poll.
    if (this.holds === 0) await applied;
  }

  // ---- metrics -----------------------------------------------------------------------------------

  snapshot(): WorkerSnapshot {
    const c = this.counters;
    const secs = Math.max(1e-3, (Date.now() - this.startedMs) / 1000);
    const toolCalls = c.get('tool_status_ok') + c.get('tool_status_error') + c.get('tool_status_timeout') + c.get('tool_status_invalid_args') + c.get('tool_status_unknown_tool');
    const terminations: Record<string, number> = {};
    for (const [k, v] of Object.entries(c.toObject())) if (k.startsWith('termination_')) terminations[k.slice('termination_'.length)] = v;
    return {
      running: this.running,
      paused: this.paused,
      stopping: this.stopping,
      blockedBy: this.blockedBy(),
      policyVersion: this.currentPolicyVersion,
      stalenessBound: this.stalenessBound,
      groupsStarted: this.groupsStarted,
      trajectoriesStarted: c.get('trajectories_started'),
      trajectoriesCompleted: c.get('trajectories_completed'),
      inflight: this.inflight,
      terminations,
      turns: c.get('turns'),
      toolCalls,
      toolSuccessRate: toolCalls === 0 ? 1 : c.get('tool_status_ok') / toolCalls,
      generatedTokens: c.get('generated_tokens'),
      tokensPerSecond: c.get('generated_tokens') / secs,
      trajectoriesPerSecond: c.get('trajectories_completed') / secs,
      eventsPublished: this.publishedBefore + (this.publisher?.published ?? 0),
      eventsFailed: this.failedBefore + (this.publisher?.failed ?? 0),
      eventsPerSecond: (this.publishedBefore + (this.publisher?.published ?? 0)) / secs,
      trajectoryLatencyMs: this.trajLatency.summary(),
      generationLatencyMs: this.genLatency.summary(),
      toolLatencyMs: this.toolLatency.summary(),
      counters: c.toObject(),
      uptimeMs: Date.now() - this.startedMs,
    };
  }
}

function isReiterable(source: RowSource): boolean {
  // Arrays and other plain iterables can be walked again; generators cannot (they return themselves).
  const s = source as { [Symbol.iterator]?: () => unknown; [Symbol.asyncIterator]?: () => unknown };
  const it = s[Symbol.asyncIterator]?.call(source) ?? s[Symbol.iterator]?.call(source);
  return it !== source;
}
