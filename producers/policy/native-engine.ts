// The continuous-batching scheduler of the built-in policy over a model runner with a slot KV cache
// (slot-runner.ts): the native core's own model (native/model.ts, device cuda) or the ONNX runner
// (onnx-slot-runner.ts, device cpu). Every step is one extend call that prefills the requests joining (only the
// tokens their slot does not hold yet) and decodes one token for every running request of one policy version;
// requests leave as they finish, handed back once the next step is on its way (their owners' code then overlaps
// the device's work). Sampling follows the built-in policy's rule and log-prob convention (sampler.ts): rows
// without top-k / top-p and without topLogprobs are drawn by the native core where the probabilities are
// (extendSample, one uniform from the request's Rng; a runner without it has them sampled on the host), others by
// sampleToken on the rows extend returns, softmax(logits / T), the alternatives taken from that same row. A
// session keeps its slot between turns, so a later turn whose context extends the cached tokens prefills only the
// new ones. A step the runner fails fails its turns only, unless the runner no longer runs at all (healthy()).
// New versions come by swap (RolloutInterrupt); the native model's weights are its parameters in place: a trainer
// step on the same Model is seen by the next step (setVersion names the version the tokens then carry); cached
// K/V of earlier tokens stay as they were computed.
import { randomInt } from 'node:crypto';
import { RlstreamError, describeError } from '../../core/errors.ts';
import type { FinishReason, GenerateRequest, GenerateResult, TokenAlternative } from '../backends/types.ts';
import type { SlotRunner } from './slot-runner.ts';
import { inverseTemperature, isGreedy, isUntruncated, MAX_TOP_LOGPROBS, newScratch, Rng, sampleToken, topAlternatives, validateSampling } from './sampler.ts';

/** Prompt tokens prefilled in one step unless maxPrefillTokens says otherwise. */
export const DEFAULT_PREFILL_TOKENS = 4096;
/** Versions' weights held at once for rollout.interrupt 'finish' unless maxLiveVersions says otherwise. */
export const DEFAULT_MAX_LIVE_VERSIONS = 3;

/**
 * How a policy update reaches turns under way (rollout.interrupt):
 * - 'finish': a session keeps the version its first turn ran on until it is released (every turn of a
 *   trajectory comes from one policy; a turn without a session finishes on its version); new sessions and turns
 *   take the new one. Needs a runner that holds several versions' weights at once (SlotRunner.dropWeights).
 * - 'next_turn': turns in flight finish on their weights; every turn admitted after the swap (a session's next one
 *   too, without its old cache) runs the new version. On a runner that holds several versions (dropWeights) the
 *   new one loads beside the old while steps go on, and new turns start on it at once; on one that holds one
 *   (weights written in place) admissions wait until the turns in flight have finished, then it loads.
 * - 'next_token': turns in flight are interrupted after the token being decoded: their context is prefilled again
 *   on the new weights and generation goes on there, each token keeping the version that sampled it and its
 *   log-prob under that version (AReaL/verl partial rollouts).
 */
export type RolloutInterrupt = 'finish' | 'next_turn' | 'next_token';

export interface NativeEngineOptions {
  /** Sequences held in the KV cache at once (running requests plus idle sessions kept for their next turn). */
  slots: number;
  /**
   * Most requests running at once (default: slots); the slots beyond it hold only idle sessions kept for their
   * next turn (the built-in policy's kv_cache_bytes on the CPU, ./kv-sizing.ts's keptSessionSlots).
   */
  maxBatch?: number;
  /** Tokens a slot holds: context plus generated tokens of a session. */
  maxLen: number;
  /**
   * Prompt tokens prefilled in one step (default DEFAULT_PREFILL_TOKENS); a longer prompt still goes, alone. A step's activations
   * are sized by its tokens, so this bounds the memory a burst of joining requests takes.
   */
  maxPrefillTokens?: number;
  /** Policy version the first tokens carry (default 0). */
  version?: number;
  /**
   * swap 'finish': how many versions' weights may stay loaded for the sessions pinned to them (default
   * DEFAULT_MAX_LIVE_VERSIONS); a session pinned to an older one moves to the newest at its next turn.
   */
  maxLiveVersions?: number;
  server?: string;
}

export interface NativeEngineStats {
  steps: number;
  /** Steps that prefilled some row (a turn joining, or a context again after a swap). */
  prefillSteps: number;
  decodeTokens: number;
  prefillTokens: number;
  /** Prompt tokens a request found already in its session's slot. */
  reusedTokens: number;
  /** Turns that found some of their prompt in their session's slot. */
  cacheHits: number;
  /** Gauge: idle slots holding a session's tokens for its next turn. */
  cachedSessions: number;
  /** Turns moved to a new version mid-generation (swap 'next_token'). */
  interrupted: number;
  /** Milliseconds spent in the model's forward steps (on cuda: until their results reached the host). */
  computeMs: number;
  /** Milliseconds spent writing new versions' weights into the model. */
  loadMs: number;
}

interface Run {
  req: GenerateRequest;
  slot: number;
  version: number; // the weights it runs on (set when admitted)
  feed: number[]; // tokens to append at the next step
  tokens: number[];
  logprobs: number[];
  versions: number[];
  /** max_new_tokens, cut to what the slot has room for. */
  maxNew: number;
  /** With topLogprobs: each token's alternatives, from the row it was sampled from. */
  top: TokenAlternative[][] | null;
  stop: Set<number>;
  rng: Rng;
  t0: number;
  signal: AbortSignal | undefined;
  resolve: (r: GenerateResult) => void;
  reject: (e: unknown) => void;
}

interface Slot {
  session: string | null; // null: free
  tokens: number[]; // what the cache holds for it
  version: number; // the weights that computed it
  busy: boolean;
  lastUse: number;
}

export class NativeEngine {
  private readonly slots: Slot[];
  private readonly waiting: Run[] = [];
  private readonly running: Run[] = [];
  /** Turns finished by the last step, resolved once the next step is launched (handBack). */
  private readonly finished: { run: Run; result: GenerateResult }[] = [];
  private readonly scratch: { order: Int32Array };
  private readonly prefillCap: number;
  private readonly rows: Float32Array; // extend's output, [slots, V], reused every step
  private version: number;
  private looping: Promise<void> | null = null;
  private paused = false; // a version swap is under way: no admissions, and the loop stops after its step
  private drained: (() => void) | null = null;
  private closed = false;
  /** Set when a step failed and the runner no longer runs at all (its healthy() says so): requests fail at once until a swap loads weights that run. */
  private broken: RlstreamError | null = null;
  private readonly maxBatch: number;
  private readonly maxLive: number;
  /** Versions whose weights the runner holds (one, except after 'finish' swaps on a runner with dropWeights). */
  private readonly live = new Set<number>();
  /** Session → the version its turns run on, until released or that version is unloaded. */
  private readonly pins = new Map<string, number>();
  /** The step number each version last ran at: the step goes to the version waiting longest. */
  private readonly lastStep = new Map<number, number>();
  /**
   * Slots whose session was released, emptied in the runner before the next step (a runner may size its buffers
   * by what the slots hold; the native model takes no call while a step runs, and a release may come then).
   */
  private readonly released: number[] = [];
  private clock = 0;
  private launches = 0;
  private readonly counters: NativeEngineStats = { steps: 0, prefillSteps: 0, decodeTokens: 0, prefillTokens: 0, reusedTokens: 0, cacheHits: 0, cachedSessions: 0, interrupted: 0, computeMs: 0, loadMs: 0 };
  readonly server: string;

  constructor(
    private readonly model: SlotRunner,
    private readonly opts: NativeEngineOptions,
  ) {
    this.slots = Array.from({ length: opts.slots }, () => ({ session: null, tokens: [], version: -1, busy: false, lastUse: 0 }));
    this.scratch = newScratch(model.config.vocab_size);
    this.version = opts.version ?? 0;
    this.prefillCap = opts.maxPrefillTokens ?? DEFAULT_PREFILL_TOKENS;
    if (!Number.isInteger(this.prefillCap) || this.prefillCap < 1) throw new RlstreamError('CONFIG_INVALID', `maxPrefillTokens must be a positive integer, got ${String(opts.maxPrefillTokens)}`);
    this.server = opts.server ?? 'builtin-native';
    this.live.add(this.version);
    this.maxLive = opts.maxLiveVersions ?? DEFAULT_MAX_LIVE_VERSIONS;
    if (!Number.isInteger(this.maxLive) || this.maxLive < 1) throw new RlstreamError('CONFIG_INVALID', `maxLiveVersions must be a positive integer, got ${String(opts.maxLiveVersions)}`);
    this.maxBatch = opts.maxBatch ?? opts.slots;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1 || this.maxBatch > opts.slots) throw new RlstreamError('CONFIG_INVALID', `maxBatch must be an integer in [1, slots ${opts.slots}], got ${String(opts.maxBatch)}`);
    model.kvReserve(opts.slots, opts.maxLen);
    this.rows = new Float32Array(opts.slots * model.config.vocab_size);
  }

  stats(): NativeEngineStats {
    return { ...this.counters, cachedSessions: this.slots.filter((s) => !s.busy && s.session !== null && s.tokens.length > 0).length };
  }

  /**
   * The version tokens sampled from now on carry, when the model's weights were changed in place by its owner (a
   * trainer in this process) between two steps. Sessions' cached tokens from other versions are dropped at their
   * next turn; turns under way go on, their earlier tokens' K/V as the old weights computed them.
   */
  setVersion(version: number): void {
    this.version = version;
    this.live.clear();
    this.live.add(version);
    this.pins.clear();
    for (const r of this.running) r.version = version;
  }

  /**
   * Takes a new policy version whose weights `load` puts in the runner (written in place, or added beside the
   * others on a runner with dropWeights), as RolloutInterrupt `mode` says. 'next_turn': on a runner with
   * dropWeights it loads while steps go on and every turn admitted after it runs it, the turns under way finishing
   * on their weights (unloaded once they have); on one without, admissions pause until the turns under way finish
   * on the old weights, then it loads. 'next_token': it loads after the step in flight and
   * the turns under way go on with the new weights, their context (prompt and tokens so far) prefilled again on
   * them; each token keeps the version that sampled it. Both unload every other version. 'finish': it loads while
   * steps go on, and only turns admitted after it (of sessions not pinned to a loaded version) run it. Sessions'
   * cached tokens from other versions than the one their next turn runs are dropped then.
   */
  async swap(version: number, load: () => Promise<void>, mode: RolloutInterrupt): Promise<void> {
    if (mode === 'finish') return this.add(version, load, false);
    // (pausing admissions would leave the runner idle until the longest turn under way ends, and while it loads)
    if (mode === 'next_turn' && this.model.dropWeights) return this.add(version, load, true);
    this.paused = true;
    try {
      if (mode === 'next_turn' && this.running.length > 0) await new Promise<void>((resolve) => (this.drained = resolve));
      await this.looping;
      const t0 = performance.now();
      await load();
      this.counters.loadMs += performance.now() - t0;
      this.version = version;
      this.broken = null; // the new weights get their own chance
      const old = [...this.live];
      this.live.clear();
      this.live.add(version);
      this.pins.clear();
      for (const v of old) await this.model.dropWeights?.(v);
      if (mode === 'next_token') this.counters.interrupted += this.running.length;
      for (const r of this.running) {
        r.version = version;
        this.model.kvTruncate(r.slot, 0);
        const s = this.slots[r.slot]!;
        s.tokens = [];
        s.version = version;
        r.feed = [...r.req.promptIds, ...r.tokens];
      }
    } finally {
      this.paused = false;
      this.drained = null;
      void this.loop();
    }
  }

  /**
   * The version's weights beside the others; new turns take it, turns under way keep theirs. `unpin` ('next_turn'):
   * so do the sessions' next turns; else ('finish') sessions stay on the version of their first turn.
   */
  private async add(version: number, load: () => Promise<void>, unpin: boolean): Promise<void> {
    if (!this.model.dropWeights) throw new RlstreamError('CONFIG_INVALID', "rollout.interrupt 'finish' needs two versions' weights at once; this runner holds one (use next_turn or next_token)");
    if (this.live.has(version)) throw new RlstreamError('INPUT_INVALID', `policy version ${version} is already loaded`);
    const t0 = performance.now();
    await load();
    this.counters.loadMs += performance.now() - t0;
    this.live.add(version);
    this.version = version;
    this.broken = null;
    // Past maxLiveVersions ('next_turn': past the newest), older versions' sessions move to the newest at their next turn.
    const keep = new Set([...this.live].sort((a, b) => b - a).slice(0, unpin ? 1 : this.maxLive));
    for (const [session, v] of this.pins) if (!keep.has(v)) this.pins.delete(session);
    this.unloadIdle();
    void this.loop();
  }

  /** Unloads versions (other than the newest) that no running turn or pinned session needs any more. */
  private unloadIdle(): void {
    const drop = this.model.dropWeights?.bind(this.model);
    if (!drop) return;
    const needed = new Set([this.version, ...this.pins.values(), ...this.running.map((r) => r.version)]);
    for (const v of [...this.live])
      if (!needed.has(v)) {
        this.live.delete(v);
        this.lastStep.delete(v);
        // Releasing an onnxruntime session only frees memory; one that fails to is left to the process's end.
        void drop(v).catch(() => undefined);
      }
  }

  /** The version a turn of `session` runs on: the one it is pinned to while loaded, else (and then pinned to) the newest. */
  private versionFor(session: string | undefined): number {
    if (session === undefined) return this.version;
    const pinned = this.pins.get(session);
    if (pinned !== undefined && this.live.has(pinned)) return pinned;
    this.pins.set(session, this.version);
    return this.version;
  }

  /**
   * False once the engine is closed, or a failed step found its runner no longer runs (its requests then fail at
   * once with BACKEND_UNAVAILABLE); a swap that loads new weights makes it healthy again. A step that failed on a
   * bad batch alone leaves it healthy.
   */
  healthy(): boolean {
    return !this.closed && this.broken === null;
  }

  currentPolicyVersion(): number {
    return this.version;
  }

  generate(req: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    if (this.closed) return Promise.reject(new RlstreamError('BACKEND_UNAVAILABLE', 'the native engine is closed'));
    if (this.broken) return Promise.reject(this.broken);
    // Refused here, before it joins a step: a bad token id found by the runner would fail the whole step.
    const bad = (m: string) => Promise.reject(new RlstreamError('BACKEND_BAD_REQUEST', `request ${req?.requestId ?? '?'}: ${m}`));
    if (!req || !Array.isArray(req.promptIds)) return bad('promptIds must be an array of token ids');
    const V = this.model.config.vocab_size;
    const n = req.promptIds.length;
    if (n < 1) return bad('promptIds is empty');
    for (let i = 0; i < n; i++) {
      const t = req.promptIds[i]!;
      if (!Number.isInteger(t) || t < 0 || t >= V) return bad(`token id ${t} at position ${i} is outside the vocabulary [0, ${V})`);
    }
    const k = req.topLogprobs ?? 0;
    if (!Number.isInteger(k) || k < 0 || k > MAX_TOP_LOGPROBS) return bad(`topLogprobs must be an integer in [0, ${MAX_TOP_LOGPROBS}], got ${String(k)}`);
    try {
      validateSampling(req.sampling, V);
    } catch (err) {
      return Promise.reject(err);
    }
    // A turn ends with 'length' where the context does (a growing agent context may reach it mid-trajectory); a
    // prompt that fills it leaves nothing to generate.
    if (n >= this.opts.maxLen) return bad(`the prompt has ${n} tokens; the engine's maxLen ${this.opts.maxLen} leaves no room to generate`);
    return new Promise<GenerateResult>((resolve, reject) => {
      this.waiting.push({
        req,
        slot: -1,
        version: -1,
        feed: [],
        tokens: [],
        logprobs: [],
        versions: [],
        maxNew: Math.min(req.sampling.max_new_tokens, this.opts.maxLen - n),
        top: k > 0 ? [] : null,
        stop: new Set(req.sampling.stop_token_ids),
        rng: new Rng(req.sampling.seed ?? randomInt(0, 2 ** 48 - 1)),
        t0: performance.now(),
        signal,
        resolve,
        reject,
      });
      void this.loop();
    });
  }

  /** The session's trajectory is over: its slot is free for others. */
  releaseSession(sessionId: string): void {
    this.slots.forEach((s, i) => {
      if (s.session !== sessionId || s.busy) return;
      s.session = null;
      s.tokens = [];
      this.released.push(i);
    });
    this.pins.delete(sessionId);
    this.unloadIdle();
  }

  close(): void {
    this.closed = true;
    this.handBack(); // turns already finished keep their results
    const err = new RlstreamError('BACKEND_UNAVAILABLE', 'the native engine was closed');
    for (const r of [...this.waiting, ...this.running]) r.reject(err);
    this.waiting.length = 0;
    this.running.length = 0;
  }

  private loop(): Promise<void> {
    // A turn handed back by the loop's last step may start its next one after the loop decided to stop but
    // before it ended: the loop then starts again (with nothing running, a waiting turn always finds a slot).
    this.looping ??= this.run().finally(() => {
      this.looping = null;
      if (this.continues()) void this.loop();
    });
    return this.looping;
  }

  private async run(): Promise<void> {
    try {
      await Promise.resolve(); // requests made in the same tick start in the same step
      // Each step is launched before the turns the last one finished are handed back: their owners' code (an agent
      // loop's parsing, tool calls, the next turn's prompt) then runs while the device computes the next step,
      // instead of between two steps with the device idle. A turn that owner starts joins the step after.
      let inflight: Promise<void> | null = null;
      do {
        if (inflight) await inflight;
        inflight = this.continues() ? this.launch() : null;
        this.handBack();
      } while (inflight);
    } catch (err) {
      // Not a step (launch settles its own failures): the scheduler itself threw. Every request is settled
      // rather than left waiting.
      this.handBack();
      const e = new RlstreamError('INTERNAL', `the scheduler failed: ${describeError(err)}`, { cause: err });
      for (const r of this.running) this.freeSlot(r.slot);
      for (const r of [...this.waiting, ...this.running]) r.reject(e);
      this.waiting.length = 0;
      this.running.length = 0;
    }
  }

  /** Whether the loop takes another step. A swap stops it after its step ('next_token'), or once the running turns are done ('next_turn'). */
  private continues(): boolean {
    return !this.closed && (this.paused ? this.drained !== null && this.running.length > 0 : this.waiting.length > 0 || this.running.length > 0);
  }

  /** Resolves the turns that finished (retire keeps them until the next step is on its way). */
  private handBack(): void {
    const done = this.finished.splice(0);
    for (const f of done) f.run.resolve(f.result);
  }

  /**
   * Admits what fits and starts one extend over every running request; the promise samples, and retires the
   * finished. null when no row can run.
   */
  private launch(): Promise<void> | null {
    for (const slot of this.released.splice(0)) if (this.slots[slot]!.session === null && !this.slots[slot]!.busy) this.model.kvTruncate(slot, 0);
    let prefill = 0;
    while (!this.paused && this.waiting.length > 0 && this.running.length < this.maxBatch) {
      const run = this.waiting[0]!;
      if (prefill > 0 && prefill + run.req.promptIds.length > this.prefillCap) break;
      const slot = this.claim(run.req.sessionId);
      if (slot < 0) break;
      this.waiting.shift();
      prefill += this.admit(run, slot);
    }
    for (const r of this.running.filter((x) => x.signal?.aborted)) this.retire(r, 'abort');
    if (this.running.length === 0) return null;
    // A step runs one version's weights: that of the running turns whose version waited longest ('finish' keeps
    // several; otherwise every turn runs the one).
    let version = this.running[0]!.version;
    for (const r of this.running) if ((this.lastStep.get(r.version) ?? -1) < (this.lastStep.get(version) ?? -1)) version = r.version;
    this.lastStep.set(version, ++this.launches);
    // Every decoding row, and prefills (new turns, contexts again after a swap) up to maxPrefillTokens a step.
    const active: Run[] = [];
    let budget = 0;
    for (const r of this.running) {
      if (r.version !== version) continue;
      if (r.feed.length > 1) {
        if (budget > 0 && budget + r.feed.length > this.prefillCap) continue;
        budget += r.feed.length;
      }
      active.push(r);
    }
    if (active.length === 0) return null;
    const B = active.length;
    const slots = new Int32Array(B);
    const counts = new Int32Array(B);
    const inv = new Float32Array(B);
    const toks: number[] = [];
    active.forEach((r, b) => {
      slots[b] = r.slot;
      counts[b] = r.feed.length;
      inv[b] = inverseTemperature(r.req.sampling);
      for (const t of r.feed) toks.push(t);
      this.slots[r.slot]!.tokens.push(...r.feed);
      if (r.feed.length > 1 || r.tokens.length === 0) this.counters.prefillTokens += r.feed.length;
      else this.counters.decodeTokens += 1;
    });
    const V = this.model.config.vocab_size;
    // Rows without top-k / top-p are drawn where the probabilities are (the rows stay on the device); a step with
    // any truncated row brings every row to the host for sampleToken.
    const prefilled = prefillOf(active);
    const t0 = performance.now();
    // (a runner holding several versions is named the step's; it samples on the host)
    const versioned = this.model.dropWeights !== undefined;
    const sampleWhereRowsAre = versioned ? undefined : this.model.extendSample?.bind(this.model);
    const sampledRows: Promise<(b: number) => { token: number; logprob: number }> = sampleWhereRowsAre && active.every((r) => r.top === null && isUntruncated(r.req.sampling, V))
      ? sampleWhereRowsAre(slots, counts, Int32Array.from(toks), inv, Float64Array.from(active, (r) => (isGreedy(r.req.sampling) ? -1 : r.rng.next())))
          .then((out) => (b: number) => ({ token: out.tokens[b]!, logprob: out.logprobs[b]! }))
      : this.model
          .extend(slots, counts, Int32Array.from(toks), inv, this.rows.subarray(0, B * V), versioned ? version : undefined)
          .then((probs) => (b: number) => {
            const row = probs.subarray(b * V, (b + 1) * V);
            const r = active[b]!;
            // the alternatives come from the very row the token is drawn from
            if (r.top) r.top.push(topAlternatives(row, r.req.topLogprobs!));
            return sampleToken(row, r.req.sampling, r.rng, this.scratch);
          });
    return sampledRows.then(
      (sampled) => this.sampled(active, version, sampled, t0, prefilled),
      (err: unknown) => this.failStep(active, version, prefilled, err),
    );
  }

  /** The tokens of a step that ran: each active turn's next token, and the finished retired. */
  private sampled(active: Run[], version: number, sampled: (b: number) => { token: number; logprob: number }, t0: number, prefill: number): void {
    this.counters.computeMs += performance.now() - t0;
    this.counters.steps++;
    if (prefill > 0) this.counters.prefillSteps++;
    active.forEach((r, b) => {
      const { token, logprob } = sampled(b);
      r.tokens.push(token);
      r.logprobs.push(logprob);
      r.versions.push(version);
      r.feed = [token];
      const reason: FinishReason | null = r.stop.has(token) ? 'stop' : r.tokens.length >= r.maxNew ? 'length' : null;
      if (reason) this.retire(r, reason);
    });
    this.unloadIdle();
  }

  /**
   * A step the runner failed fails the turns in it, not the engine: they are rejected with what went wrong, their
   * slots freed (the runner may have written part of their K/V), and the waiting requests go on. If the runner
   * no longer runs at all (its healthy() probe fails too), the waiting and every later request fail at once with
   * BACKEND_UNAVAILABLE until a swap loads weights that run.
   */
  private async failStep(active: Run[], version: number, prefill: number, err: unknown): Promise<void> {
    const e = new RlstreamError('INTERNAL', `policy v${version} step (${active.length} rows, ${prefill} prompt tokens) failed: ${describeError(err)}`, { cause: err });
    for (const r of active) {
      const i = this.running.indexOf(r);
      if (i >= 0) this.running.splice(i, 1);
      this.freeSlot(r.slot);
      r.reject(e);
    }
    if (this.running.length === 0) this.drained?.();
    if (this.closed || (await (this.model.healthy?.(version) ?? Promise.resolve(true)))) return;
    this.broken = new RlstreamError('BACKEND_UNAVAILABLE', `policy v${version} can no longer run (its runner fails even on one token) after: ${e.message}`, { cause: err, retriable: false });
    for (const r of [...this.waiting, ...this.running]) {
      if (r.slot >= 0) this.freeSlot(r.slot);
      r.reject(this.broken);
    }
    this.waiting.length = 0;
    this.running.length = 0;
    this.drained?.();
  }

  /** A slot for a request: its session's own, else a free one, else the least recently used idle session's. */
  private claim(session: string | undefined): number {
    if (session !== undefined) {
      const own = this.slots.findIndex((s) => s.session === session);
      if (own >= 0) return this.slots[own]!.busy ? -1 : own;
    }
    let best = -1;
    for (let i = 0; i < this.slots.length; i++) {
      const s = this.slots[i]!;
      if (s.busy) continue;
      if (s.session === null) return i;
      if (best < 0 || s.lastUse < this.slots[best]!.lastUse) best = i;
    }
    return best;
  }

  /** Keeps the longest cached prefix of the prompt (at least one token is fed, for the next distribution); returns the tokens to prefill. */
  private admit(run: Run, slot: number): number {
    const s = this.slots[slot]!;
    const prompt = run.req.promptIds;
    run.version = this.versionFor(run.req.sessionId);
    if (s.session !== (run.req.sessionId ?? null) || s.version !== run.version) s.tokens = [];
    s.version = run.version;
    let keep = 0;
    const limit = Math.min(s.tokens.length, prompt.length - 1);
    while (keep < limit && s.tokens[keep] === prompt[keep]) keep++;
    this.model.kvTruncate(slot, keep);
    s.tokens.length = keep;
    s.session = run.req.sessionId ?? null;
    s.busy = true;
    s.lastUse = ++this.clock;
    this.counters.reusedTokens += keep;
    if (keep > 0) this.counters.cacheHits++;
    run.slot = slot;
    run.feed = prompt.slice(keep);
    this.running.push(run);
    return run.feed.length;
  }

  private freeSlot(slot: number): void {
    const s = this.slots[slot]!;
    s.busy = false;
    s.session = null;
    s.tokens = [];
    try {
      this.model.kvTruncate(slot, 0);
    } catch {
      // The runner that failed the step may refuse this too; the slot's tokens are forgotten above either way.
    }
  }

  private retire(run: Run, reason: FinishReason): void {
    const i = this.running.indexOf(run);
    if (i >= 0) this.running.splice(i, 1);
    const s = this.slots[run.slot]!;
    s.busy = false;
    s.lastUse = ++this.clock;
    if (s.session === null) {
      s.tokens = []; // nothing to keep it for
      this.model.kvTruncate(run.slot, 0);
    }
    if (this.running.length === 0) this.drained?.();
    this.finished.push({
      run,
      result: {
        tokenIds: run.tokens,
        logprobs: run.logprobs,
        finishReason: reason,
        policyVersions: run.versions,
        ...(run.top && { topLogprobs: run.top }),
        server: this.server,
        latencyMs: performance.now() - run.t0,
      },
    });
  }
}

/** Prompt tokens a step's rows prefill (a decode row feeds one token). */
function prefillOf(active: Run[]): number {
  return active.reduce((n, r) => n + (r.feed.length > 1 || r.tokens.length === 0 ? r.feed.length : 0), 0);
}
