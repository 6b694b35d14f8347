// The running batch spread over worker threads, each with its own engine and onnxruntime session (data
// parallel). onnxruntime-node runs a session on the calling thread, and a step of a few small matrix products
// splits poorly across intra-op threads; separate engines on separate cores each run their share of the rows
// at full speed. A session (trajectory) always goes to the same worker, which keeps its KV cache between
// turns; other requests go to the worker with the fewest in flight.
import { Worker } from 'node:worker_threads';
import { RlstreamError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult } from '../backends/types.ts';
import type { ModelConfig } from './config.ts';
import { configToJson } from './config.ts';
import type { EngineStats } from './engine.ts';
import type { EngineSetup, LoadTimes, PolicyEngine } from './engine-host.ts';
import { errorFromWire, toWire, type FromWorker, type ToWorker } from './engine-worker-protocol.ts';

interface Pending {
  resolve: (value: never) => void;
  reject: (err: Error) => void;
}

class EngineWorker {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  inFlight = 0;
  stats: EngineStats | null = null;
  dead: Error | null = null;

  private readonly logger: Logger;

  constructor(readonly index: number, logger: Logger) {
    this.logger = logger.child({ worker: index });
    this.worker = new Worker(new URL('./engine-worker.mjs', import.meta.url));
    this.worker.on('message', (m: FromWorker) => this.onMessage(m));
    const fail = (err: Error) => {
      this.dead ??= err;
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
    };
    this.worker.on('error', (err) => {
      this.logger.error('a policy engine worker failed', { error: err.message });
      fail(new RlstreamError('BACKEND_UNAVAILABLE', `policy engine worker ${index} failed: ${err.message}`, { retriable: false }));
    });
    this.worker.on('exit', (code) => fail(new RlstreamError('BACKEND_UNAVAILABLE', `policy engine worker ${index} exited (code ${code})`, { retriable: false })));
  }

  call<T>(make: (id: number) => ToWorker, signal?: AbortSignal): Promise<T> {
    if (this.dead) return Promise.reject(this.dead);
    const id = this.nextId++;
    const abort = () => this.post({ t: 'abort', id });
    const result = new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: never) => void, reject });
      this.worker.postMessage(make(id));
      if (signal?.aborted) abort();
      else signal?.addEventListener('abort', abort, { once: true });
    });
    // One stop signal is shared by every call of a rollout worker: detach this call's listener once it settles.
    if (signal) {
      const detach = () => signal.removeEventListener('abort', abort);
      result.then(detach, detach);
    }
    return result;
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

export class WorkerEngines implements PolicyEngine {
  private version: number;
  private closed = false;

  private constructor(
    private readonly workers: EngineWorker[],
    version: number,
    readonly first: LoadTimes,
  ) {
    this.version = version;
  }

  /** Start `count` workers, each with `setup.maxBatch / count` rows (rounded up) and `setup.threads` threads. */
  static async create(config: ModelConfig, weights: TensorMap, version: number, setup: EngineSetup, count: number, logger: Logger): Promise<WorkerEngines> {
    const workers = Array.from({ length: count }, (_, i) => new EngineWorker(i, logger));
    const perWorker: EngineSetup = { ...setup, maxBatch: Math.ceil((setup.maxBatch ?? 64) / count), ...(setup.kvCacheBytes !== undefined && { kvCacheBytes: Math.floor(setup.kvCacheBytes / count) }) };
    const engines = new WorkerEngines(workers, version, { exportMs: 0, loadMs: 0 });
    try {
      const times = await engines.loadAll(config, weights, version, perWorker);
      Object.assign(engines.first, times);
    } catch (err) {
      await Promise.all(workers.map((w) => w.terminate()));
      throw err;
    }
    return engines;
  }

  private async loadAll(config: ModelConfig, weights: TensorMap, version: number, setup?: EngineSetup): Promise<LoadTimes> {
    const configJson = configToJson(config);
    const wire = toWire(weights);
    // Settled, not all: a worker is only terminated (after a failure) once it no longer runs onnxruntime, as
    // ending a thread inside a native call aborts the process.
    const settled = await Promise.allSettled(this.workers.map((w) => w.call<LoadTimes>((id) => ({ t: 'load', id, configJson, weights: wire, version, ...(setup && { setup }) }))));
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    const times = settled.map((r) => (r as PromiseFulfilledResult<LoadTimes>).value);
    return { exportMs: Math.max(...times.map((t) => t.exportMs)), loadMs: Math.max(...times.map((t) => t.loadMs)) };
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    if (this.closed) return Promise.reject(new RlstreamError('BACKEND_UNAVAILABLE', 'the built-in policy engine closed', { retriable: false }));
    const w = this.route(request.sessionId);
    w.inFlight++;
    return w.call<GenerateResult>((id) => ({ t: 'generate', id, request }), signal).finally(() => w.inFlight--);
  }

  private route(sessionId: string | undefined): EngineWorker {
    if (sessionId !== undefined) return this.workers[hash(sessionId) % this.workers.length]!;
    return this.workers.reduce((a, w) => (w.inFlight < a.inFlight ? w : a));
  }

  releaseSession(sessionId: string): void {
    this.workers[hash(sessionId) % this.workers.length]!.post({ t: 'release', sessionId });
  }

  async load(config: ModelConfig, weights: TensorMap, version: number): Promise<LoadTimes> {
    const times = await this.loadAll(config, weights, version);
    this.version = version;
    return times;
  }

  currentVersion(): number {
    return this.version;
  }

  /** The sum over workers, as of each worker's last finished request. */
  stats(): EngineStats {
    const sum = {} as Record<keyof EngineStats, number>;
    // Every worker has stats from its first load on.
    for (const w of this.workers) for (const [k, v] of Object.entries(w.stats!) as [keyof EngineStats, number][]) sum[k] = (sum[k] ?? 0) + v;
    return sum;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.allSettled(this.workers.map((w) => w.call((id) => ({ t: 'close', id }))));
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

/** FNV-1a of a session id: the same session always lands on the same worker. */
function hash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
