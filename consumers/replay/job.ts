// A replay as a job: start it, watch its progress, cancel it. The CLI draws a progress bar from progress();
// the admin API starts jobs and polls them. A job reads a resolved range of the source log (see range.ts),
// decodes each record once for targets that need events (not the traces rebuild or log copies, which read the
// bytes), and hands batches to one target (targets.ts).
import { newId } from '../../core/ids.ts';
import { describeError } from '../../core/errors.ts';
import type { EventLog, LogRecord } from '../../core/log/types.ts';
import type { DecodedEvent, EventSerde } from '../../core/serde/events.ts';
import { resolveRanges, type PartitionRange, type Position } from './range.ts';
import { readRange } from './reader.ts';
import type { ReplayTarget } from './targets.ts';

export interface ReplayOptions {
  log: EventLog;
  /** Decodes the source log's records (its registry). */
  serde: EventSerde;
  target: ReplayTarget;
  /** Topics to read; default the event topics: every topic of the log but the internal ones (see eventTopics). */
  topics?: readonly string[];
  from?: Position;
  to?: Position;
}

export interface ReplayProgress {
  id: string;
  state: 'resolving' | 'running' | 'done' | 'cancelled' | 'failed';
  target: string;
  /** Records in the range (known once resolved). */
  total: number;
  read: number;
  /** Rows, events or lines the target wrote. */
  written: number;
  undecodable: number;
  startedAt: number;
  elapsedMs: number;
  error: string | null;
}

/**
 * The topics that hold events: internal topics start with `_` (the schema registry's `_schemas`, the stream
 * processors' `_state.<id>` checkpoints, which are JSON, Kafka's `__consumer_offsets`) and are no replay's
 * business; reading them only counted their records as undecodable.
 */
export function eventTopics(names: readonly string[]): string[] {
  return names.filter((n) => !n.startsWith('_')).sort();
}

export class ReplayJob {
  readonly id = newId();
  private cancelRequested = false;
  private readonly p: ReplayProgress;
  ranges: PartitionRange[] = [];
  /** Resolves when the job ends (done, cancelled or failed); never rejects. */
  readonly done: Promise<ReplayProgress>;

  private constructor(private readonly options: ReplayOptions) {
    this.p = { id: this.id, state: 'resolving', target: options.target.describe, total: 0, read: 0, written: 0, undecodable: 0, startedAt: Date.now(), elapsedMs: 0, error: null };
    this.done = this.run();
  }

  /** Start a replay; it runs in the background of this process. */
  static start(options: ReplayOptions): ReplayJob {
    return new ReplayJob(options);
  }

  progress(): ReplayProgress {
    const t = this.options.target;
    return { ...this.p, written: t.written, undecodable: this.p.undecodable + (t.undecodable ?? 0), elapsedMs: Date.now() - this.p.startedAt };
  }

  /** Stop after the batch in hand; what was written stays written (targets are idempotent). */
  cancel(): void {
    this.cancelRequested = true;
  }

  private async run(): Promise<ReplayProgress> {
    const o = this.options;
    try {
      const topics = o.topics ?? eventTopics((await o.log.listTopics()).map((t) => t.name));
      this.ranges = await resolveRanges(o.log, topics, o.from, o.to);
      this.p.total = this.ranges.reduce((a, r) => a + (r.end - r.start), 0);
      this.p.state = 'running';
      await readRange(
        o.log,
        this.ranges,
        `replay-${this.id}`,
        async (records: LogRecord[]) => {
          const batch: { record: LogRecord; event: DecodedEvent | null }[] = [];
          for (const record of records) {
            let event: DecodedEvent | null = null;
            if (o.target.needsEvents !== false) {
              try {
                event = o.serde.tryDecodeSync(record.value) ?? (await o.serde.decode(record.value));
              } catch {
                this.p.undecodable++;
              }
            }
            batch.push({ record, event });
          }
          await o.target.accept(batch);
          this.p.read += records.length;
        },
        { cancelled: () => this.cancelRequested },
        o.target.acceptChunks && o.target.needsEvents === false
          ? async (chunks) => {
              await o.target.acceptChunks!(chunks);
              for (const c of chunks) this.p.read += c.count;
            }
          : undefined,
      );
      // A cancelled replay completes what it wrote, except in a target that writes its output whole at the end
      // (the SFT export): a part of it would pass for all of it.
      if (this.cancelRequested && o.target.abort) await o.target.abort();
      else await o.target.finish();
      this.p.state = this.cancelRequested ? 'cancelled' : 'done';
    } catch (err) {
      this.p.state = 'failed';
      this.p.error = describeError(err);
      // A target that can tell a failed replay from a finished one writes nothing then (the SFT export's file).
      await (o.target.abort ? o.target.abort() : o.target.finish()).catch(() => undefined);
    }
    this.p.elapsedMs = Date.now() - this.p.startedAt;
    return this.progress();
  }
}
