// The trace sink: every event of the log into the trace store (ClickHouse server or chDB), with its own
// consumer group. Offsets are committed only after the rows they produced are inserted; inserts are
// idempotent (ReplacingMergeTree keyed by each fact's identity), so a retry or a replay never double-counts.
// The sink consumes directly rather than through core/processor.ts: it produces nothing, so it needs no
// transaction, and records it cannot decode become dead_letters rows rather than dead-letter events (the
// sink reads the dead-letter topic too, and must not feed itself).
import { describeError, RlstreamError } from '../../core/errors.ts';
import type { Consumer, EventLog, TopicPartitionOffset } from '../../core/log/types.ts';
import { retry } from '../../core/retry.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { TraceIngest } from './ingest.ts';
import { TraceWriter, type WriterOptions } from './writer.ts';

/** Every topic the sink reads. */
export const TRACE_TOPICS: readonly string[] = [
  TOPICS.rolloutEvents,
  TOPICS.rewarded,
  TOPICS.advantaged,
  TOPICS.trainSteps,
  TOPICS.policyVersions,
  TOPICS.control,
  TOPICS.deadLetter,
];

export { recordRows, SINK_CONSUMER } from './ingest.ts';

const partitionKey = (topic: string, partition: number): string => `${topic}\0${partition}`;

export interface TraceSinkOptions extends WriterOptions {
  log: EventLog;
  store: TraceStore;
  serde: EventSerde;
  /** Consumer group (default 'traces'). */
  groupId?: string;
  topics?: readonly string[];
  /** Records per poll (default 5,000). */
  pollRecords?: number;
  /** Poll wait when idle, ms (default 200). */
  pollTimeoutMs?: number;
  /**
   * Write the high-volume events through native transcoders, Avro bytes straight to RowBinary (default true;
   * false: every record is decoded, mapped by rowsOf and encoded by the table codec, as the general path).
   */
  transcode?: boolean;
  logger?: Logger;
}

export interface SinkStats {
  records: number;
  /** Records written through a transcoder (the others took the general path). */
  transcoded: number;
  rows: number;
  flushes: number;
  deadLetters: number;
  commits: number;
}

export class TraceSink {
  private consumer: Consumer | null = null;
  private readonly writer: TraceWriter;
  private stopping = false;
  private loop: Promise<void> | null = null;
  private readonly counts = { records: 0, rows: 0, flushes: 0, commits: 0 };
  private readonly ingest: TraceIngest;
  private readonly logger: Logger;
  /** Next offset of every partition, after the records whose rows were added to the writer. */
  private readonly positions = new Map<string, TopicPartitionOffset>();
  /** Whether a position moved since the last commit was started. */
  private moved = false;

  constructor(private readonly options: TraceSinkOptions) {
    this.writer = new TraceWriter(options.store, options);
    this.logger = (options.logger ?? silentLogger).child({ component: 'trace-sink' });
    this.ingest = new TraceIngest(options.serde, this.writer, { transcode: options.transcode ?? true, logger: this.logger });
  }

  /** A snapshot of the counters. */
  get stats(): SinkStats {
    return { ...this.counts, ...this.ingest.stats };
  }

  async start(): Promise<void> {
    if (this.consumer) return;
    this.positions.clear();
    this.consumer = await this.options.log.consumer({ groupId: this.options.groupId ?? 'traces', topics: [...(this.options.topics ?? TRACE_TOPICS)], fromBeginning: true });
  }

  /**
   * One poll: buffer its rows; when a batch is due, start writing it and go on (the next polls are decoded
   * and encoded while the engine writes). Returns the records read.
   */
  async step(): Promise<number> {
    await this.start();
    const consumer = this.consumer!;
    const poll = { maxRecords: this.options.pollRecords ?? 5_000, timeoutMs: this.options.pollTimeoutMs ?? 200 };
    let count = 0;
    if (consumer.pollChunks) {
      // The embedded log: records read in place, a LogRecord only for those the general path takes.
      const chunks = await consumer.pollChunks(poll);
      await this.ingest.addChunks(chunks);
      for (const c of chunks) {
        this.setPosition(c.topic, c.partition, c.firstOffset + c.count);
        count += c.count;
      }
      consumer.releaseChunks?.(chunks); // their rows are encoded, or copied out for the general path
    } else {
      const records = await consumer.poll(poll);
      await this.ingest.add(records);
      // Everything polled is in the writer now, so the consumer's positions are the ones to commit. They are
      // taken from it, not from the last record's offset + 1: a partition written in transactions ends with a
      // commit marker, which the consumer's position passes and last + 1 does not (the group's lag would stay
      // at 1 for good).
      for (const a of consumer.assignment()) this.setPosition(a.topic, a.partition, a.offset);
      count = records.length;
    }
    this.counts.records += count;
    // An idle poll also commits positions that moved without rows (past markers), so the lag reaches 0.
    if (this.writer.dueBehind() || (count === 0 && (this.writer.pending > 0 || this.moved))) await this.startFlush();
    // One turn of the event loop per poll: a poll of data already read resolves without one, and the write in
    // flight only moves on to its next INSERT when the engine's answer to the last one is handled.
    if (this.writer.writingBehind) await new Promise<void>((resolve) => setImmediate(resolve));
    return count;
  }

  /** The offset to commit for a partition once what was polled is written: the next one to read. */
  private setPosition(topic: string, partition: number, offset: number): void {
    const k = partitionKey(topic, partition);
    if (this.positions.get(k)?.offset === offset) return;
    this.positions.set(k, { topic, partition, offset });
    this.moved = true;
  }

  /**
   * Start writing the queued rows; the offsets after them are committed once they are written. One write is
   * in flight at a time: the previous one is awaited first, and its failure is thrown here (its rows are
   * queued again, and nothing after them was committed).
   */
  private async startFlush(): Promise<void> {
    await this.writer.settle();
    const offsets = [...this.positions.values()];
    this.moved = false;
    await this.writer.flushBehind(async (n) => {
      this.counts.rows += n;
      if (n > 0) this.counts.flushes++;
      await this.consumer?.commit(offsets);
      this.counts.commits++;
    });
  }

  /** Insert everything buffered, then commit the positions after everything polled. */
  async flushAndCommit(): Promise<void> {
    await this.writer.settle();
    const n = await this.writer.flush();
    this.counts.rows += n;
    if (n > 0) this.counts.flushes++;
    await this.consumer?.commit();
    this.counts.commits++;
  }

  /**
   * Read what the log held when the drain began, then flush and commit (tests, catch-up): until this member's
   * position on every partition assigned to it reaches the end listed at the start. An empty poll is not the
   * end: a Kafka fetch can stall for seconds in the middle of a topic, and a drain that took the first empty poll
   * as the end stopped short of it. Positions that do not move for
   * `stallMs` (default 60 s) fail the drain with a retriable LOG_UNAVAILABLE naming them, rather than hang.
   */
  async drain(options: { stallMs?: number } = {}): Promise<void> {
    const stallMs = options.stallMs ?? 60_000;
    await this.start();
    const ends = new Map<string, number>();
    for (const topic of this.options.topics ?? TRACE_TOPICS) {
      for (const p of await this.options.log.offsets(topic)) ends.set(partitionKey(topic, p.partition), p.high);
    }
    let seen = '';
    let movedAt = Date.now();
    while (!this.reached(ends)) {
      await this.step();
      // topic/partition at position of end, for this member's partitions
      const now = (this.consumer?.assignment() ?? []).map((a) => `${a.topic}/${a.partition} at ${a.offset} of ${ends.get(partitionKey(a.topic, a.partition)) ?? 0}`).join(', ');
      if (now !== seen) [seen, movedAt] = [now, Date.now()];
      else if (Date.now() - movedAt > stallMs) {
        throw new RlstreamError('LOG_UNAVAILABLE', `trace sink drain: no position moved for ${stallMs / 1000} s short of the ends listed at its start (${now})`, { retriable: true });
      }
    }
    await this.flushAndCommit();
  }

  /**
   * Whether this member's assigned partitions are read to `ends` (a Kafka member's assignment is published once
   * its group join has resolved the start offsets: none yet is not done). Positions pass the transaction markers a
   * Kafka partition ends with, and Kafka lists its last stable offset as the end, so the comparison is exact.
   */
  private reached(ends: ReadonlyMap<string, number>): boolean {
    const assigned = this.consumer?.assignment() ?? [];
    if (assigned.length === 0) return [...ends.values()].every((end) => end === 0);
    return assigned.every((a) => a.offset >= (ends.get(partitionKey(a.topic, a.partition)) ?? 0));
  }

  /**
   * Run until stop(); transient store failures are retried with backoff (rows stay buffered). Resolves after
   * the final flush and commit (rejects when they fail), so a caller that closes the store and the log once
   * run() has settled closes nothing the last commit still needs.
   */
  run(): Promise<void> {
    this.loop ??= (async () => {
      while (!this.stopping) {
        // Any failure of a step is tried again while the sink runs (the rows stay buffered; a store or log may
        // come back), with a backoff that starts over after each step that succeeds.
        await retry(() => this.step(), {
          retriable: () => !this.stopping,
          maxDelayMs: 10_000,
          onRetry: (err, { delayMs }) => this.logger.warn('trace sink step failed; retrying', { error: describeError(err), backoffMs: delayMs }),
        }).catch((err: unknown) => this.logger.warn('trace sink step failed while stopping', { error: describeError(err) }));
      }
      await this.finish();
    })();
    return this.loop;
  }

  /** Stop reading; resolves once what was read is written and committed and the consumer has left. */
  async stop(): Promise<void> {
    this.stopping = true;
    if (this.loop) await this.loop;
    else await this.finish();
  }

  private async finish(): Promise<void> {
    const consumer = this.consumer;
    if (!consumer) return;
    // The consumer leaves the group even when the last flush fails (nothing is committed then), so another
    // member can take over the partitions and re-read what was not written.
    try {
      await this.flushAndCommit();
      this.logger.info('trace sink stopped', { ...this.stats });
    } finally {
      await consumer.close();
      this.consumer = null;
    }
  }
}
