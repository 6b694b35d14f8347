// Rollout engines on the other GPUs of the host (backend.devices): one process per GPU (engine-process-main.ts,
// forked with CUDA_VISIBLE_DEVICES naming its GPU, so it is device 0 there), each the native CUDA engine, behind the
// server manager's least-load routing and sticky sessions (server-manager.ts, what verl's AsyncLLMServerManager
// does over its rollout servers). Where the main job's trainer runs in this process on a GPU, the trainer's process
// and the engines form the weights group: each new version is broadcast from the trainer's model (rank 0) to every
// engine over NCCL, device to device, into a staging copy that the version's update then copies in place; with
// trainer.lora only the adapters travel, folded in from memory. An engine whose process exits is marked down (its
// sessions move to the others); the group is aborted, so no broadcast waits on it, and later versions are read
// from their files.
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { RlstreamError, type ErrorCode } from '../../core/errors.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import type { Collective } from '../../native/collectives/collective.ts';
import { serveCall } from '../../native/collectives/ipc-collective.ts';
import { visibleDeviceName } from '../../native/gpus.ts';
import { NcclCollective, ncclUniqueId } from '../../native/collectives/nccl-collective.ts';
import { referenceGroup } from '../../native/collectives/reference-collective.ts';
import type { Model } from '../../native/model.ts';
import type { InferenceServer, ServerOutput } from '../backends/http.ts';
import { ServerManager, type ServerManagerOptions } from '../backends/server-manager.ts';
import type { GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from '../backends/types.ts';
import type { EngineFailure, FromEngine, StagePayload, ToEngine } from './engine-process-protocol.ts';
import type { NativeEngineStats, RolloutInterrupt } from './native-engine.ts';
import { MAX_TOP_LOGPROBS } from './sampler.ts';

/** How long an engine may take to load its model (a 7B model reads 15 GB). */
const START_TIMEOUT_MS = 600_000;
/** How long every engine has to queue its part of a version's broadcast before those that did not are killed. */
const STAGE_TIMEOUT_MS = 60_000;
/** How long an engine has to leave on close before it is killed. */
const CLOSE_TIMEOUT_MS = 10_000;

export interface EngineProcessesOptions {
  /** One engine per entry: GPU indices as this process numbers them ('cuda'), or CPU engines by number ('cpu': tests). */
  devices: readonly number[];
  device: 'cuda' | 'cpu';
  source: { configJson: string; weightsPath: string; version: number };
  maxBatch: number;
  maxLen?: number;
  gpuMemoryUtilization: number;
  interrupt: RolloutInterrupt;
  /**
   * Whether a trainer in this process broadcasts its versions to the engines (stageWeights): over NCCL from its GPU
   * ('cuda', device 0 of this process), through this process for CPU models ('cpu'); null: versions by file.
   */
  weightsGroup: 'cuda' | 'cpu' | null;
  /** With a weights group: the trainer trains LoRA adapters, so only they are broadcast (no staging copy). */
  adapters?: boolean;
  /** How long every engine may take to queue its part of a version's broadcast (default 60 s); see stageWeights. */
  stageTimeoutMs?: number;
  manager?: Omit<ServerManagerOptions, 'logger' | 'name'>;
  logger?: Logger;
}

interface Pending<T> {
  resolve: (v: T) => void;
  reject: (e: unknown) => void;
}

function fromFailure(f: EngineFailure): RlstreamError {
  return new RlstreamError(f.code as ErrorCode, f.message, { retriable: f.retriable });
}

/** One engine process, as the server manager sees a server. */
class EngineProcess implements InferenceServer {
  readonly maxTopLogprobs = MAX_TOP_LOGPROBS;
  private seq = 0;
  private readonly calls = new Map<number, Pending<GenerateResult>>();
  private readonly updates = new Map<number, Pending<void>>();
  exited: string | null = null;
  /** The engine's counters as its last answer carried them. */
  stats: NativeEngineStats | null = null;
  /** By version: its part of the broadcast queued ('receiving'), and the weights in ('staged'). */
  private readonly receiving = new Map<number, Pending<void>>();
  private readonly staged = new Map<number, Pending<void>>();

  constructor(
    readonly address: string,
    readonly child: ChildProcess,
  ) {}

  send(m: ToEngine): boolean {
    if (this.exited !== null || !this.child.connected) return false;
    // A process that has just died can still look connected: the write then fails (EPIPE), and every call waiting
    // on it fails as at its exit (the exit event follows).
    this.child.send(m, (err) => err && this.failPending(`its channel failed (${err.message})`));
    return true;
  }

  private gone(): RlstreamError {
    return new RlstreamError('BACKEND_UNAVAILABLE', `rollout engine ${this.address}: its process ${this.exited ?? 'is gone'}`);
  }

  onMessage(m: FromEngine): void {
    switch (m.t) {
      case 'result':
        this.stats = m.stats;
        this.calls.get(m.id)?.resolve(m.result);
        this.calls.delete(m.id);
        break;
      case 'failed':
        this.calls.get(m.id)?.reject(fromFailure(m.error));
        this.calls.delete(m.id);
        break;
      case 'updated':
        this.stats = m.stats;
        this.updates.get(m.id)?.resolve();
        this.updates.delete(m.id);
        break;
      case 'update-failed':
        this.updates.get(m.id)?.reject(fromFailure(m.error));
        this.updates.delete(m.id);
        break;
      case 'receiving':
        this.settle(this.receiving, m.version, null);
        break;
      case 'staged':
        // a failure before 'receiving' means the engine takes no part in the broadcast
        this.settle(this.receiving, m.version, m.error);
        this.settle(this.staged, m.version, m.error);
        break;
    }
  }

  private settle(waiting: Map<number, Pending<void>>, version: number, error: string | null): void {
    const w = waiting.get(version);
    if (!w) return;
    waiting.delete(version);
    if (error === null) w.resolve();
    else w.reject(new RlstreamError('BACKEND_UNAVAILABLE', `rollout engine ${this.address}: version ${version}: ${error}`));
  }

  /** Sends the version's stage message; resolves when its receive is queued, and when the weights are in. */
  stage(version: number, payload: StagePayload): { receiving: Promise<void>; staged: Promise<void> } {
    const receiving = new Promise<void>((resolve, reject) => this.receiving.set(version, { resolve, reject }));
    const staged = new Promise<void>((resolve, reject) => this.staged.set(version, { resolve, reject }));
    receiving.catch(() => {});
    staged.catch(() => {});
    if (!this.send({ t: 'stage', version, payload })) {
      this.settle(this.receiving, version, 'its process is gone');
      this.settle(this.staged, version, 'its process is gone');
    }
    return { receiving, staged };
  }

  /** The process exited: every call waiting on it fails (retriable: the manager tries another engine). */
  onExit(why: string): void {
    this.exited = why;
    this.failPending(why);
  }

  private failPending(why: string): void {
    const err = new RlstreamError('BACKEND_UNAVAILABLE', `rollout engine ${this.address}: its process ${why}`);
    for (const p of [...this.calls.values(), ...this.updates.values(), ...this.receiving.values(), ...this.staged.values()]) p.reject(err);
    this.calls.clear();
    this.updates.clear();
    this.receiving.clear();
    this.staged.clear();
  }

  async generate(request: GenerateRequest, signal?: AbortSignal): Promise<ServerOutput> {
    const id = this.seq++;
    const done = new Promise<GenerateResult>((resolve, reject) => this.calls.set(id, { resolve, reject }));
    if (!this.send({ t: 'generate', id, request })) {
      this.calls.delete(id);
      throw this.gone();
    }
    const onAbort = () => this.send({ t: 'abort', id });
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const r = await done;
      return {
        tokenIds: r.tokenIds,
        logprobs: r.logprobs,
        finishReason: r.finishReason,
        policyVersions: r.policyVersions,
        ...(r.topLogprobs ? { topLogprobs: r.topLogprobs } : {}),
      };
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  async health(): Promise<boolean> {
    return this.exited === null && this.child.connected;
  }

  async updateWeights(update: PolicyUpdate): Promise<void> {
    const id = this.seq++;
    const done = new Promise<void>((resolve, reject) => this.updates.set(id, { resolve, reject }));
    if (!this.send({ t: 'update', id, update })) {
      this.updates.delete(id);
      throw this.gone();
    }
    await done;
  }
}

export class EngineProcesses implements LlmBackend {
  readonly name = 'builtin';
  readonly maxTopLogprobs = MAX_TOP_LOGPROBS;
  private readonly engines: EngineProcess[] = [];
  private manager!: ServerManager;
  /** Rank 0 of the weights group (this process), while every engine is in it. */
  private group: Collective | null = null;
  private members: Collective[] = [];
  private closing = false;
  private readonly logger: Logger;
  /** Versions broadcast, and the last one's time from the first message to the last engine's receipt. */
  private broadcasts = { count: 0, lastMs: 0 };

  private constructor(private readonly o: EngineProcessesOptions) {
    this.logger = o.logger ?? silentLogger;
  }

  /** Starts one engine per device and resolves once every one has loaded its model (and joined the group). */
  static async start(o: EngineProcessesOptions): Promise<EngineProcesses> {
    const e = new EngineProcesses(o);
    try {
      await e.fork();
    } catch (err) {
      await e.close();
      throw err;
    }
    return e;
  }

  /** The engines' addresses ('cuda:G' by GPU index, 'cpu:I'), in backend.devices order. */
  get addresses(): string[] {
    return this.engines.map((p) => p.address);
  }

  get pids(): number[] {
    return this.engines.map((p) => p.child.pid!);
  }

  private async fork(): Promise<void> {
    const o = this.o;
    if (o.devices.length === 0) throw new RlstreamError('CONFIG_INVALID', 'backend.devices lists no device');
    const size = o.devices.length + 1;
    const collective = o.weightsGroup === 'cuda' ? 'nccl' : o.weightsGroup === 'cpu' ? 'reference' : null;
    const ncclId = collective === 'nccl' ? ncclUniqueId() : null;
    if (collective === 'reference') this.members = referenceGroup(size);
    const entry = fileURLToPath(new URL('./engine-process-main.ts', import.meta.url));
    // the engines run the same TypeScript through tsx, however this process was started
    const execArgv = ['--import', import.meta.resolve('tsx')];
    const hellos: Promise<void>[] = [];
    const joining: Promise<void>[] = [];
    const ready: Promise<void>[] = [];
    const failed: Promise<never>[] = [];
    o.devices.forEach((dev, i) => {
      const env: NodeJS.ProcessEnv = { ...process.env };
      if (o.device === 'cuda') env['CUDA_VISIBLE_DEVICES'] = visibleDeviceName(dev, 'backend.devices');
      const child = fork(entry, [], { env, execArgv, serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      const p = new EngineProcess(`${o.device}:${dev}`, child);
      this.engines.push(p);
      const wait = (t: FromEngine['t']) => new Promise<void>((resolve) => child.on('message', (m: FromEngine) => m.t === t && resolve()));
      hellos.push(wait('hello'));
      joining.push(wait('joining'));
      ready.push(wait('ready'));
      failed.push(
        new Promise<never>((_, reject) => {
          child.on('message', (m: FromEngine) => m.t === 'start-failed' && reject(new RlstreamError('BACKEND_UNAVAILABLE', `rollout engine ${p.address} could not start: ${m.error}`)));
          child.on('exit', (code, signal) => reject(new RlstreamError('BACKEND_UNAVAILABLE', `rollout engine ${p.address} exited while starting (${signal ?? `code ${code}`})`)));
        }),
      );
      child.on('message', (m: FromEngine) => this.onMessage(i + 1, p, m));
      // (a failed write is handled where it was sent; the exit event follows a process that is gone)
      child.on('error', (err) => this.logger.warn('rollout engine process error', { engine: p.address, error: err.message }));
      child.on('exit', (code, signal) => this.onExit(p, code, signal));
    });
    const anyFailed = Promise.race(failed);
    anyFailed.catch(() => {});
    const bounded = <T>(p: Promise<T>, what: string) => within(Promise.race([p, anyFailed]), START_TIMEOUT_MS, what);
    await bounded(Promise.all(hellos), 'rollout engine processes starting');
    this.engines.forEach((p, i) =>
      p.send({
        t: 'init',
        configJson: o.source.configJson,
        weightsPath: o.source.weightsPath,
        version: o.source.version,
        device: o.device,
        maxBatch: o.maxBatch,
        maxLen: o.maxLen ?? null,
        gpuMemoryUtilization: o.gpuMemoryUtilization,
        interrupt: o.interrupt,
        server: p.address,
        group: collective === null ? null : { collective, ncclId, rank: i + 1, size, carries: o.adapters === true ? 'adapters' : 'params' },
      }),
    );
    if (collective === 'nccl') {
      // commInit blocks this thread until every rank joined: first every engine must be about to
      await bounded(Promise.all(joining), 'rollout engines joining the weights group (NCCL)');
      this.group = NcclCollective.join(ncclId!, size, 0, 0);
    } else if (collective === 'reference') {
      this.group = this.members[0]!;
    }
    await bounded(Promise.all(ready), 'rollout engines loading their models');
    this.manager = new ServerManager(this.engines, { ...o.manager, initialPolicyVersion: o.source.version, name: 'builtin', logger: this.logger });
    this.logger.info('rollout engines started', { engines: this.addresses, pids: this.pids, weights: collective ?? 'files' });
  }

  private onMessage(rank: number, p: EngineProcess, m: FromEngine): void {
    if (m.t === 'coll') {
      const member = this.members[rank];
      if (!member) return;
      serveCall(member, m.call).then(
        (result) => p.send({ t: 'coll-done', seq: m.seq, result }),
        (err: unknown) => p.send({ t: 'coll-failed', seq: m.seq, failedRank: rank, reason: (err as Error).message }),
      );
    } else if (m.t === 'coll-abort') {
      this.members[rank]?.abort(new Error(m.reason));
    } else {
      p.onMessage(m);
    }
  }

  private onExit(p: EngineProcess, code: number | null, signal: NodeJS.Signals | null): void {
    const why = `exited (${signal !== null ? `signal ${signal}` : `code ${code}`})`;
    p.onExit(why);
    if (this.closing) return;
    this.logger.error('rollout engine process exited', { engine: p.address, pid: p.child.pid, code, signal });
    this.manager?.markDown(p.address);
    this.dropGroup(`rollout engine ${p.address} ${why}`);
  }

  /**
   * Ends the weights group: a broadcast under way fails instead of waiting on a member that will not come (NCCL's
   * abort), and later versions go to the engines as files.
   */
  private dropGroup(why: string): void {
    if (!this.group) return;
    const err = new Error(why);
    this.group.abort(err);
    for (const m of this.members) m.abort(err);
    this.group = null;
    this.logger.warn('the weights group is gone; new versions reach the rollout engines through their files', { why });
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.manager.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    const at = this.manager.routeOf(sessionId);
    this.manager.releaseSession(sessionId);
    this.engines.find((p) => p.address === at)?.send({ t: 'release', sessionId });
  }

  updatePolicy(update: PolicyUpdate): Promise<void> {
    return this.manager.updatePolicy(update);
  }

  currentPolicyVersion(): number {
    return this.manager.currentPolicyVersion();
  }

  /** Seconds the engines have spent generating and loading versions, summed over them (as of their last answers). */
  deviceSeconds(): { generate: number; loadWeights: number } {
    let generate = 0;
    let loadWeights = 0;
    for (const p of this.engines) {
      generate += (p.stats?.computeMs ?? 0) / 1000;
      loadWeights += (p.stats?.loadMs ?? 0) / 1000;
    }
    return { generate, loadWeights };
  }

  /** Versions broadcast so far, and how long the last one took to reach every engine (ms). */
  broadcastStats(): { count: number; lastMs: number } {
    return { ...this.broadcasts };
  }

  /**
   * A trainer in this process offers version `version` (after its step, before the version's PolicyVersion): its
   * parameters, or with adapters those alone, are broadcast to every engine. Each engine queues its receive first
   * and says so; only then is the trainer's send queued behind its kernels, so the trainer's GPU never waits on an
   * engine that does not take part. An engine that has not answered within stageTimeoutMs (stopped, stuck) is
   * killed. It resolves once the send is queued and never fails the step: a broadcast that cannot run ends the
   * group, and the version then reaches the engines through its file.
   */
  async stageWeights(version: number, source: Model): Promise<void> {
    const g = this.group;
    if (!g) return;
    let payload: StagePayload;
    let begin: number;
    try {
      // the trained floats: every parameter (from float 0), or the adapters' block
      const range = source.trainRange();
      begin = range.offset;
      payload = source.lora ? { kind: 'adapters', count: range.numel, layout: source.trainedLayout(), rank: source.lora.rank, alpha: source.lora.alpha } : { kind: 'params', count: range.numel };
    } catch (err) {
      this.dropGroup(`version ${version} cannot be broadcast: ${(err as Error).message}`);
      return;
    }
    const t0 = performance.now();
    const parts = this.engines.map((p) => p.stage(version, payload));
    const answered = this.engines.map(() => false);
    parts.forEach((x, i) => void x.receiving.then(() => (answered[i] = true), () => {}));
    try {
      await within(Promise.all(parts.map((x) => x.receiving)), this.o.stageTimeoutMs ?? STAGE_TIMEOUT_MS, `version ${version}'s broadcast: engines queueing their receive`);
    } catch (err) {
      const late = this.engines.filter((_, i) => !answered[i] && this.engines[i]!.exited === null);
      for (const p of late) p.child.kill('SIGKILL');
      this.dropGroup(`${(err as Error).message}${late.length > 0 ? `; killed ${late.map((p) => p.address).join(', ')}` : ''}`);
      return;
    }
    if (this.group !== g) return;
    try {
      await g.broadcastBlock(source, 'params', begin, payload.count, 0);
    } catch (err) {
      this.dropGroup(`version ${version}'s broadcast failed: ${(err as Error).message}`);
      return;
    }
    Promise.all(parts.map((x) => x.staged)).then(
      () => void (this.broadcasts = { count: this.broadcasts.count + 1, lastMs: performance.now() - t0 }),
      (err: unknown) => this.logger.warn('an engine could not keep a broadcast version; it reads the file', { version, error: (err as Error).message }),
    );
  }

  async close(): Promise<void> {
    this.closing = true;
    await this.manager?.close();
    await Promise.all(
      this.engines.map(async (p) => {
        if (p.exited !== null) return;
        const gone = new Promise<void>((resolve) => p.child.once('exit', () => resolve()));
        p.send({ t: 'close' });
        const timer = setTimeout(() => p.child.kill('SIGKILL'), CLOSE_TIMEOUT_MS);
        await gone;
        clearTimeout(timer);
      }),
    );
    await this.group?.close().catch(() => {});
    this.group = null;
  }
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new RlstreamError('BACKEND_UNAVAILABLE', `${what}: no answer in ${ms / 1000} s`)), ms)));
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}
