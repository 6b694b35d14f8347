// TraceStore on a ClickHouse server over HTTP (@clickhouse/client): the distributed shape. The server's version
// decides the dialect: before 20.x (Debian's 18.16) the compat-18 DDL and query variants apply, and event times
// (epoch ms) are written as DateTime seconds. No query parameters are used anywhere (18.16 has none): values
// reach SQL through core/traces/sql.ts.
import { Readable } from 'node:stream';
import { ClickHouseLogLevel, createClient, type ClickHouseClient, type ClickHouseSettings } from '@clickhouse/client';
import { RlstreamError } from '../errors.ts';
import { applyMigrations } from './migrate.ts';
import { quoteIdent, quoteString } from './sql.ts';
import { SqlSandbox } from './sandbox/sandbox.ts';
import { RowBinaryCodecs, type TableCodec } from './rowbinary.ts';
import { checkRowKeys, ColumnCache } from './columns.ts';
import { NativeBlocks } from './native-block.ts';
import { parseJsonResult, singleStatement, toJsonEachRow, traceError, type Dialect, type MigrationReport, type QueryLimits, type QueryOptions, type QueryResult, type Row, type TraceStore, type TraceTable } from './store.ts';

export interface ServerStoreOptions {
  /** http(s)://host:port, optionally with user:password@ (never logged). */
  url: string;
  /** Default 'rlstream'; created when missing. */
  database?: string;
  /** Per-request timeout, ms; default 60,000. */
  requestTimeoutMs?: number;
  /** Credentials (config traces.username and traces.password); they take precedence over the URL's. */
  username?: string;
  password?: string;
  /** Credentials untrusted queries run with (a user with SELECT on the trace database only: infra/clickhouse/users.d). */
  reader?: { username?: string; password?: string };
}

/** The dialect a server version string needs. */
function dialectOf(version: string): Dialect {
  const major = Number(version.split('.')[0]);
  if (!Number.isFinite(major)) throw new RlstreamError('TRACE_STORE', `unrecognised ClickHouse version ${JSON.stringify(version)}`);
  return major < 20 ? 'compat-18' : 'current';
}

// 64-bit integers as JSON numbers (precision beyond 2^53 is not needed for analytics, and both dialects agree).
const OUTPUT: ClickHouseSettings = { output_format_json_quote_64bit_integers: 0 };

export class ServerTraceStore implements TraceStore {
  readonly kind = 'server' as const;
  /**
   * Twice the writer's default. Each insert makes a part per table, and a server writes a part as two files per
   * column stream (18.16 has no compact parts) and merges parts again later, so fewer, larger inserts cost the
   * server less CPU and drain faster, for more peak memory (figures in docs/benchmarks.md). chDB keeps the
   * writer's default: larger batches are slower there (its first insert starts later).
   */
  readonly preferredBatch = Object.freeze({ maxRows: 200_000, maxBytes: 128 << 20 });
  readonly database: string;
  readonly target: string;
  dialect: Dialect = 'current';
  /** compat-18 only: DateTime (seconds) columns per table, whose ms values are divided on insert. */
  private secondsColumns = new Map<string, string[]>();
  private client: ClickHouseClient | null;
  /** Native blocks in sorting-key order (a current server takes plain String for LowCardinality(String)). */
  private readonly nativeBlocks = new NativeBlocks();
  /** Each table's columns as the engine describes them: what a row's keys are checked against. */
  private readonly columns = new ColumnCache(async (table) => (await this.query(`DESCRIBE TABLE ${quoteIdent(table)}`)).rows);
  private readonly codecs = new RowBinaryCodecs(this.columns);
  /** Payload bytes sent by insert()/insertRaw() (benchmarks report MB/s from it). */
  bytesSent = 0;
  private sandbox: SqlSandbox | null = null;

  private constructor(
    client: ClickHouseClient,
    database: string,
    target: string,
    /** The server's origin, without credentials. */
    private readonly url: string,
    /** Who untrusted queries run as: the reader's credentials where given, else the store's own. */
    private readonly reader: { username?: string; password?: string; readonlySetting: boolean },
  ) {
    this.client = client;
    this.database = database;
    this.target = target;
  }

  static async open(options: ServerStoreOptions): Promise<ServerTraceStore> {
    const database = options.database ?? 'rlstream';
    quoteIdent(database);
    let url: URL;
    try {
      url = new URL(options.url);
    } catch {
      throw new RlstreamError('CONFIG_INVALID', `ClickHouse URL ${JSON.stringify(options.url)} is not a URL`);
    }
    const target = `${url.protocol}//${url.host}#${database}`;
    // The client's own logger writes to the console; our errors carry the server's message instead.
    const credentials = {
      ...(options.username === undefined ? {} : { username: options.username }),
      ...(options.password === undefined ? {} : { password: options.password }),
    };
    const common = { url: options.url, ...credentials, request_timeout: options.requestTimeoutMs ?? 60_000, log: { level: ClickHouseLogLevel.OFF } };
    const boot = createClient(common);
    try {
      const rs = await boot.query({ query: 'SELECT version() AS v', format: 'JSONEachRow' });
      const version = ((await rs.json()) as { v: string }[])[0]?.v ?? '';
      await boot.command({ query: `CREATE DATABASE IF NOT EXISTS ${quoteIdent(database)}` });
      const own = { username: options.username ?? (decodeURIComponent(url.username) || undefined), password: options.password ?? (decodeURIComponent(url.password) || undefined) };
      const reader = options.reader ?? own;
      const store = new ServerTraceStore(createClient({ ...common, database }), database, target, url.origin, {
        ...(reader.username === undefined ? {} : { username: reader.username }),
        ...(reader.password === undefined ? {} : { password: reader.password }),
        // A reader's profile is read-only itself, and a read-only 18.16 profile refuses readonly in the URL.
        readonlySetting: options.reader === undefined,
      });
      store.dialect = dialectOf(version);
      await store.loadColumnTypes();
      return store;
    } catch (err) {
      if (err instanceof RlstreamError) throw err;
      throw new RlstreamError('TRACE_STORE', `cannot reach ClickHouse at ${target}: ${(err as Error).message}`, { cause: err, retriable: true });
    } finally {
      await boot.close();
    }
  }

  private live(): ClickHouseClient {
    if (!this.client) throw new RlstreamError('TRACE_STORE', `trace store ${this.target} is closed`);
    return this.client;
  }

  private async loadColumnTypes(): Promise<void> {
    if (this.dialect !== 'compat-18') return;
    const res = await this.query(
      `SELECT table, name FROM system.columns WHERE database = ${quoteString(this.database)} AND type IN ('DateTime', 'Nullable(DateTime)')`,
    );
    const map = new Map<string, string[]>();
    for (const r of res.rows) map.set(String(r['table']), [...(map.get(String(r['table'])) ?? []), String(r['name'])]);
    this.secondsColumns = map;
  }

  async migrate(): Promise<MigrationReport> {
    const report = await applyMigrations({ dialect: this.dialect, database: this.database, exec: (s) => this.exec(s), query: (s) => this.query(s) });
    await this.loadColumnTypes();
    await this.nativeBlocks.loadSortingKeys((sql) => this.query(sql), this.database);
    this.columns.reset();
    this.codecs.reset();
    return report;
  }

  async insert(table: TraceTable, rows: readonly Row[]): Promise<void> {
    if (rows.length === 0) return;
    // Every row's keys are checked against the table's columns before anything is written: by the codec as it
    // encodes them, else here.
    const codec = await this.rowCodec(table).catch(() => null);
    if (codec) return this.insertEncoded(codec, codec.encode(rows), rows.length);
    checkRowKeys(
      await this.columns.get(table).catch((err: unknown) => {
        throw traceError(`insert into ${table}: its columns could not be read`, err);
      }),
      rows,
    );
    const seconds = this.secondsColumns.get(table);
    let out = rows;
    if (seconds && seconds.length > 0) {
      out = rows.map((r) => {
        const c = { ...r };
        for (const col of seconds) if (typeof c[col] === 'number') c[col] = Math.floor((c[col] as number) / 1000);
        return c;
      });
    }
    await this.insertRaw(table, toJsonEachRow(out), rows.length);
  }

  rowCodec(table: TraceTable): Promise<TableCodec | null> {
    return this.codecs.get(table);
  }

  async insertEncoded(codec: TableCodec, payload: Buffer, rows: number): Promise<void> {
    if (rows === 0) return;
    // Binary rows (18.16 reads both): as a Native block when the addon is built (the server reads its columns in
    // bulk: 7.6 → 5.4 server CPU-µs a row inserting a synthetic run into 18.16), else the RowBinary as it came.
    // The codec itself turns epoch ms into DateTime seconds. Columns are named: the payload's, in its order.
    const names = codec.columns.map((c) => quoteIdent(c.name)).join(', ');
    const table = codec.table as TraceTable;
    const block = this.nativeBlocks.block(codec, payload, rows);
    if (!block) return this.send(table, `(${names}) FORMAT RowBinary`, payload, rows);
    const body = await block.catch((err: unknown) => {
      throw traceError(`insert of ${rows} rows into ${table} failed`, err);
    });
    await this.send(table, `(${names}) FORMAT Native`, body, rows);
  }

  async insertRaw(table: TraceTable, jsonEachRow: Buffer, rows: number): Promise<void> {
    if (rows === 0) return;
    await this.send(table, 'FORMAT JSONEachRow', jsonEachRow, rows);
  }

  private async send(table: TraceTable, tail: string, body: Buffer, rows: number, attempt = 1): Promise<void> {
    try {
      // exec with a raw body: the bytes go to the server as they are (insert() would re-encode objects). A
      // JSONEachRow field that is not a column is refused by the server (servers of today skip it by default).
      const res = await this.live().exec({
        query: `INSERT INTO ${quoteIdent(table)} ${tail}`,
        values: Readable.from([body], { objectMode: false }),
        clickhouse_settings: { input_format_skip_unknown_fields: 0 },
      });
      res.stream.resume();
      await new Promise<void>((ok, fail) => res.stream.once('end', ok).once('error', fail));
      this.bytesSent += body.length;
    } catch (err) {
      // A keep-alive socket the server closed while idle (18.16 closes after 3 s; on a loaded host the client's
      // idle timer can fire late) fails the write before the server saw the request: resend once on a new one.
      // Resending is safe anyway: the tables collapse duplicate rows.
      const code = (err as { code?: string }).code;
      if (attempt === 1 && (code === 'EPIPE' || code === 'ECONNRESET')) return this.send(table, tail, body, rows, 2);
      throw traceError(`insert of ${rows} rows into ${table} failed`, err);
    }
  }

  async exec(sql: string): Promise<void> {
    try {
      await this.live().command({ query: sql });
    } catch (err) {
      throw traceError('statement failed', err);
    }
  }

  async query(sql: string, options: QueryOptions = {}): Promise<QueryResult> {
    // Our own queries with limits (named queries, run for a user) take the read-only path.
    if (options.limits) return this.queryReadonly(sql, options.limits);
    return this.run(singleStatement(sql), OUTPUT, 'query failed');
  }

  async queryReadonly(sql: string, limits?: QueryLimits): Promise<QueryResult> {
    // In the SQL sandbox (sandbox/sandbox.ts): parsed and checked there, then sent by that process with the
    // reader's credentials, readonly=1 and the limits in the request URL (settings that apply together: readonly=1
    // forbids the query itself to change any of them, and the server accepts one statement per request).
    this.live();
    this.sandbox ??= new SqlSandbox({ target: { kind: 'server', url: this.url, ...this.reader }, database: this.database });
    return this.sandbox.query(sql, limits);
  }

  private async run(query: string, settings: ClickHouseSettings, what: string): Promise<QueryResult> {
    try {
      // exec sends the text as written (query() would append FORMAT, turning SET or DDL into a syntax error
      // instead of the server's own refusal); default_format picks JSON for statements that return rows.
      const res = await this.live().exec({ query, clickhouse_settings: { ...settings, default_format: 'JSON' } as ClickHouseSettings });
      const chunks: Buffer[] = [];
      for await (const c of res.stream) chunks.push(c as Buffer);
      return parseJsonResult(Buffer.concat(chunks).toString('utf8'));
    } catch (err) {
      throw traceError(what, err);
    }
  }

  async close(): Promise<void> {
    await this.sandbox?.close();
    this.sandbox = null;
    const c = this.client;
    this.client = null;
    await c?.close();
  }
}
