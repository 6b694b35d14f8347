// Replay jobs for the admin API on consumers/replay's ReplayJob: the API's spec (target, run, time range) becomes
// a job over the process's log; progress is read from the job as it runs. Targets offered here are the ones that
// need nothing but the log and the trace store: `traces` (rebuild the trace store from the log).
import { RlstreamError } from '../core/errors.ts';
import type { EventLog } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import type { TraceStore } from '../core/traces/store.ts';
import { ReplayJob, type ReplayProgress } from '../consumers/replay/job.ts';
import { TracesTarget, type ReplayTarget } from '../consumers/replay/targets.ts';
import type { ReplayJobInfo, ReplayManager, ReplaySpec, ReplayState } from './context.ts';

const STATES: Record<ReplayProgress['state'], ReplayState> = { resolving: 'pending', running: 'running', done: 'completed', cancelled: 'cancelled', failed: 'failed' };

export interface LogReplayManagerOptions {
  log: EventLog;
  serde: EventSerde;
  traces: TraceStore | null;
}

export class LogReplayManager implements ReplayManager {
  private readonly jobs = new Map<string, { job: ReplayJob; spec: ReplaySpec; finishedMs: number | null }>();

  constructor(private readonly o: LogReplayManagerOptions) {}

  private target(spec: ReplaySpec): ReplayTarget {
    if (spec.target === 'traces') {
      if (!this.o.traces) throw new RlstreamError('INPUT_INVALID', 'replay target traces needs a trace store in this process');
      return new TracesTarget(this.o.traces, this.o.serde);
    }
    throw new RlstreamError('INPUT_INVALID', `unknown replay target ${spec.target} (offered here: traces)`);
  }

  async start(spec: ReplaySpec): Promise<ReplayJobInfo> {
    const job = ReplayJob.start({
      log: this.o.log,
      serde: this.o.serde,
      target: this.target(spec),
      ...(spec.fromMs !== null ? { from: { kind: 'time' as const, ms: spec.fromMs } } : {}),
      ...(spec.toMs !== null ? { to: { kind: 'time' as const, ms: spec.toMs } } : {}),
    });
    const entry = { job, spec, finishedMs: null as number | null };
    this.jobs.set(job.id, entry);
    void job.done.then(() => {
      entry.finishedMs = Date.now();
    });
    return this.info(job.id)!;
  }

  private info(id: string): ReplayJobInfo | undefined {
    const e = this.jobs.get(id);
    if (!e) return undefined;
    const p = e.job.progress();
    return { id, spec: e.spec, state: STATES[p.state], startedMs: p.startedAt, finishedMs: e.finishedMs, processed: p.read, total: p.state === 'resolving' ? null : p.total, error: p.error };
  }

  list(): ReplayJobInfo[] {
    return [...this.jobs.keys()].map((id) => this.info(id)!);
  }

  get(id: string): ReplayJobInfo | undefined {
    return this.info(id);
  }

  async cancel(id: string): Promise<ReplayJobInfo | undefined> {
    const e = this.jobs.get(id);
    if (!e) return undefined;
    e.job.cancel();
    await e.job.done;
    return this.info(id);
  }
}
