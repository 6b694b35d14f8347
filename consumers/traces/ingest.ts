// Log records → rows in a TraceWriter: the one step shared by the live sink and `replay --into traces`.
// Records of planned events go through their native transcoder (Avro bytes straight to RowBinary, see
// transcode.ts), a batch per event type (per chunk and event type for chunks of the embedded log, read in
// place); the rest, and records a transcoder declines, take the general path:
// decode, rowsOf, the table codec. A record no schema decodes becomes a dead_letters row naming the sink.
// Rows of one table may land in another order than the log's: the tables are keyed by the facts' identities
// (ReplacingMergeTree), so order within a batch does not matter.
import { deriveId } from '../../core/ids.ts';
import { errorCodeOf } from '../../core/deadletter.ts';
import { describeError } from '../../core/errors.ts';
import type { LogRecord, RecordChunk } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import type { RowBinaryBuffer, TableCodec } from '../../core/traces/rowbinary.ts';
import { TRACE_TABLES } from '../../core/traces/store.ts';
import { resolvedSchema, type EventName } from '../../schemas/index.ts';
import { deadLetterRow, rowsOf, type TraceRow } from './rows.ts';
import { compileTranscoder, PLANS, type Transcoder } from './transcode.ts';
import type { TraceWriter } from './writer.ts';

export const SINK_CONSUMER = 'trace-sink';

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

export interface IngestOptions {
  /**
   * Write the planned events through native transcoders (default true; false: every record is decoded, mapped
   * by rowsOf and encoded by the table codec, the general path).
   */
  transcode?: boolean;
  logger?: Logger;
}

export interface IngestStats {
  /** Records written through a transcoder (the others took the general path). */
  transcoded: number;
  /** Records no schema decodes (each became a dead_letters row). */
  deadLetters: number;
}

/** A transcoder's records in one chunk, in typed arrays reused from chunk to chunk. */
class Spans {
  count = 0;
  starts = new Float64Array(1024);
  lengths = new Int32Array(1024);
  index = new Int32Array(1024);

  add(start: number, length: number, index: number): void {
    if (this.count === this.starts.length) {
      const grow = <T extends Float64Array | Int32Array>(a: T, b: T): T => (b.set(a), b);
      this.starts = grow(this.starts, new Float64Array(2 * this.count));
      this.lengths = grow(this.lengths, new Int32Array(2 * this.count));
      this.index = grow(this.index, new Int32Array(2 * this.count));
    }
    this.starts[this.count] = start;
    this.lengths[this.count] = length;
    this.index[this.count++] = index;
  }
}

export class TraceIngest {
  readonly stats: IngestStats = { transcoded: 0, deadLetters: 0 };
  /** By event: its transcoder (null: the general path) and the table codec it was compiled against. */
  private readonly transcoders = new Map<EventName, { codec: TableCodec | null; t: Transcoder | null }>();
  private readonly logger: Logger;
  private prepared = false;
  private readonly spans = new Map<Transcoder, Spans>();

  constructor(
    private readonly serde: EventSerde,
    private readonly writer: TraceWriter,
    private readonly options: IngestOptions = {},
  ) {
    this.logger = options.logger ?? silentLogger;
  }

  /**
   * The codecs before the first rows, so those are transcoded and encoded as they arrive too (a failure is asked
   * again later). Awaited: a catch-up polls the embedded log without waiting on I/O, so an answer left for later
   * arrived only at the first flush, and that whole batch was kept as row objects.
   */
  private async prepare(): Promise<void> {
    if (this.prepared) return;
    await this.writer.prepare(TRACE_TABLES).catch(() => undefined);
    this.prepared = true;
  }

  /**
   * Add the rows of the records in these chunks (EventLog's pollChunks). Records with a transcoder are read in
   * place, a native call per chunk and event; only the others become LogRecords, for the general path, with
   * their bytes copied out: once this resolves nothing refers to the chunks, and the caller may release them.
   */
  async addChunks(chunks: readonly RecordChunk[]): Promise<void> {
    await this.prepare();
    const general: LogRecord[] = [];
    for (const chunk of chunks) {
      const { buf } = chunk;
      const view = new DataView(buf.buffer, buf.byteOffset, buf.length);
      const record = (i: number) => chunk.record(i);
      for (const s of this.spans.values()) s.count = 0;
      for (let i = 0; i < chunk.count; i++) {
        const at = chunk.valueStart(i);
        const length = chunk.valueLength(i);
        const t = this.transcoderOf(this.serde.currentEventAt(view, at, length));
        if (t) this.spansOf(t).add(buf.byteOffset + at, length, i);
        else general.push(record(i));
      }
      const base = new Uint8Array(buf.buffer);
      for (const [t, s] of this.spans) {
        if (s.count > 0) this.write(t, s.count, (out, status) => t.appendSpans(base, s.starts, s.lengths, s.count, out, status), (k) => record(s.index[k]!), general);
      }
    }
    await this.addGeneral(general);
  }

  /** Add the rows of these records to the writer. */
  async add(records: readonly LogRecord[]): Promise<void> {
    await this.prepare();
    const general: LogRecord[] = [];
    const batches = new Map<Transcoder, LogRecord[]>();
    for (const r of records) {
      const t = this.transcoderOf(this.serde.currentEventOf(r.value));
      if (!t) general.push(r);
      else {
        const b = batches.get(t);
        if (b) b.push(r);
        else batches.set(t, [r]);
      }
    }
    for (const [t, batch] of batches) {
      const values = batch.map((r) => r.value);
      this.write(t, batch.length, (out, status) => t.append(values, out, status), (k) => batch[k]!, general);
    }
    await this.addGeneral(general);
  }

  /**
   * `count` records through their transcoder into its table; those it declines (or all, while the table's codec
   * is not known) go to `general`, as recordAt gives them.
   */
  private write(t: Transcoder, count: number, append: (out: RowBinaryBuffer, status: Uint8Array) => number, recordAt: (k: number) => LogRecord, general: LogRecord[]): void {
    const status = new Uint8Array(count);
    const written = this.writer.addEncoded(t.table, (out) => append(out, status));
    for (let k = 0; k < count; k++) {
      if (written && status[k] === 1) this.stats.transcoded++;
      else general.push(recordAt(k));
    }
  }

  /** The general path: decode, rowsOf, the table's codec (or a dead_letters row). */
  private async addGeneral(records: readonly LogRecord[]): Promise<void> {
    for (const r of records) {
      for (const { table, row } of await recordRows(this.serde, r)) {
        if (table === 'dead_letters' && row['consumer'] === SINK_CONSUMER) this.stats.deadLetters++;
        this.writer.add(table, row);
      }
    }
  }

  /** The transcoder's Spans (emptied at the start of each chunk). */
  private spansOf(t: Transcoder): Spans {
    let s = this.spans.get(t);
    if (!s) this.spans.set(t, (s = new Spans()));
    return s;
  }

  /**
   * The transcoder of this record's event (none with `transcode: false`): only for the current writer schemas of planned events (records of
   * older schemas take the general path, which resolves them), compiled against the table's codec.
   */
  private transcoderOf(name: EventName | undefined): Transcoder | null {
    if (this.options.transcode === false) return null;
    const plan = name ? PLANS[name] : undefined;
    if (!name || !plan) return null;
    const known = this.transcoders.get(name);
    const codec = this.writer.codecOf(plan.table);
    if (known !== undefined && known.codec === codec) return known.t;
    if (codec === undefined) return null; // not known yet: asked again with the next record
    const t = codec ? compileTranscoder(resolvedSchema(name), plan, codec.columns) : null;
    this.transcoders.set(name, { codec, t });
    if (!t) this.logger.info('no transcoder for this event: its records take the general path', { event: name, table: plan.table });
    return t;
  }
}
