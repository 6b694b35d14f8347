// Batched inserts into a trace store: rows are buffered per table and written when the batch is large enough
// (rows or encoded bytes) or old enough. The sink commits log offsets only after flush() resolves, so a crash
// between the two re-delivers rows that the ReplacingMergeTree tables then collapse.
//
// Rows are encoded (RowBinary, the store's codec for the table) as they are added rather than at flush: the
// row's values are still in cache, the row objects die young instead of piling up for the garbage collector,
// and a batch costs its encoded bytes in memory. Rows that arrive before the table's codec is known, tables
// without a codec, and rows whose values fail to encode are kept as objects and go through insert(), which
// reports a bad value with the column named (the rows then stay buffered, as with any failed flush).
import type { Row, TraceStore, TraceTable } from '../../core/traces/store.ts';
import { RowBinaryBuffer, type TableCodec } from '../../core/traces/rowbinary.ts';

export interface WriterOptions {
  /** Flush when this many rows are buffered across tables (default 20,000). */
  maxRows?: number;
  /** Flush when the encoded rows buffered across tables reach this many bytes (default 64 MiB). */
  maxBytes?: number;
  /** Flush when the first buffered row is this old, ms (default 1,000). */
  maxDelayMs?: number;
}

export interface WriterStats {
  rows: number;
  flushes: number;
  byTable: Partial<Record<TraceTable, number>>;
}

interface TableBatch {
  /** Rows kept as objects (see the header), inserted before the encoded ones. */
  rows: Row[];
  /** Rows encoded with `codec`. */
  encoded: RowBinaryBuffer | null;
  codec: TableCodec | null;
}

export class TraceWriter {
  private readonly batches = new Map<TraceTable, TableBatch>();
  /** Each table's codec once the store answered (null: the table has none); absent while not asked or asked. */
  private readonly codecs = new Map<TraceTable, TableCodec | null>();
  private readonly asked = new Set<TraceTable>();
  private buffered = 0;
  private firstAt = 0;
  private inFlight: Promise<unknown> = Promise.resolve();
  readonly maxRows: number;
  readonly maxBytes: number;
  readonly maxDelayMs: number;
  readonly stats: WriterStats = { rows: 0, flushes: 0, byTable: {} };

  constructor(
    private readonly store: TraceStore,
    options: WriterOptions = {},
  ) {
    this.maxRows = options.maxRows ?? 20_000;
    this.maxBytes = options.maxBytes ?? 64 << 20;
    this.maxDelayMs = options.maxDelayMs ?? 1_000;
  }

  /** Rows buffered and not yet written. */
  get pending(): number {
    return this.buffered;
  }

  /** Encoded bytes buffered across tables. */
  get pendingBytes(): number {
    let n = 0;
    for (const b of this.batches.values()) n += b.encoded?.bytes ?? 0;
    return n;
  }

  add(table: TraceTable, row: Row): void {
    let b = this.batches.get(table);
    if (!b) this.batches.set(table, (b = { rows: [], encoded: null, codec: null }));
    if (this.buffered === 0) this.firstAt = Date.now();
    this.buffered++;
    const codec = this.codecs.get(table);
    if (codec) {
      try {
        codec.append((b.encoded ??= new RowBinaryBuffer()), row);
        b.codec = codec;
        return;
      } catch {
        // insert() reports it, with the column named
      }
    } else if (codec === undefined) this.askCodec(table);
    b.rows.push(row);
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

  /** Whether a flush is due now (size or age). */
  due(now = Date.now()): boolean {
    return this.buffered >= this.maxRows || this.pendingBytes >= this.maxBytes || (this.buffered > 0 && now - this.firstAt >= this.maxDelayMs);
  }

  /** Write everything buffered; on failure the rows stay buffered for the next attempt. */
  flush(): Promise<number> {
    // One flush at a time: a second waits for the first, then writes what is left.
    const next = this.inFlight.then(
      () => this.flushNow(),
      () => this.flushNow(),
    );
    this.inFlight = next.catch(() => undefined);
    return next;
  }

  private async flushNow(): Promise<number> {
    if (this.buffered === 0) return 0;
    const startedAt = Date.now();
    // Tables are independent: written concurrently (the server takes them in parallel; chDB queues them).
    // What is written is fixed now; rows added meanwhile stay for the next flush.
    const parts = [...this.batches].map(([table, b]) => ({ table, b, rows: b.rows.length, encodedRows: b.encoded?.rows ?? 0, bytes: b.encoded?.bytes ?? 0 }));
    const results = await Promise.allSettled(
      parts.map(async (p) => {
        if (p.rows > 0) {
          await this.store.insert(p.table, p.b.rows.slice(0, p.rows));
          p.b.rows.splice(0, p.rows);
          this.written(p.table, p.rows);
        }
        if (p.encodedRows > 0) {
          await this.store.insertEncoded(p.b.codec!, p.b.encoded!.buf.subarray(0, p.bytes), p.encodedRows);
          this.dropEncoded(p.b, p.bytes, p.encodedRows);
          this.written(p.table, p.encodedRows);
        }
      }),
    );
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    if (this.buffered > 0) this.firstAt = startedAt; // rows added during the flush are at most this old
    this.stats.flushes++;
    return parts.reduce((n, p) => n + p.rows + p.encodedRows, 0);
  }

  private written(table: TraceTable, n: number): void {
    this.buffered -= n;
    this.stats.rows += n;
    this.stats.byTable[table] = (this.stats.byTable[table] ?? 0) + n;
  }

  /** Forget the first `bytes` (`rows` rows) of a table's encoded rows, keeping any appended after them. */
  private dropEncoded(b: TableBatch, bytes: number, rows: number): void {
    const e = b.encoded!;
    if (e.pos === bytes) {
      e.reset();
      return;
    }
    e.buf.copyWithin(0, bytes, e.pos);
    e.pos -= bytes;
    e.rows -= rows;
  }
}
