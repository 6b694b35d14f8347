// The running batch spread over worker threads, each with its own engine and onnxruntime session (data
// parallel). onnxruntime-node runs a session on the calling thread, and a step of a few small matrix products
// splits poorly across intra-op threads; separate engines on separate cores each run their share of the rows
// at full speed. A session (trajectory) always goes to the same worker, which keeps its KV cache between
// turns; other requests go to the worker with the fewest in flight.
// A worker that dies (its thread exits or throws) is replaced by a fresh one, loaded with the current version,
// while the others serve; the requests it held run again on another. A worker on which a new version failed
// to load serves no new requests until a retry loads it, so new requests never mix versions.
import { Worker } from 'node:worker_threads';
import { RlstreamError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import { hfConfigJson, type ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult } from '../backends/types.ts';
import type { NativeEngineStats } from './native-engine.ts';
import type { EngineSetup, LoadTimes, PolicyEngine } from './engine-host.ts';
import { onAbortUntilSettled } from './on-abort.ts';
import { errorFromWire, toWire, type FromWorker, type ToWorker, type WireTensors } from './engine-worker-protocol.ts';

interface Pending {
  resolve: (value: never) => void;
  reject: (err: Error) => void;
}

class EngineWorker {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  inFlight = 0;
  stats: NativeEngineStats | null = null;
  dead: Error | null = null;
  /** The version this worker's engine serves; null until its first load. */
  version: number | null = null;
  /** The last load, settled or not: the thread must not be ended while onnxruntime builds a session. */
  loading: Promise<void> = Promise.resolve();

  private readonly logger: Logger;

  constructor(
    readonly index: number,
    logger: Logger,
    onDeath: (w: EngineWorker) => void,
  ) {
    this.logger = logger.child({ worker: index });
    this.worker = new Worker(new URL('./engine-worker.mjs', import.meta.url));
    this.worker.on('message', (m: FromWorker) => this.onMessage(m));
    const fail = (err: Error) => {
      const first = this.dead === null;
      this.dead ??= err;
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
      if (first) onDeath(this);
    };
    this.worker.on('error', (err) => {
      this.logger.error('a policy engine worker failed', { error: err.message });
      fail(new RlstreamError('BACKEND_UNAVAILABLE', `policy engine worker ${index} failed: ${err.message}`, { retriable: true }));
    });
    this.worker.on('exit', (code) => fail(new RlstreamError('BACKEND_UNAVAILABLE', `policy engine worker ${index} exited (code ${code})`, { retriable: true })));
  }

  call<T>(make: (id: number) => ToWorker, signal?: AbortSignal): Promise<T> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.nextId++;
    const result = new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: never) => void, reject });
      this.worker.postMessage(make(id));
    });
    onAbortUntilSettled(signal, () => this.post({ t: 'abort', id }), result);
    return result;
  }

  /**
   * Load a version (the first load also carries the engine set-up); the worker serves it once this resolves.
   * Loads run one at a time, and one older than what the worker already serves is skipped: two loads racing
   * (a hot-swap while a retry runs) must not leave the worker on the older version.
   */
  async load(v: Loadable, setup?: EngineSetup): Promise<LoadTimes> {
    const loading = this.loading.then(() => {
      if (this.version !== null && v.version <= this.version) return { exportMs: 0, loadMs: 0 };
      return this.call<LoadTimes>((id) => ({ t: 'load', id, configJson: v.configJson, weights: v.weights, version: v.version, ...(setup && { setup }) }));
    });
    this.loading = loading.then(
      () => {},
      () => {},
    );
    const times = await loading;
    this.version = Math.max(this.version ?? v.version, v.version);
    return times;
  }

  post(m: ToWorker): void {
    if (!this.dead) this.worker.postMessage(m);
  }

  private onMessage(m: FromWorker): void {
    if (m.t === 'log') return this.logger[m.level](m.msg, m.fields);
    const p = this.pending.get(m.id);
    if (!p) return;
    this.pending.delete(m.id);
    if ('stats' in m && m.stats) this.stats = m.stats;
    if (m.t === 'failed') p.reject(errorFromWire(m.error));
    else if (m.t === 'result') p.resolve(m.result as never);
    else if (m.t === 'loaded') p.resolve(m.times as never);
    else p.resolve(undefined as never);
  }

  async terminate(): Promise<void> {
    await this.worker.terminate();
  }
}

/** A version as it crosses to a worker, kept so that a replacement worker can load it too. */
interface Loadable {
  configJson: string;
  weights: WireTensors;
  version: number;
}

// A replacement (or a worker whose load failed) is tried again after these delays, the last one repeating.
const RETRY_DELAYS_MS = [0, 1_000, 5_000, 30_000];
const GAUGES = new Set<keyof NativeEngineStats>(['cachedSessions']);
// How long a request waits for a worker when none serves the current version (all being replaced).
const WAIT_FOR_WORKER_MS = 30_000;

export class WorkerEngines implements PolicyEngine {
  private closed = false;
  /** Workers that are being brought to the current version (replaced or retried); one loop each. */
  private readonly recovering = new Set<number>();
  /** Failed attempts in a row per worker, for the retry delay. */
  private readonly failures: number[] = [];
  /** Stats of workers that died, so the sums never go backwards. */
  private readonly retired = {} as Record<keyof NativeEngineStats, number>;
  private readonly workers: EngineWorker[];
  private readonly logger: Logger;
  private current: Loadable;
  /** Workers started to replace dead ones (for metrics and tests). */
  restarts = 0;
  /** Requests waiting for a worker to serve the current version: woken when one may (see wake). */
  private readonly waiting = new Set<() => void>();

  private constructor(
    count: number,
    current: Loadable,
    private readonly setup: EngineSetup,
    logger: Logger,
    readonly first: LoadTimes,
  ) {
    this.logger = logger;
    this.current = current;
    this.workers = Array.from({ length: count }, (_, i) => this.spawn(i));
  }

  /** Start `count` workers, each with `setup.maxBatch / count` rows (rounded up) and `setup.threads` threads. */
  static async create(config: ParsedModelConfig, weights: TensorMap, version: number, setup: EngineSetup, count: number, logger: Logger): Promise<WorkerEngines> {
    const perWorker: EngineSetup = { ...setup, maxBatch: Math.ceil(setup.maxBatch / count), kvCacheBytes: Math.floor(setup.kvCacheBytes / count) };
    const engines = new WorkerEngines(count, { configJson: JSON.stringify(hfConfigJson(config)), weights: toWire(weights), version }, perWorker, logger, { exportMs: 0, loadMs: 0 });
    // Settled, not all: a worker is only terminated (after a failure) once it no longer runs onnxruntime, as
    // ending a thread inside a native call aborts the process.
    const settled = await Promise.allSettled(engines.workers.map((w) => w.load(engines.current, perWorker)));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await engines.close();
      throw failed.reason;
    }
    Object.assign(engines.first, maxTimes(settled.map((r) => (r as PromiseFulfilledResult<LoadTimes>).value)));
    return engines;
  }

  private spawn(index: number): EngineWorker {
    return new EngineWorker(index, this.logger, (w) => this.onDeath(w));
  }

  private onDeath(w: EngineWorker): void {
    if (this.closed || this.workers[w.index] !== w) return;
    // Counters carry over to the retired sum (and leave the worker, which stays in its slot until the replacement
    // starts, up to a retry delay later: counted in both they were reported twice); the gauges (what its cache
    // held) died with it.
    for (const [k, v] of Object.entries(w.stats ?? {}) as [keyof NativeEngineStats, number][]) this.retired[k] = (this.retired[k] ?? 0) + (GAUGES.has(k) ? 0 : v);
    w.stats = null;
    this.logger.error('a policy engine worker died; starting a replacement', { worker: w.index, error: w.dead?.message });
    this.recover(w.index);
  }

  /**
   * Bring worker `i` to the current version, in the background: a dead one is replaced by a new worker (first
   * load, with the set-up), a live one loads the current version. Failures (a load refused, a replacement that
   * dies too) are retried after growing delays, so a worker that cannot start does not spin; this ends when
   * the worker serves the current version or the engines close.
   */
  private recover(i: number): void {
    if (this.recovering.has(i)) return;
    this.recovering.add(i);
    void (async () => {
      while (!this.closed) {
        let w = this.workers[i]!;
        if (!w.dead && w.version === this.current.version) break;
        const failures = this.failures[i] ?? 0;
        await new Promise((r) => setTimeout(r, RETRY_DELAYS_MS[Math.min(failures, RETRY_DELAYS_MS.length - 1)]).unref());
        if (this.closed) break;
        if (w.dead) {
          w = this.workers[i] = this.spawn(i);
          this.restarts++;
        }
        const target = this.current;
        try {
          await w.load(target, w.version === null ? this.setup : undefined);
          this.failures[i] = 0;
          this.wake();
          this.logger.info('policy engine worker serves the current version', { worker: i, version: target.version });
        } catch (err) {
          this.failures[i] = failures + 1;
          this.logger.warn('policy engine worker could not load the current version; retrying', { worker: i, version: target.version, failures: failures + 1, error: err instanceof Error ? err.message : String(err) });
        }
      }
      this.recovering.delete(i);
    })();
  }

  /** Workers that take new requests: alive and on the current version. */
  private usable(): EngineWorker[] {
    return this.workers.filter((w) => !w.dead && w.version === this.current.version);
  }

  /**
   * Serve a request on a worker. If that worker dies before answering, or none serves the current version
   * yet (all are being replaced), the request waits for one and runs again there from its prompt: it has
   * produced nothing yet, and the same seed samples the same tokens.
   */
  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    for (let attempt = 0; ; attempt++) {
      if (this.closed) throw new RlstreamError('BACKEND_UNAVAILABLE', 'the built-in policy engine closed', { retriable: false });
      const w = this.route(request.sessionId) ?? (await this.waitForWorker(request.sessionId, signal));
      w.inFlight++;
      try {
        return await w.call<GenerateResult>((id) => ({ t: 'generate', id, request }), signal);
      } catch (err) {
        if (!w.dead || err !== w.dead || attempt >= this.workers.length || signal?.aborted) throw err;
        this.logger.warn('a request lost its engine worker; running it on another', { requestId: request.requestId, worker: w.index });
      } finally {
        w.inFlight--;
      }
    }
  }

  /** A worker that serves the current version, once one does (while workers are replaced). */
  private async waitForWorker(sessionId: string | undefined, signal?: AbortSignal): Promise<EngineWorker> {
    const by = Date.now() + WAIT_FOR_WORKER_MS;
    for (;;) {
      const w = this.route(sessionId);
      if (w) return w;
      if (this.closed) throw new RlstreamError('BACKEND_UNAVAILABLE', 'the built-in policy engine closed', { retriable: false });
      if (signal?.aborted || Date.now() > by) {
        throw new RlstreamError('BACKEND_UNAVAILABLE', `no policy engine worker served the current version within ${WAIT_FOR_WORKER_MS / 1000} s (they are being restarted)`, { retriable: true });
      }
      // Until a worker comes to serve the current version (wake), the deadline, an abort, or close.
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.waiting.delete(done);
          signal?.removeEventListener('abort', done);
          resolve();
        };
        const timer = setTimeout(done, Math.max(0, by - Date.now()) + 1);
        this.waiting.add(done);
        signal?.addEventListener('abort', done, { once: true });
      });
    }
  }

  /** A worker may serve the current version now, or the engines closed: waiting requests look again. */
  private wake(): void {
    for (const done of [...this.waiting]) done();
  }

  private route(sessionId: string | undefined): EngineWorker | undefined {
    if (sessionId !== undefined) {
      // The session's own worker holds its KV cache; while that one recovers, any other serves (a cache miss).
      const own = this.workers[hash(sessionId) % this.workers.length]!;
      if (!own.dead && own.version === this.current.version) return own;
    }
    return this.usable().reduce<EngineWorker | undefined>((a, w) => (!a || w.inFlight < a.inFlight ? w : a), undefined);
  }

  /**
   * To every worker: while its own worker recovered, a session's turns ran on others (see route), which then
   * hold its KV cache and, in interrupt mode 'finish', its pin on an older version (keeping that runner loaded).
   * A worker that never saw the session does nothing with the message.
   */
  releaseSession(sessionId: string): void {
    for (const w of this.workers) w.post({ t: 'release', sessionId });
  }

  /**
   * Load a version on every worker. It fails (and nothing changes) only when no worker could load it; workers
   * where it failed take no new requests and are retried in the background.
   */
  async load(config: ParsedModelConfig, weights: TensorMap, version: number): Promise<LoadTimes> {
    const next: Loadable = { configJson: JSON.stringify(hfConfigJson(config)), weights: toWire(weights), version };
    const live = this.workers.filter((w) => !w.dead && w.version !== null);
    const settled = await Promise.allSettled(live.map((w) => w.load(next)));
    const ok = settled.filter((r): r is PromiseFulfilledResult<LoadTimes> => r.status === 'fulfilled');
    if (ok.length === 0) throw (settled.find((r): r is PromiseRejectedResult => r.status === 'rejected')?.reason as Error | undefined) ?? new RlstreamError('BACKEND_UNAVAILABLE', 'no policy engine worker is running', { retriable: true });
    this.current = next;
    this.wake();
    settled.forEach((r, k) => {
      if (r.status === 'rejected') this.logger.warn('policy engine worker could not load a new version; it serves no new requests until a retry does', { worker: live[k]!.index, version, error: r.reason instanceof Error ? r.reason.message : String(r.reason) });
    });
    // Every worker not on this version now (failed here, or still starting) catches up in the background.
    for (const w of this.workers) if (w.version !== version) this.recover(w.index);
    return maxTimes(ok.map((r) => r.value));
  }

  currentPolicyVersion(): number {
    return this.current.version;
  }

  /** The sum over workers, as of each worker's last finished request (dead workers' last stats included). */
  stats(): NativeEngineStats {
    const sum = { ...this.retired };
    for (const w of this.workers) for (const [k, v] of Object.entries(w.stats ?? {}) as [keyof NativeEngineStats, number][]) sum[k] = (sum[k] ?? 0) + v;
    return sum;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.wake();
    await Promise.all(this.workers.map((w) => w.loading));
    await Promise.allSettled(this.workers.map((w) => w.call((id) => ({ t: 'close', id }))));
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

function maxTimes(times: LoadTimes[]): LoadTimes {
  return { exportMs: Math.max(...times.map((t) => t.exportMs)), loadMs: Math.max(...times.map((t) => t.loadMs)) };
}

/** FNV-1a of a session id: the same session always lands on the same worker. */
function hash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
