// Batched inserts into a trace store: rows are buffered per table and written when the batch is large enough
// (rows or encoded bytes) or old enough. The sink commits log offsets only after the flush holding their rows
// resolves, so a crash between the two re-delivers rows that the ReplacingMergeTree tables then collapse.
//
// Rows are encoded (RowBinary, the store's codec for the table) as they are added rather than at flush: the
// row's values are still in cache, the row objects die young instead of piling up for the garbage collector,
// and a batch costs its encoded bytes in memory. Rows that arrive before the table's codec is known, tables
// without a codec, and rows whose values fail to encode are kept as objects and go through insert(), which
// reports a bad value with the column named (the rows then stay buffered, as with any failed flush).
//
// A flush takes what is queued at its start; rows added while it is in flight queue for the next one (into a
// second buffer per table), so a caller may keep adding while the engine writes: flush() need not be awaited
// at once. One flush runs at a time; a failed flush puts its rows back in front of the queue.
import type { Row, TraceStore, TraceTable } from '../../core/traces/store.ts';
import { RowBinaryBuffer, type TableCodec } from '../../core/traces/rowbinary.ts';

/**
 * A table's buffers start at a batch's bytes (maxBytes), up to this. Pages are touched only as rows arrive, so
 * a large buffer costs address space, not memory, while a small one doubles again and again through a large
 * drain, each time copying what it holds on the main thread.
 */
const FIRST_BUFFER_BYTES = 64 << 20;

export interface WriterOptions {
  /**
   * Flush when this many rows are queued across tables (default: the store's preferredBatch, else 100,000: each
   * flush makes one part per table, and the engine merges parts again later, so during catch-up larger batches
   * cost less; maxBytes bounds them).
   */
  maxRows?: number;
  /** Flush when the encoded rows queued across tables reach this many bytes (default: the store's, else 64 MiB). */
  maxBytes?: number;
  /** Flush when the first queued row is this old, ms (default 1,000). */
  maxDelayMs?: number;
  /**
   * While a write is in flight, dueBehind() lets a due batch fill on up to this many times maxRows and maxBytes
   * (default 2): when the engine is the slower side, its parts grow and it merges less; when it keeps up,
   * batches stay at their size.
   */
  growWhileBusy?: number;
}

export interface WriterStats {
  rows: number;
  flushes: number;
  byTable: Partial<Record<TraceTable, number>>;
}

interface TableBatch {
  /** Queued rows kept as objects (see the header), inserted before the encoded ones. */
  rows: Row[];
  /** Queued rows encoded with `codec`. */
  encoded: RowBinaryBuffer | null;
  /** A written buffer kept for the next batch (buffers grow to a batch's size; reusing one skips that). */
  spare: RowBinaryBuffer | null;
  /**
   * Size of the largest batch of this table written so far: a new buffer (the first batch's is still in flight
   * when the second starts) starts at least that big instead of doubling its way there, copying itself at each
   * step.
   */
  largest: number;
  codec: TableCodec | null;
}

/** What one flush writes of one table. */
interface Part {
  table: TraceTable;
  batch: TableBatch;
  rows: Row[];
  encoded: RowBinaryBuffer | null;
  codec: TableCodec | null;
}

export class TraceWriter {
  private readonly batches = new Map<TraceTable, TableBatch>();
  /** Each table's codec once the store answered (null: the table has none); absent while not asked or asked. */
  private readonly codecs = new Map<TraceTable, TableCodec | null>();
  private readonly asked = new Set<TraceTable>();
  /** Rows queued for the next flush. */
  private queued = 0;
  /** Encoded bytes queued for the next flush. */
  private queuedBytes = 0;
  /** Rows taken by the flush in flight. */
  private writing = 0;
  private firstAt = 0;
  private inFlight: Promise<unknown> = Promise.resolve();
  /** The write flushBehind() started last, until settle() takes it. */
  private behind: Promise<void> | null = null;
  private behindRunning = false;
  /** Flushes called and not yet settled. */
  private started = 0;
  readonly maxRows: number;
  readonly maxBytes: number;
  readonly maxDelayMs: number;
  readonly growWhileBusy: number;
  readonly stats: WriterStats = { rows: 0, flushes: 0, byTable: {} };

  constructor(
    private readonly store: TraceStore,
    options: WriterOptions = {},
  ) {
    this.maxRows = options.maxRows ?? store.preferredBatch?.maxRows ?? 100_000;
    this.maxBytes = options.maxBytes ?? store.preferredBatch?.maxBytes ?? 64 << 20;
    this.maxDelayMs = options.maxDelayMs ?? 1_000;
    this.growWhileBusy = options.growWhileBusy ?? 2;
  }

  /** Rows added and not yet written (queued or in a flush). */
  get pending(): number {
    return this.queued + this.writing;
  }

  /** Encoded bytes queued across tables. */
  get pendingBytes(): number {
    return this.queuedBytes;
  }

  add(table: TraceTable, row: Row): void {
    const b = this.queue(table);
    this.counted(1);
    const codec = this.codecs.get(table);
    if (codec) {
      try {
        const out = this.encodedOf(b);
        const before = out.pos;
        codec.append(out, row);
        this.queuedBytes += out.pos - before;
        b.codec = codec;
        return;
      } catch {
        // insert() reports it, with the column named
      }
    } else if (codec === undefined) this.askCodec(table);
    b.rows.push(row);
  }

  /**
   * Add rows already in the table's RowBinary: `write` appends them to the table's buffer (the codec's columns,
   * in order) and returns how many it wrote. Returns false, calling nothing, while the table's codec is not
   * known (or it has none): the caller then adds its rows through add().
   */
  addEncoded(table: TraceTable, write: (out: RowBinaryBuffer) => number): boolean {
    const codec = this.codecs.get(table);
    if (!codec) {
      if (codec === undefined) this.askCodec(table);
      return false;
    }
    const b = this.queue(table);
    const out = this.encodedOf(b);
    const before = out.pos;
    const rows = write(out);
    this.queuedBytes += out.pos - before;
    b.codec = codec;
    this.counted(rows);
    return true;
  }

  /** The table's codec once the store answered: null when it has none, undefined while not known yet. */
  codecOf(table: TraceTable): TableCodec | null | undefined {
    return this.codecs.get(table);
  }

  private queue(table: TraceTable): TableBatch {
    let b = this.batches.get(table);
    if (!b) this.batches.set(table, (b = { rows: [], encoded: null, spare: null, codec: null, largest: 0 }));
    return b;
  }

  private counted(rows: number): void {
    if (rows === 0) return;
    if (this.queued === 0) this.firstAt = Date.now();
    this.queued += rows;
  }

  /** The table's buffer of encoded rows for the next flush. */
  private encodedOf(b: TableBatch): RowBinaryBuffer {
    if (!b.encoded) {
      // An eighth over: a batch passes maxBytes by what was added before due() was asked (a sink's poll).
      const size = Math.max(b.largest, Math.min(this.maxBytes, FIRST_BUFFER_BYTES));
      b.encoded = b.spare ?? new RowBinaryBuffer(size + (size >> 3));
      b.spare = null;
    }
    return b.encoded;
  }

  /**
   * Fetch the codecs of these tables now, so that their first rows are encoded as they arrive too (otherwise
   * a table's rows are kept as objects until its codec comes back, which takes a turn of the event loop).
   */
  async prepare(tables: readonly TraceTable[]): Promise<void> {
    await Promise.all(
      tables.map(async (table) => {
        if (this.codecs.has(table)) return;
        this.asked.add(table);
        try {
          this.codecs.set(table, await this.store.rowCodec(table));
        } finally {
          this.asked.delete(table);
        }
      }),
    );
  }

  private askCodec(table: TraceTable): void {
    if (this.asked.has(table)) return;
    this.asked.add(table);
    this.store.rowCodec(table).then(
      (c) => this.codecs.set(table, c),
      () => this.asked.delete(table), // asked again on the next row
    );
  }

  /** Whether a flush of the queued rows is due now (size or age). */
  due(now?: number): boolean {
    if (this.queued >= this.maxRows || this.queuedBytes >= this.maxBytes) return true;
    // The clock only when the age decides: reading it is not free on VMs, and callers may ask per event.
    return this.queued > 0 && (now ?? Date.now()) - this.firstAt >= this.maxDelayMs;
  }

  /**
   * For a caller that keeps one write behind (flushBehind): whether to start the next write now. A due batch
   * fills on while the previous write runs, until that write ends or the queue holds growWhileBusy batches.
   */
  dueBehind(now?: number): boolean {
    if (!this.due(now)) return false;
    return !this.behindRunning || this.queued >= this.maxRows * this.growWhileBusy || this.queuedBytes >= this.maxBytes * this.growWhileBusy;
  }

  /**
   * Write the rows queued now; resolves with their count once written. On failure they go back in front of
   * the queue for the next attempt. Flushes run one at a time (a second starts when the first has settled).
   */
  flush(): Promise<number> {
    // With no flush in flight this one takes the queued rows now, not a turn of the event loop later: due()
    // turns false at once, and rows added after the call wait for the next flush (a caller that went on
    // adding and asked due() again before yielding saw it still due and awaited this flush to the end).
    const parts = this.started === 0 ? this.take() : null;
    this.started++;
    const run = () => this.flushNow(parts ?? this.take());
    const next = this.inFlight.then(run, run);
    this.inFlight = next.catch(() => undefined).finally(() => this.started--);
    return next;
  }

  /**
   * Start writing the queued rows without waiting for them, so the caller goes on adding while the engine
   * writes (the sink and the replay keep one write in flight this way). The write flushBehind() started before
   * is awaited first, and its failure thrown here, once (its rows were queued again). `written` runs with the
   * row count once the rows are written.
   */
  async flushBehind(written: (rows: number) => Promise<void> | void): Promise<void> {
    await this.settle();
    this.behindRunning = true;
    const f = this.flush()
      .then(written)
      .finally(() => (this.behindRunning = false));
    f.catch(() => undefined); // handled: settle() rethrows it
    this.behind = f;
  }

  /** Wait for the write flushBehind() started, if any; throws its failure once. */
  async settle(): Promise<void> {
    const f = this.behind;
    this.behind = null;
    await f;
  }

  /** Whether the write flushBehind() started last is still running. */
  get writingBehind(): boolean {
    return this.behindRunning;
  }

  private async flushNow(parts: Part[]): Promise<number> {
    if (parts.length === 0) return 0;
    const rows = parts.reduce((n, p) => n + p.rows.length + (p.encoded?.rows ?? 0), 0);
    // Tables are independent: written concurrently (the server takes them in parallel; chDB queues them on its
    // lanes), the largest first, so that it does not wait behind a smaller one.
    const size = (p: Part): number => p.encoded?.pos ?? p.rows.length * 1024;
    const results = await Promise.allSettled([...parts].sort((a, b) => size(b) - size(a)).map((p) => this.write(p)));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    this.stats.flushes++;
    return rows;
  }

  /** Everything queued becomes this flush's parts; the queue starts empty. */
  private take(): Part[] {
    const parts: Part[] = [];
    for (const [table, b] of this.batches) {
      if (b.rows.length === 0 && !b.encoded?.rows) continue;
      parts.push({ table, batch: b, rows: b.rows, encoded: b.encoded?.rows ? b.encoded : null, codec: b.codec });
      if (b.encoded) b.largest = Math.max(b.largest, b.encoded.pos);
      b.rows = [];
      if (b.encoded?.rows) b.encoded = null;
    }
    this.writing += this.queued;
    this.queued = 0;
    this.queuedBytes = 0;
    return parts;
  }

  private async write(p: Part): Promise<void> {
    if (p.rows.length > 0) {
      await this.failed(p, () => this.store.insert(p.table, p.rows));
      this.written(p.table, p.rows.length);
      p.rows = [];
    }
    if (p.encoded) {
      const e = p.encoded;
      await this.failed(p, () => this.store.insertEncoded(p.codec!, e.payload(), e.rows));
      this.written(p.table, e.rows);
      e.reset();
      p.batch.spare ??= e;
      p.encoded = null;
    }
  }

  /** Runs a write; if it fails, what this part has not written yet goes back in front of the table's queue. */
  private async failed(p: Part, run: () => Promise<void>): Promise<void> {
    try {
      await run();
    } catch (err) {
      const b = p.batch;
      const back = p.rows.length + (p.encoded?.rows ?? 0);
      b.rows = p.rows.concat(b.rows);
      if (p.encoded) {
        const later = b.encoded;
        if (later?.rows) p.encoded.appendFrom(later);
        this.queuedBytes += p.encoded.pos - (later?.pos ?? 0);
        if (later) {
          later.reset();
          b.spare ??= later;
        }
        b.encoded = p.encoded;
      }
      if (this.queued === 0) this.firstAt = Date.now();
      this.writing -= back;
      this.queued += back;
      throw err;
    }
  }

  private written(table: TraceTable, n: number): void {
    this.writing -= n;
    this.stats.rows += n;
    this.stats.byTable[table] = (this.stats.byTable[table] ?? 0) + n;
  }
}
