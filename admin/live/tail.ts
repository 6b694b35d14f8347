// Follows the run-level topics (train steps and evaluations, policy versions, control) and keeps the recent history of each
// run in memory: the data behind the train-step and policy-version routes and the dashboard's live charts.
// It reads with its own throw-away consumer group and never commits, so it moves no role's offsets.
import { newId } from '../../core/ids.ts';
import type { Consumer, EventLog } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { describeError } from '../../core/errors.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { Control, Evaluation, PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import type { RunStatus } from '../context.ts';

export interface RunHistory {
  runId: string;
  steps: TrainStep[];
  /** Every Evaluation event of the run, in log order: each of one policy version on a named problem set. */
  evaluations: Evaluation[];
  versions: PolicyVersion[];
  controls: Control[];
  status: RunStatus;
  stalenessBound: number | null;
  firstSeenMs: number;
  lastEventMs: number;
}

export interface LiveTailOptions {
  /** Most recent steps (and versions, controls) kept per run; older ones are dropped. */
  maxPerRun?: number;
  pollTimeoutMs?: number;
}

const TOPICS_FOLLOWED = [TOPICS.trainSteps, TOPICS.policyVersions, TOPICS.control];

function pushBounded<T>(list: T[], item: T, max: number): void {
  list.push(item);
  if (list.length > max) list.splice(0, list.length - max);
}

export class LiveTail {
  private readonly runs = new Map<string, RunHistory>();
  private consumer: Consumer | null = null;
  private loop: Promise<void> | null = null;
  private stopped = false;
  private readonly maxPerRun: number;
  private readonly pollTimeoutMs: number;
  private waiters: (() => void)[] = [];
  /** Records read so far (tests wait on it). */
  recordsRead = 0;

  constructor(
    private readonly log: EventLog,
    private readonly serde: EventSerde,
    private readonly logger: Logger,
    options: LiveTailOptions = {},
  ) {
    this.maxPerRun = options.maxPerRun ?? 5000;
    this.pollTimeoutMs = options.pollTimeoutMs ?? 250;
  }

  async start(): Promise<void> {
    if (this.loop) return;
    // The topics may not exist yet when the admin server starts before the run: create them idempotently
    // with the count they already have, or one partition (run-level topics are low-volume).
    const existing = new Map((await this.log.listTopics()).map((t) => [t.name, t.partitions]));
    for (const name of TOPICS_FOLLOWED) if (!existing.has(name)) await this.log.createTopic({ name, partitions: 1 });
    this.consumer = await this.log.consumer({ groupId: `rlstream-admin-tail-${newId()}`, topics: TOPICS_FOLLOWED, fromBeginning: true });
    this.loop = this.run();
  }

  private async run(): Promise<void> {
    while (!this.stopped && this.consumer) {
      try {
        const records = await this.consumer.poll({ maxRecords: 500, timeoutMs: this.pollTimeoutMs });
        for (const r of records) {
          try {
            this.apply(await this.serde.decode(r.value));
          } catch (err) {
            this.logger.warn('admin tail skipped an undecodable record', { topic: r.topic, partition: r.partition, offset: r.offset, error: describeError(err) });
          }
          this.recordsRead++;
        }
        if (records.length > 0) this.wake();
      } catch (err) {
        if (this.stopped) break;
        this.logger.warn('admin tail poll failed; retrying', { error: describeError(err) });
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Resolves at the next batch of records (or after timeoutMs). */
  waitForRecords(timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, timeoutMs);
      this.waiters.push(() => {
        clearTimeout(t);
        resolve();
      });
    });
  }

  private history(runId: string, timeMs: number): RunHistory {
    let h = this.runs.get(runId);
    if (!h) {
      h = { runId, steps: [], evaluations: [], versions: [], controls: [], status: 'running', stalenessBound: null, firstSeenMs: timeMs, lastEventMs: timeMs };
      this.runs.set(runId, h);
    }
    h.lastEventMs = Math.max(h.lastEventMs, timeMs);
    return h;
  }

  private apply(event: Awaited<ReturnType<EventSerde['decode']>>): void {
    switch (event.name) {
      case 'TrainStep':
        pushBounded(this.history(event.value.run_id, event.value.time_ms).steps, event.value, this.maxPerRun);
        break;
      case 'Evaluation':
        pushBounded(this.history(event.value.run_id, event.value.time_ms).evaluations, event.value, this.maxPerRun);
        break;
      case 'PolicyVersion':
        pushBounded(this.history(event.value.run_id, event.value.time_ms).versions, event.value, this.maxPerRun);
        break;
      case 'Control': {
        const h = this.history(event.value.run_id, event.value.time_ms);
        pushBounded(h.controls, event.value, this.maxPerRun);
        if (event.value.command === 'pause') h.status = 'paused';
        else if (event.value.command === 'resume') h.status = 'running';
        else if (event.value.command === 'stop') h.status = 'stopping';
        else if (event.value.command === 'set_staleness' && event.value.staleness_bound !== null) h.stalenessBound = event.value.staleness_bound;
        break;
      }
      default:
        break;
    }
  }

  get(runId: string): RunHistory | undefined {
    return this.runs.get(runId);
  }

  list(): RunHistory[] {
    return [...this.runs.values()];
  }

  async close(): Promise<void> {
    this.stopped = true;
    await this.loop?.catch(() => {});
    await this.consumer?.close();
    this.consumer = null;
    this.wake();
  }
}
