// Starts the data-parallel ranks of a trainer: the trainer's own process is rank 0 (it reads the log, shards each
// step's groups and commits); ranks 1..N-1 are child processes (rank-main.ts) forked with an IPC channel, each on one
// GPU (CUDA_VISIBLE_DEVICES names it, so it is device 0 there, as torchrun's workers see theirs) or on the CPU with
// the reference collective. With NCCL, rank 0 makes the unique id and hands it to the others over the channel (what
// torchrun's store does). A rank process that exits fails the group at once: rank 0's pending and next collectives
// reject with RankFailed naming it, so the step under way is abandoned with nothing committed.
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { RlstreamError } from '../../../core/errors.ts';
import type { Logger } from '../../../core/telemetry.ts';
import type { TrainSample } from '../batch.ts';
import type { TrainerOptions } from '../options.ts';
import { RankFailed, type Collective } from '../../../native/collectives/collective.ts';
import { serveCall } from '../../../native/collectives/ipc-collective.ts';
import { visibleDeviceName } from '../../../native/gpus.ts';
import { NcclCollective, ncclUniqueId } from '../../../native/collectives/nccl-collective.ts';
import type { FromRank, ToRank } from './protocol.ts';
import type { TrainerModelSpec } from './rank-model.ts';
import { referenceGroup } from '../../../native/collectives/reference-collective.ts';

/** How long rank 0 waits for a rank process to leave on close before it kills it. */
const CLOSE_TIMEOUT_MS = 10_000;

interface Waiter {
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** The GPU the r-th rank trains on, as this process names it (through its own CUDA_VISIBLE_DEVICES, if set). */
export function rankDevice(rank: number, deviceIds: readonly number[] | null, visible = process.env['CUDA_VISIBLE_DEVICES']): string {
  return visibleDeviceName(deviceIds?.[rank] ?? rank, 'trainer.devices', visible);
}

class RankProcess {
  hello: Waiter | null = null;
  ready: Waiter | null = null;
  stepDone: Waiter | null = null;
  joining: Waiter | null = null;
  exited = false;

  constructor(
    readonly rank: number,
    readonly child: ChildProcess,
  ) {}

  send(m: ToRank): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.exited || !this.child.connected) return reject(new RankFailed(this.rank, new Error('its process is gone')));
      this.child.send(m, (err) => (err ? reject(new RankFailed(this.rank, err)) : resolve()));
    });
  }
}

export interface RankLaunch {
  size: number;
  deviceIds: readonly number[] | null;
  collective: 'nccl' | 'reference';
  spec: TrainerModelSpec;
  options: TrainerOptions;
  logger: Logger;
}

export class RankProcesses {
  private readonly procs: RankProcess[] = [];
  private closing = false;
  private failure: RankFailed | null = null;
  /** Rank 0's member of the group: the trainer's process trains through it. */
  collective!: Collective;
  private members: Collective[] = [];

  private constructor(private readonly launch: RankLaunch) {}

  /** The ranks' process ids (rank r's at index r - 1). */
  get pids(): number[] {
    return this.procs.map((p) => p.child.pid!);
  }

  /**
   * Forks ranks 1..N-1, sends each its init and joins the group as rank 0 (for NCCL, once every rank is about to
   * join). It returns before the other ranks have loaded their models, so that the caller loads rank 0's
   * meanwhile; ready() resolves once they all have. Every wait is bounded by trainer.data_parallel.step_timeout_s.
   */
  static async start(launch: RankLaunch): Promise<RankProcesses> {
    const g = new RankProcesses(launch);
    try {
      await g.fork();
    } catch (err) {
      await g.close();
      throw err;
    }
    return g;
  }

  private async fork(): Promise<void> {
    const { size, collective, spec, options, deviceIds, logger } = this.launch;
    // a rank that never answers at start (stopped, stuck loading) fails the start after the step timeout: the same
    // bound on how long any rank may keep the others waiting
    const startMs = options.dataParallel.stepTimeoutMs;
    const ncclId = collective === 'nccl' ? ncclUniqueId() : null;
    if (collective === 'reference') this.members = referenceGroup(size);
    const entry = fileURLToPath(new URL('./rank-main.ts', import.meta.url));
    // the ranks run the same TypeScript through tsx, however this process was started
    const execArgv = ['--import', import.meta.resolve('tsx')];
    const hellos: Promise<void>[] = [];
    for (let r = 1; r < size; r++) {
      const env: NodeJS.ProcessEnv = { ...process.env, RLSTREAM_RANK: String(r), RLSTREAM_RANKS: String(size) };
      if (options.device === 'cuda') env['CUDA_VISIBLE_DEVICES'] = rankDevice(r, deviceIds);
      const child = fork(entry, [], { env, execArgv, serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      const p = new RankProcess(r, child);
      this.procs.push(p);
      hellos.push(settleLater<void>((w) => (p.hello = w)));
      child.on('message', (m: FromRank) => this.onMessage(p, m));
      child.on('exit', (code, signal) => {
        p.exited = true;
        if (this.closing) return;
        const why = new Error(`its process (pid ${child.pid}) exited (${signal !== null ? `signal ${signal}` : `code ${code}`})`);
        logger.error('data-parallel rank process exited', { rank: r, pid: child.pid, code, signal });
        this.fail(new RankFailed(r, why));
      });
    }
    const started = this.procs.map((p) => settleLater<void>((w) => (p.ready = w)));
    const joined = this.procs.map((p) => settleLater<void>((w) => (p.joining = w)));
    // a process loads its modules before it listens; what it is sent before that would be lost
    await withTimeout(Promise.all(hellos), startMs, 'rank processes starting (trainer.data_parallel.step_timeout_s)');
    for (const p of this.procs) await p.send({ t: 'init', rank: p.rank, size, collective, ncclId, spec, options });
    if (collective === 'nccl') {
      // commInit blocks this thread until every rank joined: first every rank process must be about to
      await withTimeout(Promise.all(joined), startMs, 'rank processes joining NCCL (trainer.data_parallel.step_timeout_s)');
      this.collective = NcclCollective.join(ncclId!, size, 0, 0);
    } else {
      this.collective = this.members[0]!;
    }
    this.logger().info('data-parallel ranks started', { ranks: size, collective, pids: this.pids });
    // the caller loads rank 0's model meanwhile; ready() waits for the others
    this.readyAll = withTimeout(Promise.all(started), startMs, 'rank processes loading their models (trainer.data_parallel.step_timeout_s)').then(() => {});
    this.readyAll.catch(() => {});
  }

  private readyAll: Promise<void> = Promise.resolve();

  /** Resolves once every other rank has loaded its model; rejects naming a rank that could not. */
  ready(): Promise<void> {
    return this.readyAll;
  }

  private logger(): Logger {
    return this.launch.logger;
  }

  private onMessage(p: RankProcess, m: FromRank): void {
    switch (m.t) {
      case 'hello':
        p.hello?.resolve();
        break;
      case 'joining':
        p.joining?.resolve();
        break;
      case 'ready':
        p.ready?.resolve();
        break;
      case 'start-failed':
        p.ready?.reject(new RankFailed(p.rank, new Error(m.error)));
        p.joining?.reject(new RankFailed(p.rank, new Error(m.error)));
        break;
      case 'step-done':
        p.stepDone?.resolve();
        p.stepDone = null;
        break;
      case 'step-failed':
        p.stepDone?.reject(new RankFailed(p.rank, new Error(m.error)));
        p.stepDone = null;
        break;
      case 'coll': {
        const member = this.members[p.rank]!;
        serveCall(member, m.call).then(
          (result) => p.send({ t: 'coll-done', seq: m.seq, result }).catch(() => {}),
          (err: unknown) => {
            const failedRank = err instanceof RankFailed ? err.failedRank : p.rank;
            p.send({ t: 'coll-failed', seq: m.seq, failedRank, reason: err instanceof RankFailed ? (err.reason instanceof Error ? err.reason.message : String(err.reason)) : (err as Error).message }).catch(() => {});
          },
        );
        break;
      }
      case 'coll-abort':
        this.members[p.rank]?.abort(new Error(m.reason));
        break;
    }
  }

  /** A rank failed: every collective of the group, pending or later, rejects naming it. */
  private fail(err: RankFailed): void {
    if (this.failure) return;
    this.failure = err;
    this.collective?.abort(err);
    for (const m of this.members) m.abort(err);
    for (const p of this.procs) {
      p.hello?.reject(err);
      p.ready?.reject(err);
      p.joining?.reject(err);
      p.stepDone?.reject(err);
      p.stepDone = null;
    }
  }

  /**
   * Sends ranks 1..N-1 their shares of a step (`shares[r]`, rank 0's own at index 0 is not sent) and resolves when
   * every one of them finished it (its share trained, its optimizer shard written, the commit seen).
   */
  async dispatch(committed: number, train: boolean, shares: readonly TrainSample[][], checkpointDir: string): Promise<void> {
    if (this.failure) throw this.failure;
    const done = this.procs.map((p) => settleLater<void>((w) => (p.stepDone = w)));
    // A rank that neither finishes nor exits (stopped, or stuck in a collective on a peer that is) would hold every
    // other rank in its collective forever: after the step timeout the ranks that have not finished are killed and
    // the step fails. Which of them is stuck and which waits on it cannot be told apart from here; all are named.
    const ms = this.launch.options.dataParallel.stepTimeoutMs;
    const timer = setTimeout(() => {
      const late = this.procs.filter((p) => p.stepDone !== null);
      if (late.length === 0) return;
      const err = new RankFailed(late[0]!.rank, new Error(`rank(s) ${late.map((p) => p.rank).join(', ')} did not finish the step within ${ms / 1000} s (trainer.data_parallel.step_timeout_s); their processes were killed`));
      this.launch.logger.error('data-parallel step timed out', { ranks: late.map((p) => p.rank), pids: late.map((p) => p.child.pid), timeout_s: ms / 1000 });
      this.fail(err);
      for (const p of late) p.child.kill('SIGKILL');
    }, ms);
    try {
      await Promise.all(this.procs.map((p) => p.send({ t: 'step', committed, train, samples: shares[p.rank] ?? [], checkpointDir })));
      await Promise.all(done);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Ends every rank process (and the group); a process that does not leave in time is killed. */
  async close(): Promise<void> {
    this.closing = true;
    await Promise.all(
      this.procs.map(async (p) => {
        if (p.exited) return;
        const gone = new Promise<void>((resolve) => p.child.once('exit', () => resolve()));
        await p.send({ t: 'close' }).catch(() => {});
        const timer = setTimeout(() => p.child.kill('SIGKILL'), CLOSE_TIMEOUT_MS);
        await gone;
        clearTimeout(timer);
      }),
    );
    await this.collective?.close().catch(() => {});
  }
}

/** A promise settled from outside (by a message or a failure); a rejection nobody awaits yet is not unhandled. */
function settleLater<T>(keep: (w: Waiter) => void): Promise<T> {
  const p = new Promise<T>((resolve, reject) => keep({ resolve: resolve as () => void, reject }));
  p.catch(() => {});
  return p;
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new RlstreamError('INTERNAL', `${what}: no answer in ${ms / 1000} s`)), ms)));
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}
