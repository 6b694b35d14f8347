// Batched inserts into a trace store: rows are buffered per table and written when the batch is large enough
// (rows or bytes) or old enough. The sink commits log offsets only after flush() resolves, so a crash between
// the two re-delivers rows that the ReplacingMergeTree tables then collapse.
import type { Row, TraceStore, TraceTable } from '../../core/traces/store.ts';

export interface WriterOptions {
  /** Flush when this many rows are buffered across tables (default 20,000). */
  maxRows?: number;
  /** Flush when the first buffered row is this old, ms (default 1,000). */
  maxDelayMs?: number;
}

export interface WriterStats {
  rows: number;
  flushes: number;
  byTable: Partial<Record<TraceTable, number>>;
}

export class TraceWriter {
  private readonly buffers = new Map<TraceTable, Row[]>();
  private buffered = 0;
  private firstAt = 0;
  readonly maxRows: number;
  readonly maxDelayMs: number;
  readonly stats: WriterStats = { rows: 0, flushes: 0, byTable: {} };

  constructor(
    private readonly store: TraceStore,
    options: WriterOptions = {},
  ) {
    this.maxRows = options.maxRows ?? 20_000;
    this.maxDelayMs = options.maxDelayMs ?? 1_000;
  }

  get pending(): number {
    return this.buffered;
  }

  add(table: TraceTable, row: Row): void {
    let b = this.buffers.get(table);
    if (!b) this.buffers.set(table, (b = []));
    if (this.buffered === 0) this.firstAt = Date.now();
    b.push(row);
    this.buffered++;
  }

  /** Whether a flush is due now (size or age). */
  due(now = Date.now()): boolean {
    return this.buffered >= this.maxRows || (this.buffered > 0 && now - this.firstAt >= this.maxDelayMs);
  }

  /** Write everything buffered; on failure the rows stay buffered for the next attempt. */
  async flush(): Promise<number> {
    if (this.buffered === 0) return 0;
    const tables = [...this.buffers].filter(([, rows]) => rows.length > 0);
    // Tables are independent: written concurrently (the server takes them in parallel; chDB queues them).
    await Promise.all(tables.map(([table, rows]) => this.store.insert(table, rows)));
    const n = this.buffered;
    for (const [table, rows] of tables) this.stats.byTable[table] = (this.stats.byTable[table] ?? 0) + rows.length;
    this.buffers.clear();
    this.buffered = 0;
    this.stats.rows += n;
    this.stats.flushes++;
    return n;
  }
}
