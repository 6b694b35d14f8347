// The trace store contract: one SQL dialect over two targets, chDB embedded (default shape) and a ClickHouse
// server (distributed shape). Implementations: core/traces/chdb.ts and core/traces/server.ts.
import { RlstreamError } from '../errors.ts';
import type { TableCodec } from './rowbinary.ts';

/** Every table the trace sink writes (infra/clickhouse/migrations/). */
export const TRACE_TABLES = [
  'trajectory_starts',
  'trajectories',
  'turns',
  'tool_calls',
  'rewards',
  'advantages',
  'train_steps',
  'policy_versions',
  'control',
  'evaluations',
  'dead_letters',
] as const;
export type TraceTable = (typeof TRACE_TABLES)[number];

export type Row = Record<string, unknown>;

/**
 * 'current': ClickHouse with LowCardinality, DateTime64, codecs, TTL (chDB 26.x, servers of today).
 * 'compat-18': ClickHouse 18.16 (Debian's package), which lacks them and query parameters.
 */
export type Dialect = 'current' | 'compat-18';

/** Limits enforced by ClickHouse itself (settings), not by the caller. */
export interface QueryLimits {
  /** max_result_rows; default 10,000. */
  maxRows?: number;
  /** max_result_bytes; default 16 MiB. */
  maxBytes?: number;
  /** max_execution_time in seconds; default 10. */
  maxSeconds?: number;
  /** result_overflow_mode: 'throw' (default) fails the query, 'break' returns a truncated result. */
  overflow?: 'throw' | 'break';
  /**
   * max_memory_usage of the query, bytes; default 256 MiB. The query runs in the SQL sandbox process
   * (sandbox/), not in the caller's, whose own process limit (prlimit) is above this one.
   */
  maxMemoryBytes?: number;
  /** max_rows_to_read over all tables the query reads (read_overflow_mode throw); default 100 million. */
  maxRowsToRead?: number;
}

export interface CompiledLimits {
  maxRows: number;
  maxBytes: number;
  maxSeconds: number;
  overflow: 'throw' | 'break';
  maxMemoryBytes: number;
  maxRowsToRead: number;
}

const DEFAULT_LIMITS: CompiledLimits = Object.freeze({
  maxRows: 10_000,
  maxBytes: 16 << 20,
  maxSeconds: 10,
  overflow: 'throw',
  maxMemoryBytes: 256 << 20,
  maxRowsToRead: 100_000_000,
});

export function compileLimits(limits: QueryLimits = {}): CompiledLimits {
  const out = { ...DEFAULT_LIMITS, ...Object.fromEntries(Object.entries(limits).filter(([, v]) => v !== undefined)) } as CompiledLimits;
  for (const k of ['maxRows', 'maxBytes', 'maxSeconds', 'maxMemoryBytes', 'maxRowsToRead'] as const) {
    if (!Number.isInteger(out[k]) || out[k] <= 0) throw new RlstreamError('INPUT_INVALID', `limits.${k} must be a positive integer, got ${String(out[k])}`);
  }
  if (out.overflow !== 'throw' && out.overflow !== 'break') throw new RlstreamError('INPUT_INVALID', `limits.overflow must be 'throw' or 'break'`);
  return Object.freeze(out);
}

/**
 * The ClickHouse settings that enforce a set of limits (names are the same in 18.16 and 26.x). They are sent
 * with readonly=1, the level at which a query may change no setting at all (readonly=2 would let a query's
 * SETTINGS clause raise these limits again).
 */
export function limitSettings(l: CompiledLimits): Record<string, string> {
  return {
    max_result_rows: String(l.maxRows),
    max_result_bytes: String(l.maxBytes),
    max_execution_time: String(l.maxSeconds),
    result_overflow_mode: l.overflow,
    max_memory_usage: String(l.maxMemoryBytes),
    max_rows_to_read: String(l.maxRowsToRead),
    read_overflow_mode: 'throw',
  };
}

export interface Column {
  name: string;
  type: string;
}

export interface QueryResult {
  columns: Column[];
  rows: Row[];
  /** Engine-reported elapsed time, milliseconds. */
  elapsedMs: number;
}

export interface QueryOptions {
  /** Limits (named queries): the query then runs as queryReadonly does, checked and in the sandbox. */
  limits?: QueryLimits;
}

export interface MigrationReport {
  dialect: Dialect;
  applied: string[];
  skipped: string[];
}

/** How many rows, or encoded bytes, a trace writer queues before it inserts them (one part per table). */
export interface BatchSize {
  maxRows: number;
  maxBytes: number;
}

export interface TraceStore {
  readonly kind: 'chdb' | 'server';
  /** The batch a writer takes by default on this target, where it differs from the writer's own default. */
  readonly preferredBatch?: BatchSize;
  /** Known after migrate() or connect: which DDL and query variants this target needs. */
  readonly dialect: Dialect;
  readonly database: string;
  /** A description for logs and the CLI (no credentials). */
  readonly target: string;
  /** Apply pending migrations of infra/clickhouse/migrations (idempotent). */
  migrate(): Promise<MigrationReport>;
  /**
   * Insert rows into one table (RowBinary, or JSONEachRow for a table without a codec); times are epoch ms. A row
   * with a key that is not a column an INSERT writes (as the engine describes the table) refuses the whole insert
   * with INPUT_INVALID naming the table, the row and the key, before anything is written (columns.ts).
   */
  insert(table: TraceTable, rows: readonly Row[]): Promise<void>;
  /**
   * The table's RowBinary codec (compiled from DESCRIBE TABLE; it turns epoch ms into the dialect's times), or
   * null when the table has a column type without one. The trace writer encodes rows with it as they arrive.
   */
  rowCodec(table: TraceTable): Promise<TableCodec | null>;
  /** Insert `rows` rows that `codec` encoded into `payload` (unchanged until the promise settles). */
  insertEncoded(codec: TableCodec, payload: Buffer, rows: number): Promise<void>;
  /** Insert pre-serialized JSONEachRow lines, unchecked here: the engine itself refuses a field that is not a column. */
  insertRaw(table: TraceTable, jsonEachRow: Buffer, rows: number): Promise<void>;
  /** Trusted SQL (ours: migrations, the dashboard's reads, tests). One statement. With limits (named queries) it takes queryReadonly's path. */
  query(sql: string, options?: QueryOptions): Promise<QueryResult>;
  /**
   * Untrusted SQL (the admin SQL route, `rlstream query`, named queries with a user's parameters): checked on
   * the engine's own parse (sql-check.ts; a refusal is SqlRefusedError), then run in the SQL sandbox process
   * (sandbox/) with readonly=1 and the limits as engine settings.
   */
  queryReadonly(sql: string, limits?: QueryLimits): Promise<QueryResult>;
  /** Trusted statement without a result (DDL, OPTIMIZE). */
  exec(sql: string): Promise<void>;
  close(): Promise<void>;
}

export function traceError(message: string, cause?: unknown): RlstreamError {
  const detail = cause instanceof Error ? `: ${cause.message.split('\n')[0]?.slice(0, 500)}` : '';
  return new RlstreamError('TRACE_STORE', message + detail, cause === undefined ? {} : { cause });
}

/** ClickHouse JSON output: {meta, data, statistics}; shared by both implementations. */
export function parseJsonResult(text: string): QueryResult {
  if (text.trim() === '') return { columns: [], rows: [], elapsedMs: 0 };
  const parsed = JSON.parse(text) as { meta?: Column[]; data?: Row[]; statistics?: { elapsed?: number } };
  return {
    columns: (parsed.meta ?? []).map((c) => ({ name: c.name, type: c.type })),
    rows: parsed.data ?? [],
    elapsedMs: (parsed.statistics?.elapsed ?? 0) * 1000,
  };
}

/** JSONEachRow lines for rows; numbers that are not finite become null (JSON cannot carry them). */
export function toJsonEachRow(rows: readonly Row[]): Buffer {
  let out = '';
  for (const r of rows) out += JSON.stringify(r) + '\n';
  return Buffer.from(out, 'utf8');
}

/** Reject anything that is not a single statement's text (a trailing semicolon is tolerated). */
export function singleStatement(sql: string): string {
  const text = sql.trim().replace(/;\s*$/, '');
  if (text === '') throw new RlstreamError('INPUT_INVALID', 'empty SQL');
  return text;
}
