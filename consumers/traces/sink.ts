// The trace sink: every event of the log into the trace store (ClickHouse server or chDB), with its own
// consumer group. Offsets are committed only after the rows they produced are inserted; inserts are
// idempotent (ReplacingMergeTree keyed by each fact's identity), so a retry or a replay never double-counts.
// The sink consumes directly rather than through core/processor.ts: it produces nothing, so it needs no
// transaction, and records it cannot decode become dead_letters rows rather than dead-letter events (the
// sink reads the dead-letter topic too, and must not feed itself).
import { deriveId } from '../../core/ids.ts';
import { errorCodeOf } from '../../core/deadletter.ts';
import { describeError } from '../../core/errors.ts';
import type { Consumer, EventLog, LogRecord, TopicPartitionOffset } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import { TRACE_TABLES, type TraceStore } from '../../core/traces/store.ts';
import type { TableCodec } from '../../core/traces/rowbinary.ts';
import { EVENT_NAMES, resolvedSchema } from '../../schemas/index.ts';
import { deadLetterRow, rowsOf, type TraceRow } from './rows.ts';
import { compileTranscoder, FRAME_BYTES, PLANS, type Transcoder } from './transcode.ts';
import { TraceWriter, type WriterOptions } from './writer.ts';

export const SINK_CONSUMER = 'trace-sink';

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

/** The rows of one log record; an undecodable record becomes a dead_letters row naming the sink. */
export async function recordRows(serde: EventSerde, record: LogRecord): Promise<TraceRow[]> {
  try {
    const ev = serde.tryDecodeSync(record.value) ?? (await serde.decode(record.value));
    return rowsOf(ev);
  } catch (err) {
    const id = deriveId('dead-letter', SINK_CONSUMER, record.topic, record.partition, record.offset);
    return [
      {
        table: 'dead_letters',
        row: deadLetterRow(SINK_CONSUMER, record.topic, record.partition, record.offset, errorCodeOf(err), describeError(err), record.key, record.value, id, record.timestamp),
      },
    ];
  }
}

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
  readonly stats: SinkStats = { records: 0, transcoded: 0, rows: 0, flushes: 0, deadLetters: 0, commits: 0 };
  /** By schema id: the transcoder of its records and the codec it was compiled for, or null (general path). */
  private readonly transcoders = new Map<number, { codec: TableCodec; t: Transcoder } | null>();
  private readonly logger: Logger;
  /** The write in flight (with its commit), started by step(); its failure surfaces at the next settle(). */
  private flushing: Promise<void> | null = null;
  /** Whether that write is still running (flushing stays set, settled, until the next settle()). */
  private writing = false;
  /** Next offset of every partition, after the records whose rows were added to the writer. */
  private readonly positions = new Map<string, TopicPartitionOffset>();

  constructor(private readonly options: TraceSinkOptions) {
    this.writer = new TraceWriter(options.store, options);
    this.logger = (options.logger ?? silentLogger).child({ component: 'trace-sink' });
  }

  async start(): Promise<void> {
    if (this.consumer) return;
    this.positions.clear();
    this.consumer = await this.options.log.consumer({ groupId: this.options.groupId ?? 'traces', topics: [...(this.options.topics ?? TRACE_TOPICS)], fromBeginning: true });
    // Codecs before the first rows, so those are encoded as they arrive too (a failure is asked again later).
    // Awaited: a catch-up polls the embedded log without waiting on I/O, so an answer left for later arrived
    // only at the first flush, and that whole batch was kept as row objects (encoded late, aged by the GC).
    await this.writer.prepare(TRACE_TABLES).catch(() => undefined);
  }

  /**
   * One poll: buffer its rows; when a batch is due, start writing it and go on (the next polls are decoded
   * and encoded while the engine writes). Returns the records read.
   */
  async step(): Promise<number> {
    await this.start();
    const records = await this.consumer!.poll({ maxRecords: this.options.pollRecords ?? 5_000, timeoutMs: this.options.pollTimeoutMs ?? 200 });
    // Records with a transcoder go through it a batch per event type; the rest (and those it declines) take the
    // general path. Rows of one table may land in another order than the log's: the tables are keyed by the
    // facts' identities, so order within a batch does not matter.
    const general: LogRecord[] = [];
    const batches = new Map<Transcoder, LogRecord[]>();
    let last: LogRecord | null = null;
    for (const r of records) {
      const t = this.options.transcode === false ? null : this.transcoderOf(r.value);
      if (!t) general.push(r);
      else {
        const b = batches.get(t);
        if (b) b.push(r);
        else batches.set(t, [r]);
      }
      // A partition's position is set when the poll moves on from it (a poll holds runs of each partition's
      // records, and setting it per record cost a key string and a map write each).
      if (last && (last.partition !== r.partition || last.topic !== r.topic)) this.setPosition(last);
      last = r;
    }
    if (last) this.setPosition(last);
    for (const [t, batch] of batches) {
      const status = new Uint8Array(batch.length);
      const values = batch.map((r) => r.value);
      if (!this.writer.addEncoded(t.table, (out) => t.append(values, out, status))) {
        general.push(...batch);
        continue;
      }
      for (let i = 0; i < batch.length; i++) {
        if (status[i] === 1) this.stats.transcoded++;
        else general.push(batch[i]!);
      }
    }
    for (const r of general) {
      for (const { table, row } of await recordRows(this.options.serde, r)) {
        if (table === 'dead_letters' && row['consumer'] === SINK_CONSUMER) this.stats.deadLetters++;
        this.writer.add(table, row);
      }
    }
    this.stats.records += records.length;
    if (this.writer.due() || (records.length === 0 && this.writer.pending > 0)) await this.startFlush();
    // One turn of the event loop per poll: a poll of data already read resolves without one, and the write in
    // flight only moves on to its next INSERT when the engine's answer to the last one is handled.
    if (this.writing) await new Promise<void>((resolve) => setImmediate(resolve));
    return records.length;
  }

  /** The next offset of the record's partition is the one after it. */
  private setPosition(r: LogRecord): void {
    this.positions.set(`${r.topic}\0${r.partition}`, { topic: r.topic, partition: r.partition, offset: r.offset + 1 });
  }

  /**
   * The transcoder of this record's event: only for the current writer schemas of planned events (records of
   * older schemas take the general path, which resolves them), compiled against the table's codec.
   */
  private transcoderOf(value: Buffer): Transcoder | null {
    if (value.length < FRAME_BYTES || value[0] !== 0) return null;
    const id = value.readUInt32BE(1);
    const known = this.transcoders.get(id);
    if (known === null) return null;
    if (known && this.writer.codecOf(known.t.table) === known.codec) return known.t;
    const serde = this.options.serde;
    const name = EVENT_NAMES.find((n) => {
      try {
        return serde.schemaId(n) === id;
      } catch {
        return false; // the serde has no current id for it
      }
    });
    const plan = name ? PLANS[name] : undefined;
    if (!name || !plan) {
      this.transcoders.set(id, null);
      return null;
    }
    const codec = this.writer.codecOf(plan.table);
    if (codec === undefined) return null; // not known yet: asked again with the next record
    const t = codec ? compileTranscoder(resolvedSchema(name), plan, codec.columns) : null;
    this.transcoders.set(id, t && codec ? { codec, t } : null);
    if (!t) this.logger.info('no transcoder for this event: its records take the general path', { event: name, table: plan.table });
    return t;
  }

  /**
   * Start writing the queued rows; the offsets after them are committed once they are written. One write is
   * in flight at a time: the previous one is awaited first, and its failure is thrown here (its rows are
   * queued again, and nothing after them was committed).
   */
  private async startFlush(): Promise<void> {
    await this.settle();
    const offsets = [...this.positions.values()];
    this.writing = true;
    const flushing = this.writer
      .flush()
      .then(async (n) => {
        this.stats.rows += n;
        if (n > 0) this.stats.flushes++;
        await this.consumer?.commit(offsets);
        this.stats.commits++;
      })
      .finally(() => (this.writing = false));
    flushing.catch(() => undefined); // handled: settle() rethrows it
    this.flushing = flushing;
  }

  /** Wait for the write in flight, if any; throws its failure once. */
  private async settle(): Promise<void> {
    const f = this.flushing;
    this.flushing = null;
    await f;
  }

  /** Insert everything buffered, then commit the positions after everything polled. */
  async flushAndCommit(): Promise<void> {
    await this.settle();
    const n = await this.writer.flush();
    this.stats.rows += n;
    if (n > 0) this.stats.flushes++;
    await this.consumer?.commit();
    this.stats.commits++;
  }

  /** Read until a poll comes back empty, then flush and commit (tests, catch-up). */
  async drain(): Promise<void> {
    while ((await this.step()) > 0);
    await this.flushAndCommit();
  }

  /** Run until stop(); transient store failures are retried with backoff (rows stay buffered). */
  run(): Promise<void> {
    this.loop ??= (async () => {
      let backoff = 100;
      while (!this.stopping) {
        try {
          await this.step();
          backoff = 100;
        } catch (err) {
          this.logger.warn('trace sink step failed; retrying', { error: describeError(err), backoffMs: backoff });
          await new Promise((r) => setTimeout(r, backoff));
          backoff = Math.min(backoff * 2, 10_000);
        }
      }
    })();
    return this.loop;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await this.loop;
    if (this.consumer) {
      // The consumer leaves the group even when the last flush fails (nothing is committed then), so another
      // member can take over the partitions and re-read what was not written.
      try {
        await this.flushAndCommit();
      } finally {
        await this.consumer.close();
        this.consumer = null;
      }
    }
  }
}
