// Routes generate calls over many inference servers (verl's AsyncLLMServerManager semantics): a new
// session (trajectory) goes to the up server with the fewest requests in flight; its later turns stick
// to that server (a bounded LRU of session → server) so the server's prefix cache holds its context.
// Per-server concurrency caps queue excess calls; 5xx and connection errors are retried with
// exponential backoff; consecutive failures mark a server down (its sessions move elsewhere) and a
// periodic health check marks it up again.
import { RlstreamError } from '../../core/errors.ts';
import { isRetriable, retry } from '../../core/retry.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import type { InferenceServer } from './http.ts';
import type { GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from './types.ts';

export interface ServerManagerOptions {
  /** Requests in flight per server before calls queue (default 256). */
  maxConcurrencyPerServer?: number;
  /** Sticky routes kept (least recently used dropped first; default 100 000). */
  stickyCapacity?: number;
  /** Retries after the first attempt for retriable errors (default 3). */
  maxRetries?: number;
  /** First backoff (default 200 ms), doubled per retry up to backoffMaxMs (default 5 000 ms), ±20 % jitter. */
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Consecutive failures that mark a server down (default 3). */
  failuresToMarkDown?: number;
  /** Health checks every this many ms (default 10 000; 0 disables the timer, checkHealth() still works). */
  healthIntervalMs?: number;
  /** Policy version before the first update (default 0). */
  initialPolicyVersion?: number;
  name?: string;
  logger?: Logger;
}

interface ServerState {
  server: InferenceServer;
  inflight: number;
  up: boolean;
  consecutiveFailures: number;
  requests: number;
  failures: number;
  /** The policy version this server's weights are at: a server whose reload failed keeps its old one. */
  version: number;
}

export interface ServerStats {
  address: string;
  up: boolean;
  inflight: number;
  requests: number;
  failures: number;
}

export class ServerManager implements LlmBackend {
  readonly name: string;
  /** What every server returns (a request may go to any of them). */
  readonly maxTopLogprobs?: number;
  private readonly states: ServerState[];
  /** session → server index; a Map iterates in insertion order, which makes it an LRU when re-inserted on use. */
  private readonly sticky = new Map<string, number>();
  private readonly waiters: (() => void)[] = [];
  private readonly timer: NodeJS.Timeout | undefined;
  private readonly o: Required<Omit<ServerManagerOptions, 'name' | 'logger'>>;
  private readonly logger: Logger;
  private version: number;

  constructor(servers: InferenceServer[], options: ServerManagerOptions = {}) {
    if (servers.length === 0) throw new RlstreamError('CONFIG_INVALID', 'backend.servers must list at least one server');
    this.name = options.name ?? 'server-manager';
    const top = Math.min(...servers.map((s) => s.maxTopLogprobs ?? 0));
    if (top > 0) this.maxTopLogprobs = top;
    this.logger = options.logger ?? silentLogger;
    this.o = {
      maxConcurrencyPerServer: options.maxConcurrencyPerServer ?? 256,
      stickyCapacity: options.stickyCapacity ?? 100_000,
      maxRetries: options.maxRetries ?? 3,
      backoffBaseMs: options.backoffBaseMs ?? 200,
      backoffMaxMs: options.backoffMaxMs ?? 5_000,
      failuresToMarkDown: options.failuresToMarkDown ?? 3,
      healthIntervalMs: options.healthIntervalMs ?? 10_000,
      initialPolicyVersion: options.initialPolicyVersion ?? 0,
    };
    this.version = this.o.initialPolicyVersion;
    this.states = servers.map((server) => ({ server, inflight: 0, up: true, consecutiveFailures: 0, requests: 0, failures: 0, version: this.o.initialPolicyVersion }));
    if (this.o.healthIntervalMs > 0) {
      this.timer = setInterval(() => void this.checkHealth(), this.o.healthIntervalMs);
      this.timer.unref();
    }
  }

  currentPolicyVersion(): number {
    return this.version;
  }

  stats(): ServerStats[] {
    return this.states.map((s) => ({ address: s.server.address, up: s.up, inflight: s.inflight, requests: s.requests, failures: s.failures }));
  }

  /** The server a session is pinned to, if any. */
  routeOf(sessionId: string): string | undefined {
    const i = this.sticky.get(sessionId);
    return i === undefined ? undefined : this.states[i]?.server.address;
  }

  releaseSession(sessionId: string): void {
    this.sticky.delete(sessionId);
  }

  markDown(address: string): void {
    const s = this.states.find((x) => x.server.address === address);
    if (s && s.up) {
      s.up = false;
      this.logger.warn('inference server marked down', { server: address });
    }
  }

  markUp(address: string): void {
    const s = this.states.find((x) => x.server.address === address);
    if (s && !s.up) {
      s.up = true;
      s.consecutiveFailures = 0;
      this.logger.info('inference server marked up', { server: address });
      this.wake();
    }
  }

  /** Ask every server's health endpoint once; down servers that answer come back up, and vice versa. */
  async checkHealth(): Promise<void> {
    await Promise.all(
      this.states.map(async (s) => {
        const ok = await s.server.health().catch(() => false);
        if (ok) this.markUp(s.server.address);
        else this.markDown(s.server.address);
      }),
    );
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  /** Pick (and reserve a slot on) a server for this session; waits while the chosen servers are full. */
  private async acquire(sessionId: string | undefined, signal?: AbortSignal): Promise<number> {
    for (;;) {
      if (signal?.aborted) throw signal.reason as Error;
      let idx: number | undefined;
      const pinned = sessionId === undefined ? undefined : this.sticky.get(sessionId);
      if (pinned !== undefined && this.states[pinned]?.up) {
        if (this.states[pinned]!.inflight < this.o.maxConcurrencyPerServer) idx = pinned;
        // A full pinned server: wait for it rather than lose the session's prefix cache.
      } else {
        const up = this.states.map((s, i) => ({ s, i })).filter(({ s }) => s.up);
        if (up.length === 0) throw new RlstreamError('BACKEND_UNAVAILABLE', `all ${this.states.length} inference servers are down`);
        let best: number | undefined;
        for (const { s, i } of up) if (s.inflight < this.o.maxConcurrencyPerServer && (best === undefined || s.inflight < this.states[best]!.inflight)) best = i;
        idx = best;
      }
      if (idx !== undefined) {
        this.states[idx]!.inflight++;
        if (sessionId !== undefined) {
          this.sticky.delete(sessionId);
          this.sticky.set(sessionId, idx);
          if (this.sticky.size > this.o.stickyCapacity) this.sticky.delete(this.sticky.keys().next().value!);
        }
        return idx;
      }
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => reject(signal!.reason as Error);
        signal?.addEventListener('abort', onAbort, { once: true });
        this.waiters.push(() => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        });
      });
    }
  }

  private release(idx: number): void {
    this.states[idx]!.inflight--;
    this.wake();
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    const t0 = performance.now();
    try {
      return await retry((attempt) => this.generateOnce(request, t0, attempt, signal), {
        retries: this.o.maxRetries,
        initialDelayMs: this.o.backoffBaseMs,
        maxDelayMs: this.o.backoffMaxMs,
        jitter: 0.2,
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      // Only a retriable failure outlives the retries: say that they were used up.
      if (signal?.aborted || !isRetriable(err)) throw err;
      throw new RlstreamError('BACKEND_UNAVAILABLE', `generate ${request.requestId} failed after ${this.o.maxRetries + 1} attempts: ${(err as Error).message}`, { cause: err });
    }
  }

  /** One try: a server (no server up is BACKEND_UNAVAILABLE, retriable) and its answer. */
  private async generateOnce(request: GenerateRequest, t0: number, attempt: number, signal: AbortSignal | undefined): Promise<GenerateResult> {
    const idx = await this.acquire(request.sessionId, signal);
    const st = this.states[idx]!;
    const version = st.version;
    st.requests++;
    try {
      const out = await st.server.generate(request, signal);
      st.consecutiveFailures = 0;
      return {
        tokenIds: out.tokenIds,
        logprobs: out.logprobs,
        finishReason: out.finishReason,
        policyVersions: out.policyVersions ?? out.tokenIds.map(() => version),
        server: st.server.address,
        latencyMs: performance.now() - t0,
        ...(out.retokenized ? { retokenized: out.retokenized } : {}),
        ...(out.topLogprobs ? { topLogprobs: out.topLogprobs } : {}),
      };
    } catch (err) {
      if (!signal?.aborted && isRetriable(err)) {
        st.failures++;
        st.consecutiveFailures++;
        if (st.consecutiveFailures >= this.o.failuresToMarkDown) this.markDown(st.server.address);
        this.logger.warn('generate failed, retrying', { server: st.server.address, attempt: attempt - 1, error: (err as Error).message });
        // Let the retry choose again: the pinned server may be the problem.
        if (request.sessionId !== undefined && !st.up) this.sticky.delete(request.sessionId);
      }
      throw err;
    } finally {
      this.release(idx);
    }
  }

  /**
   * Load a version on every server. Each server's tokens carry the version its weights are at, so a server
   * whose reload failed keeps labelling with its old version (and is tried again with the next one); the
   * manager's version moves only when every server took the new one, else the failures are thrown.
   */
  async updatePolicy(update: PolicyUpdate): Promise<void> {
    const results = await Promise.allSettled(
      this.states.map(async (s) => {
        await s.server.updateWeights?.(update);
        s.version = update.version;
      }),
    );
    const failed = results.flatMap((r, i) => (r.status === 'rejected' ? [{ server: this.states[i]!.server.address, error: r.reason as Error }] : []));
    if (failed.length === 0) {
      this.version = update.version;
      return;
    }
    for (const f of failed) this.logger.error('weight sync failed', { server: f.server, version: update.version, error: f.error.message });
    throw new RlstreamError('BACKEND_UNAVAILABLE', `policy version ${update.version} reached ${results.length - failed.length} of ${results.length} servers: ${failed.map((f) => f.error.message).join('; ')}`, { cause: failed[0]!.error, retriable: false });
  }

  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
  }
}
