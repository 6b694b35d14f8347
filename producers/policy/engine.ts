// The generation engine of the built-in policy: continuous batching over onnxruntime sessions. Requests
// from many concurrent agent loops join the running batch between decode steps (after a batched prefill) and
// leave it when they finish; each policy version has its own running batch, so a hot-swap never mixes
// weights inside one sequence. The running batch's KV cache lives in fixed-capacity buffers (slots.ts) that
// decode steps read in place and extend by one column, so a step's cost does not include copying the cache.
// A session's KV cache is kept between its turns (bounded, LRU) so a later turn encodes only its new tokens.
import { randomInt } from 'node:crypto';
import { RlstreamError, describeError } from '../../core/errors.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import type { GenerateRequest, GenerateResult, FinishReason } from '../backends/types.ts';
import type { PolicyModelConfig } from './config.ts';
import { MASKED } from './export.ts';
import { gatherRows, kvBytes, SessionCache, type SessionKv } from './kv.ts';
import { onAbortUntilSettled } from './on-abort.ts';
import { emptyKv, type KvTensors, type PolicyRunner } from './runner.ts';
import { compactRow, SlotCache, type Segment } from './slots.ts';
import { inverseTemperature, newScratch, Rng, sampleToken, topAlternatives, validateSampling, MAX_TOP_LOGPROBS } from './sampler.ts';

/**
 * How a policy update reaches sessions (trajectories) that are under way:
 * - 'finish': a session keeps the version it started with until it is released (every turn of a trajectory
 *   comes from one policy); new sessions use the new version.
 * - 'next_turn': a turn in flight finishes on its weights; the session's next turn uses the new version, and
 *   its kept KV cache (computed by the old weights) is dropped.
 * - 'next_token': a turn in flight is interrupted after the token being decoded: its context (prompt and tokens
 *   so far) is prefilled again on the new weights and generation goes on there, each token keeping the version
 *   that sampled it and its log-prob under that version (AReaL/verl partial rollouts).
 */
export type RolloutInterrupt = 'finish' | 'next_turn' | 'next_token';
export const ROLLOUT_INTERRUPTS: readonly RolloutInterrupt[] = Object.freeze(['finish', 'next_turn', 'next_token']);

export interface EngineOptions {
  /** Most sequences decoded together per version (default 64). */
  maxBatch?: number;
  /** Budget for KV caches kept between turns, in bytes (default 256 MiB). */
  kvCacheBytes?: number;
  interrupt?: RolloutInterrupt;
  /** Padded prefill tokens (rows × longest new suffix) admitted per step (default 16384); one request always fits. */
  maxPrefillTokens?: number;
  /** In 'finish' mode, how many versions may stay loaded for pinned sessions (default 3). */
  maxLiveVersions?: number;
  server?: string;
  logger?: Logger;
}

export interface EngineStats {
  steps: number;
  prefillSteps: number;
  decodeTokens: number;
  prefillTokens: number;
  reusedTokens: number;
  cacheHits: number;
  cacheMisses: number;
  cacheEvictions: number;
  cachedSessions: number;
  cacheBytes: number;
  rebuilds: number;
  /** Turns moved to a newer version mid-generation ('next_token'). */
  interrupted: number;
}

interface Seq {
  req: GenerateRequest;
  version: number;
  context: number[]; // prompt + generated so far
  kvLen: number; // leading tokens of `context` whose K/V are in the cache
  feed: number[]; // tokens to run at the next step
  past: SessionKv | null; // kept KV to start from (prefill only)
  tokens: number[];
  logprobs: number[];
  versions: number[]; // the version that sampled each token
  top: { token: number; logprob: number }[][] | null; // alternatives per token, when asked for
  maxNew: number;
  stop: Set<number>;
  rng: Rng;
  t0: number;
  aborted: boolean;
  resolve: (r: GenerateResult) => void;
  reject: (e: unknown) => void;
}

interface Group {
  runner: PolicyRunner;
  waiting: Seq[];
  rows: Seq[]; // rows[b] is row b of `slots`
  joining: Seq[]; // admitted, in the prefill under way
  slots: SlotCache;
  /** Set when a step failed and the runner no longer runs at all: its requests fail at once with this. */
  broken: RlstreamError | null;
}

export class GenerationEngine {
  private readonly groups = new Map<number, Group>();
  private readonly pins = new Map<string, number>(); // session → version ('finish' mode)
  private readonly cache: SessionCache;
  private current: number;
  private looping = false;
  private stepping: Group | null = null;
  private closed = false;
  private readonly scratch: ReturnType<typeof newScratch>;
  private readonly opts: Required<Omit<EngineOptions, 'logger'>> & { logger: Logger };
  private readonly counters = { steps: 0, prefillSteps: 0, decodeTokens: 0, prefillTokens: 0, reusedTokens: 0, cacheHits: 0, cacheMisses: 0, rebuilds: 0, interrupted: 0 };

  constructor(
    private readonly config: PolicyModelConfig,
    runner: PolicyRunner,
    options: EngineOptions = {},
  ) {
    this.opts = {
      maxBatch: options.maxBatch ?? 64,
      kvCacheBytes: options.kvCacheBytes ?? 256 * 1024 * 1024,
      interrupt: options.interrupt ?? 'next_turn',
      maxPrefillTokens: options.maxPrefillTokens ?? 16384,
      maxLiveVersions: options.maxLiveVersions ?? 3,
      server: options.server ?? 'builtin',
      logger: options.logger ?? silentLogger,
    };
    if (!Number.isInteger(this.opts.maxBatch) || this.opts.maxBatch < 1) throw new RlstreamError('CONFIG_INVALID', `maxBatch must be a positive integer, got ${this.opts.maxBatch}`);
    if (!ROLLOUT_INTERRUPTS.includes(this.opts.interrupt)) throw new RlstreamError('CONFIG_INVALID', `interrupt must be one of ${ROLLOUT_INTERRUPTS.join(', ')}, got ${String(this.opts.interrupt)}`);
    this.cache = new SessionCache(this.opts.kvCacheBytes);
    this.scratch = newScratch(config.vocabSize);
    this.current = runner.version;
    this.groups.set(runner.version, this.newGroup(runner));
  }

  currentVersion(): number {
    return this.current;
  }

  stats(): EngineStats {
    return { ...this.counters, cacheEvictions: this.cache.evictions, cachedSessions: this.cache.size, cacheBytes: this.cache.bytes };
  }

  /** Validate, queue and run one request; resolves when it finishes (or is aborted). */
  generate(req: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    if (this.closed) return Promise.reject(new RlstreamError('BACKEND_UNAVAILABLE', 'the built-in policy engine is closed', { retriable: false }));
    try {
      this.validate(req);
    } catch (err) {
      return Promise.reject(err);
    }
    let seq: Seq | undefined;
    const result = new Promise<GenerateResult>((resolve, reject) => {
      const p = req.sampling;
      const version = this.versionFor(req.sessionId);
      const group = this.groups.get(version)!;
      if (group.broken) {
        reject(group.broken);
        return;
      }
      seq = {
        req,
        version,
        context: [...req.promptIds],
        kvLen: 0,
        feed: [],
        past: null,
        tokens: [],
        logprobs: [],
        versions: [],
        top: (req.topLogprobs ?? 0) > 0 ? [] : null,
        maxNew: Math.min(p.max_new_tokens, this.config.maxPositions - req.promptIds.length),
        stop: new Set(p.stop_token_ids),
        rng: new Rng(p.seed ?? randomInt(0, 2 ** 48 - 1)),
        t0: performance.now(),
        aborted: false,
        resolve,
        reject,
      };
      this.attachPast(seq);
      group.waiting.push(seq);
      this.kick();
    });
    // The executor ran already: `seq` is set unless the request was refused at once.
    onAbortUntilSettled(
      signal,
      () => {
        if (seq) seq.aborted = true;
      },
      result,
    );
    return result;
  }

  releaseSession(sessionId: string): void {
    this.cache.take(sessionId);
    this.pins.delete(sessionId);
    this.releaseIdleRunners();
  }

  /** Make `runner` the version new requests use (see RolloutInterrupt for sessions under way). */
  install(runner: PolicyRunner): void {
    const old = this.current;
    if (runner.version === old || this.groups.has(runner.version)) throw new RlstreamError('INPUT_INVALID', `policy version ${runner.version} is already loaded`);
    this.groups.set(runner.version, this.newGroup(runner));
    this.current = runner.version;
    if (this.opts.interrupt !== 'finish') {
      this.pins.clear();
      this.cache.dropOtherVersions(runner.version);
    } else {
      // Keep only the newest versions alive for pinned sessions; older pins move to the new version.
      const live = [...this.groups.keys()].sort((a, b) => b - a).slice(0, this.opts.maxLiveVersions);
      for (const [s, v] of this.pins) if (!live.includes(v)) this.pins.delete(s);
    }
    // Requests that have not started yet move to the version they would get now.
    for (const [v, g] of this.groups) {
      if (v === runner.version) continue;
      const stay: Seq[] = [];
      for (const seq of g.waiting) {
        const target = this.versionFor(seq.req.sessionId);
        if (target === v) stay.push(seq);
        else {
          seq.version = target;
          seq.past = null;
          seq.kvLen = 0;
          this.attachPast(seq);
          this.groups.get(target)!.waiting.push(seq);
        }
      }
      g.waiting = stay;
    }
    this.opts.logger.info('policy installed', { version: runner.version, previous: old, interrupt: this.opts.interrupt });
    this.releaseIdleRunners();
    this.kick();
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const g of this.groups.values()) {
      for (const s of [...g.waiting, ...g.joining, ...g.rows]) s.reject(new RlstreamError('BACKEND_UNAVAILABLE', 'the built-in policy engine closed', { retriable: false }));
      g.waiting = [];
      g.joining = [];
      g.rows = [];
    }
    for (const g of this.groups.values()) {
      try {
        await g.runner.release();
      } catch (err) {
        // A session that broke may not release cleanly; closing must still finish.
        this.opts.logger.warn('releasing a policy session failed', { version: g.runner.version, error: describeError(err) });
      }
    }
    this.groups.clear();
  }

  // ----- request set-up -----

  private validate(req: GenerateRequest): void {
    const bad = (m: string) => new RlstreamError('BACKEND_BAD_REQUEST', `request ${req?.requestId ?? '?'}: ${m}`);
    if (!req || !Array.isArray(req.promptIds)) throw bad('promptIds must be an array of token ids');
    const n = req.promptIds.length;
    if (n === 0) throw bad('the prompt is empty');
    if (n >= this.config.maxPositions) throw bad(`the prompt has ${n} tokens; the context holds ${this.config.maxPositions}, leaving no room to generate`);
    const V = this.config.vocabSize;
    for (let i = 0; i < n; i++) {
      const t = req.promptIds[i]!;
      if (!Number.isInteger(t) || t < 0 || t >= V) throw bad(`token id ${t} at position ${i} is outside the vocabulary [0, ${V})`);
    }
    validateSampling(req.sampling, V);
    const k = req.topLogprobs ?? 0;
    if (!Number.isInteger(k) || k < 0 || k > MAX_TOP_LOGPROBS) throw bad(`topLogprobs must be an integer in [0, ${MAX_TOP_LOGPROBS}], got ${k}`);
  }

  private versionFor(sessionId: string | undefined): number {
    if (this.opts.interrupt === 'finish' && sessionId !== undefined) {
      const pinned = this.pins.get(sessionId);
      if (pinned !== undefined && this.groups.has(pinned) && !this.groups.get(pinned)!.broken) return pinned;
      this.pins.set(sessionId, this.current);
    }
    return this.current;
  }

  /** Start from the session's kept KV when it was computed by this version and is a prefix of the prompt. */
  private attachPast(seq: Seq): void {
    const sid = seq.req.sessionId;
    const kept = sid === undefined ? undefined : this.cache.take(sid);
    const prompt = seq.context;
    let usable = kept !== undefined && kept.version === seq.version && kept.tokens.length <= prompt.length;
    for (let i = 0; usable && i < kept!.tokens.length; i++) if (kept!.tokens[i] !== prompt[i]) usable = false;
    if (kept && usable) {
      let past = kept;
      if (past.tokens.length === prompt.length) past = this.truncate(past, prompt.length - 1); // keep one token to run
      seq.past = past;
      seq.kvLen = past.tokens.length;
      this.counters.cacheHits++;
      this.counters.reusedTokens += past.tokens.length;
    } else if (sid !== undefined) {
      this.counters.cacheMisses++;
    }
    seq.feed = prompt.slice(seq.kvLen);
  }

  private truncate(s: SessionKv, n: number): SessionKv {
    const { kv } = gatherRows(this.config, [{ kv: s.kv, batch: 1, row: 0, cols: range(0, n) }]);
    return { version: s.version, tokens: s.tokens.slice(0, n), kv, bytes: kvBytes(this.config, kv, 1) };
  }

  private newGroup(runner: PolicyRunner): Group {
    return { runner, waiting: [], rows: [], joining: [], slots: new SlotCache(this.config), broken: null };
  }

  // ----- the scheduling loop -----

  private kick(): void {
    if (this.looping || this.closed) return;
    this.looping = true;
    void this.loop()
      .catch((err: unknown) => this.failAll(err))
      .finally(() => (this.looping = false));
  }

  /** The scheduling loop itself threw (a bug, not a step): settle every request rather than leave them waiting. */
  private failAll(err: unknown): void {
    const e = new RlstreamError('INTERNAL', `the policy engine's scheduling loop failed: ${describeError(err)}`, { cause: err });
    this.opts.logger.error('policy scheduling loop failed', { error: describeError(err) });
    for (const g of this.groups.values()) {
      for (const s of [...g.waiting, ...g.joining, ...g.rows]) s.reject(e);
      g.waiting = [];
      g.joining = [];
      g.rows = [];
      g.slots.clear();
    }
  }

  private async loop(): Promise<void> {
    // Yield once first so requests submitted together (e.g. a GRPO group) share the first prefill.
    await new Promise((r) => setImmediate(r));
    while (!this.closed) {
      let worked = false;
      for (const g of [...this.groups.values()]) {
        if (g.waiting.length === 0 && g.rows.length === 0) continue;
        worked = true;
        this.stepping = g;
        try {
          await this.iterate(g);
        } catch (err) {
          await this.failStep(g, err);
        } finally {
          this.stepping = null;
        }
      }
      this.releaseIdleRunners();
      if (!worked) return;
      // Let new requests and abort signals in between steps.
      await new Promise((r) => setImmediate(r));
    }
  }

  /**
   * A failed step fails the sequences in it (running rows and joiners), not the engine: they are rejected, their
   * cache rows dropped, and the loop goes on with the waiting requests. If the runner no longer runs at all (e.g.
   * its onnxruntime session is gone), every waiting and later request of that version fails at once instead.
   */
  private async failStep(g: Group, err: unknown): Promise<void> {
    const v = g.runner.version;
    const e = err instanceof PolicyStepError ? err : stepError(v, 'scheduling step', err);
    const failed = [...g.rows, ...g.joining];
    this.opts.logger.error('policy step failed', { version: v, requests: failed.length, error: describeError(e) });
    for (const s of failed) s.reject(e);
    g.rows = [];
    g.joining = [];
    g.slots.clear();
    if (this.closed || (await g.runner.healthy())) return;
    g.broken = new RlstreamError('BACKEND_UNAVAILABLE', `policy v${v} can no longer run (its onnxruntime session fails even on one token) after: ${e.message}`, { cause: err, retriable: false });
    this.opts.logger.error('policy version unusable: its requests fail until another version is installed', { version: v });
    for (const s of g.waiting) s.reject(g.broken);
    g.waiting = [];
  }

  /** One scheduling step of a version's batch: prefill joiners, decode the running rows, retire finished ones. */
  private async iterate(g: Group): Promise<void> {
    if (this.opts.interrupt === 'next_token' && g.runner.version !== this.current && this.groups.has(this.current)) {
      this.interrupt(g, this.groups.get(this.current)!);
      return;
    }
    for (const s of g.waiting) if (s.aborted) this.finish(s, 'abort');
    g.waiting = g.waiting.filter((s) => !s.aborted);
    const joiners = this.admit(g);
    g.joining = joiners;
    let changed = false;

    if (g.rows.length > 0) {
      const B = g.rows.length;
      changed = await this.decodeStep(g).catch((err: unknown) => {
        throw stepError(g.runner.version, `decode step (batch ${B})`, err);
      });
      if (this.closed) return;
    }

    if (joiners.length > 0) {
      const longest = joiners.reduce((m, s) => Math.max(m, s.feed.length), 0);
      await this.prefillStep(g, joiners).catch((err: unknown) => {
        throw stepError(g.runner.version, `prefill step (batch ${joiners.length}, ${longest} tokens)`, err);
      });
      g.joining = [];
      changed = true;
    }

    if (changed) {
      g.slots.shrink();
      this.counters.rebuilds++;
    }
  }

  /**
   * 'next_token': move the running rows of an old version to the current one. Their KV cache was computed by the
   * old weights, so each row's whole context is prefilled again there; the token it samples next is the new
   * version's. Runs between steps, so no step of `from` is in flight.
   */
  private interrupt(from: Group, to: Group): void {
    const moved = [...from.rows, ...from.waiting];
    for (const seq of moved) {
      seq.version = to.runner.version;
      seq.past = null;
      seq.kvLen = 0;
      seq.feed = seq.context.slice();
      to.waiting.push(seq);
    }
    from.rows = [];
    from.waiting = [];
    from.slots.clear();
    this.counters.interrupted += moved.length;
    if (moved.length > 0) this.opts.logger.debug('turns interrupted for a new version', { from: from.runner.version, to: to.runner.version, requests: moved.length });
  }

  /** Decode one token for every running row and retire the rows that finished; true when some did. */
  private async decodeStep(g: Group): Promise<boolean> {
    const done: [Seq, FinishReason][] = [];
    let changed = false;
    // Finished requests settle even if a later part of the step throws: they have left `rows` already.
    try {
      const rows = g.rows;
      const B = rows.length;
      g.slots.reserveColumn();
      const ids = new BigInt64Array(B);
      const pos = new BigInt64Array(B);
      rows.forEach((s, b) => {
        ids[b] = BigInt(s.feed[0]!);
        pos[b] = BigInt(s.kvLen);
      });
      const out = await g.runner.decode({ batch: B, inputIds: ids, positionIds: pos, pastBias: g.slots.bias, past: g.slots.view(), invTemperature: this.invTemperatures(rows) });
      if (g.rows !== rows) return false; // the engine closed while the step ran
      g.slots.appendColumn(out.column);
      this.counters.steps++;
      this.counters.decodeTokens += B;
      const V = this.config.vocabSize;
      rows.forEach((s, b) => {
        s.kvLen++;
        if (!s.aborted) this.emit(s, out.probs.subarray(b * V, (b + 1) * V));
      });
      // Descending, so the row swap-remove moves into a freed slot is always one that stays.
      for (let b = B - 1; b >= 0; b--) {
        const s = rows[b]!;
        const reason = this.finishReason(s);
        if (!reason) continue;
        this.keepSession(s, () => g.slots.extract(b));
        g.slots.remove(b);
        rows[b] = rows[rows.length - 1]!;
        rows.pop();
        done.push([s, reason]);
        changed = true;
      }
    } finally {
      // Settled now, so a later prefill failing does not take them down with it.
      for (const [s, reason] of done) this.finish(s, reason);
    }
    return changed;
  }

  /** Prefill the joiners and add them to the running batch (or finish those already done). */
  private async prefillStep(g: Group, joiners: Seq[]): Promise<void> {
    const done: [Seq, FinishReason][] = [];
    try {
      const pre = await this.prefill(g, joiners);
      // Size the buffers for every joiner at once: appending 64 rows one by one would regrow (and copy) them
      // five times.
      g.slots.reserve(g.rows.length + joiners.length, Math.max(...pre.map((segs) => segs.reduce((t, x) => t + x.count, 0))));
      joiners.forEach((s, i) => {
        const reason = this.finishReason(s);
        if (reason) {
          this.keepSession(s, () => compactRow(this.config, pre[i]!));
          done.push([s, reason]);
        } else {
          g.slots.append(pre[i]!);
          g.rows.push(s);
        }
      });
    } finally {
      for (const [s, reason] of done) this.finish(s, reason);
    }
  }

  /** Take waiting requests into the batch while rows and the prefill token budget allow. */
  private admit(g: Group): Seq[] {
    const room = this.opts.maxBatch - g.rows.length;
    const out: Seq[] = [];
    let longest = 0;
    while (out.length < room && g.waiting.length > 0) {
      const next = g.waiting[0]!;
      const l = Math.max(longest, next.feed.length);
      if (out.length > 0 && l * (out.length + 1) > this.opts.maxPrefillTokens) break;
      longest = l;
      out.push(g.waiting.shift()!);
    }
    return out;
  }

  /**
   * Run the new requests' suffixes (left-padded to the longest) on top of their kept KV (right-aligned), sample
   * each one's first token, and return each row's whole cache (kept part, then the suffix) as segments.
   */
  private async prefill(g: Group, seqs: Seq[]): Promise<Segment[][]> {
    const c = this.config;
    const B = seqs.length;
    const pasts = seqs.map((s) => s.past);
    const { kv: past, starts } = gatherRows(
      c,
      pasts.map((p) => (p ? { kv: p.kv, batch: 1, row: 0, cols: range(0, p.tokens.length) } : { kv: emptyKv(c), batch: 1, row: 0, cols: [] })),
    );
    const Tp = past.len;
    const S = seqs.reduce((m, s) => Math.max(m, s.feed.length), 0);
    const ids = new BigInt64Array(B * S);
    const pos = new BigInt64Array(B * S);
    const pastBias = new Float32Array(B * S * Tp).fill(MASKED);
    const newBias = new Float32Array(B * S * S).fill(MASKED);
    seqs.forEach((s, b) => {
      const n = s.feed.length;
      const pad = S - n;
      for (let i = 0; i < S; i++) {
        const r = b * S + i;
        if (i < pad) {
          newBias[r * S + i] = 0; // padding attends to itself only, so its softmax stays finite
          continue;
        }
        ids[r] = BigInt(s.feed[i - pad]!);
        pos[r] = BigInt(s.kvLen + i - pad);
        pastBias.fill(0, r * Tp + starts[b]!, (r + 1) * Tp);
        newBias.fill(0, r * S + pad, r * S + i + 1);
      }
    });
    const out = await g.runner.run({ batch: B, seq: S, inputIds: ids, positionIds: pos, pastBias, newBias, past, invTemperature: this.invTemperatures(seqs) });
    this.counters.steps++;
    this.counters.prefillSteps++;
    const V = c.vocabSize;
    return seqs.map((s, b) => {
      const n = s.feed.length;
      this.counters.prefillTokens += n;
      s.kvLen += n;
      s.past = null;
      if (!s.aborted) this.emit(s, out.probs!.subarray(b * V, (b + 1) * V));
      return [
        { kv: past, row: b, from: starts[b]!, count: Tp - starts[b]! },
        { kv: out.fresh, row: b, from: S - n, count: n },
      ];
    });
  }

  /** 1 / temperature per row: the graph returns each row's distribution at its own temperature. */
  private invTemperatures(rows: Seq[]): Float32Array {
    const out = new Float32Array(rows.length);
    rows.forEach((s, b) => (out[b] = inverseTemperature(s.req.sampling)));
    return out;
  }

  /** Sample the next token of `s` from its row of probabilities. */
  private emit(s: Seq, probs: Float32Array): void {
    const { token, logprob } = sampleToken(probs, s.req.sampling, s.rng, this.scratch);
    s.tokens.push(token);
    s.logprobs.push(logprob);
    s.versions.push(s.version);
    if (s.top) s.top.push(topAlternatives(probs, s.req.topLogprobs!));
    s.context.push(token);
    s.feed = [token];
  }

  private finishReason(s: Seq): FinishReason | null {
    if (s.aborted) return 'abort';
    const last = s.tokens[s.tokens.length - 1];
    if (last !== undefined && s.stop.has(last)) return 'stop';
    if (s.tokens.length >= s.maxNew) return 'length';
    return null;
  }

  /** Keep the finished turn's KV (all context tokens but the last sampled one) for the session's next turn. */
  private keepSession(s: Seq, row: () => KvTensors): void {
    const sid = s.req.sessionId;
    if (sid === undefined || s.aborted || s.version !== this.keepableVersion(sid)) return;
    const kv = row();
    this.cache.put(sid, { version: s.version, tokens: s.context.slice(0, s.kvLen), kv, bytes: kvBytes(this.config, kv, 1) });
  }

  /** The version a session's next turn will run on: a cache of any other version would be useless. */
  private keepableVersion(sessionId: string): number {
    if (this.opts.interrupt === 'finish') return this.pins.get(sessionId) ?? this.current;
    return this.current;
  }

  private finish(s: Seq, reason: FinishReason): void {
    s.resolve({
      tokenIds: s.tokens,
      logprobs: s.logprobs,
      finishReason: reason,
      policyVersions: s.versions,
      ...(s.top ? { topLogprobs: s.top } : {}),
      server: this.opts.server,
      latencyMs: performance.now() - s.t0,
    });
  }

  /** Release runners of old versions that no request, running row or pinned session needs any more. */
  private releaseIdleRunners(): void {
    const pinned = new Set(this.pins.values());
    for (const [v, g] of this.groups) {
      if (v === this.current || g.rows.length > 0 || g.waiting.length > 0 || pinned.has(v)) continue;
      if (this.stepping === g) continue; // its rows are in flight inside a step
      this.groups.delete(v);
      void g.runner.release().catch((err: unknown) => this.opts.logger.warn('releasing an old policy session failed', { version: v, error: describeError(err) }));
      this.opts.logger.info('policy version unloaded', { version: v });
    }
  }
}

/** What the requests of a failed step are rejected with: which version and step, and what went wrong. */
export class PolicyStepError extends RlstreamError {}

function stepError(version: number, step: string, cause: unknown): PolicyStepError {
  return new PolicyStepError('INTERNAL', `policy v${version} ${step} failed: ${describeError(cause)}`, { cause });
}

function range(from: number, to: number): number[] {
  const out: number[] = [];
  for (let i = from; i < to; i++) out.push(i);
  return out;
}
