// TraceStore on chDB: ClickHouse 26.x embedded in this process, persisted to one directory (the default,
// zero-setup shape). libchdb binds one data directory per process, so a second store on another directory
// is refused with a clear error while the first is open.
//
// Untrusted and limited queries (queryReadonly, query with limits) never run in this process: they go to the
// SQL sandbox (sandbox/sandbox.ts), a separate process that reads a snapshot of this directory, after the
// check of what its engine parsed (sql-check.ts).
import { Session, drainPending } from 'chdb';
import { mkdirSync, mkdtempSync, rmSync, existsSync, accessSync, constants } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { RlstreamError } from '../errors.ts';
import { applyMigrations } from './migrate.ts';
import { quoteIdent, quoteString } from './sql.ts';
import { RowBinaryCodecs, type TableCodec } from './rowbinary.ts';
import { checkRowKeys, ColumnCache, type TableColumns } from './columns.ts';
import { NativeBlocks, withoutLowCardinality } from './native-block.ts';
import { SqlSandbox } from './sandbox/sandbox.ts';
import { parseJsonResult, singleStatement, toJsonEachRow, traceError, type MigrationReport, type QueryLimits, type QueryOptions, type QueryResult, type Row, type TraceStore, type TraceTable } from './store.ts';

let openDir: string | null = null;

/** Insert connections per store: one per core of the machines this runs on (more only queue for CPU). */
const INSERT_LANES = 2;
let openCount = 0;

export interface ChdbStoreOptions {
  /** Data directory (created when missing). */
  dir: string;
  /** Database inside it; default 'rlstream'. */
  database?: string;
}

/** The file() structure of a RowBinary payload: LowCardinality(String) read as String (see insertEncoded). */
function rowBinaryStructure(codec: TableCodec): string {
  return codec.columns.map((c) => `${quoteIdent(c.name)} ${withoutLowCardinality(c.type)}`).join(', ');
}

export class ChdbTraceStore implements TraceStore {
  readonly kind = 'chdb' as const;
  readonly dialect = 'current' as const;
  readonly database: string;
  readonly target: string;
  private readonly dir: string;
  private session: Session | null;
  /** The sandbox of untrusted queries (started on first use) and this store's count of writes it snapshots by. */
  private sandbox: SqlSandbox | null = null;
  private writes = 0;
  /** chDB runs one query per connection at a time; a chain keeps ours in order. */
  private chain: Promise<unknown> = Promise.resolve();
  /**
   * Connections for RowBinary inserts, each with its own chain: connections to one directory run queries in
   * parallel, so the tables of one batch are written two at a time.
   */
  private readonly lanes: { session: Session; chain: Promise<unknown>; queued: number }[] = [];
  private databaseReady = false;
  /** Native blocks in sorting-key order, LowCardinality(String) declared as plain String (see insertEncoded). */
  private readonly nativeBlocks = new NativeBlocks();
  /** Each table's columns as the engine describes them: what a row's keys are checked against. */
  private readonly columns = new ColumnCache(async (table) => (await this.query(`DESCRIBE TABLE ${quoteIdent(table)}`)).rows);
  private readonly codecs = new RowBinaryCodecs(this.columns);
  /** Private directory for RowBinary insert payloads (tmpfs when there is one), made on first insert. */
  private spoolDir: string | null = null;
  private spoolSeq = 0;
  /** Payload bytes handed to the engine by insert()/insertRaw() (benchmarks report MB/s from it). */
  bytesSent = 0;

  private constructor(dir: string, database: string) {
    this.dir = dir;
    this.database = database;
    this.target = `chdb:${dir}#${database}`;
    this.session = new Session(dir);
  }

  static async open(options: ChdbStoreOptions): Promise<ChdbTraceStore> {
    const dir = resolve(options.dir);
    const database = options.database ?? 'rlstream';
    quoteIdent(database);
    if (openDir !== null && openDir !== dir) {
      throw new RlstreamError('TRACE_STORE', `chDB already holds ${openDir} in this process; one data directory per process (asked for ${dir})`);
    }
    mkdirSync(dir, { recursive: true });
    if (openDir === null) await drainPending();
    let store: ChdbTraceStore;
    try {
      store = new ChdbTraceStore(dir, database);
    } catch (err) {
      throw traceError(`cannot open chDB at ${dir}`, err);
    }
    openDir = dir;
    openCount++;
    await store.exec(`CREATE DATABASE IF NOT EXISTS ${quoteIdent(database)}`);
    store.databaseReady = true;
    return store;
  }

  private live(): Session {
    if (!this.session) throw new RlstreamError('TRACE_STORE', `trace store ${this.target} is closed`);
    return this.session;
  }

  /**
   * Runs an insert on the lane with the least work queued (by payload bytes); a second lane opens while the
   * first is busy. With the writer handing over a flush's tables largest first, the largest lands on a lane of
   * its own and the others share the rest (trajectories were ~40% of a flush's bytes, and queued behind
   * another table they were the flush's critical path).
   */
  private laned<T>(weight: number, fn: (session: Session) => Promise<T>): Promise<T> {
    this.live();
    let lane = this.lanes.reduce<(typeof this.lanes)[number] | null>((best, l) => (best === null || l.queued < best.queued ? l : best), null);
    if (!lane || (lane.queued > 0 && this.lanes.length < INSERT_LANES)) {
      lane = { session: new Session(this.dir), chain: Promise.resolve(), queued: 0 };
      this.lanes.push(lane);
    }
    const l = lane;
    l.queued += weight;
    const next = l.chain.then(
      () => fn(l.session),
      () => fn(l.session),
    );
    l.chain = next.catch(() => undefined).finally(() => (l.queued -= weight));
    return next;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => undefined);
    return next;
  }

  async migrate(): Promise<MigrationReport> {
    const report = await applyMigrations({ dialect: this.dialect, database: this.database, exec: (s) => this.exec(s), query: (s) => this.query(s) });
    await this.nativeBlocks.loadSortingKeys((sql) => this.query(sql), this.database);
    this.columns.reset();
    this.codecs.reset();
    return report;
  }

  async insert(table: TraceTable, rows: readonly Row[]): Promise<void> {
    if (rows.length === 0) return;
    this.live();
    // Every row's keys are checked against the table's columns before anything is written: by the codec as it
    // encodes them, else here.
    const codec = await this.rowCodec(table).catch(() => null);
    if (codec) return this.insertEncoded(codec, codec.encode(rows), rows.length);
    checkRowKeys(await this.columnsOf(table), rows);
    return this.insertRaw(table, toJsonEachRow(rows), rows.length);
  }

  private columnsOf(table: TraceTable): Promise<TableColumns> {
    return this.columns.get(table).catch((err: unknown) => {
      throw traceError(`insert into ${table}: its columns could not be read`, err);
    });
  }

  rowCodec(table: TraceTable): Promise<TableCodec | null> {
    return this.codecs.get(table);
  }

  async insertEncoded(codec: TableCodec, payload: Buffer, rows: number): Promise<void> {
    if (rows === 0) return;
    this.live();
    const table = codec.table;
    // chDB's insert API takes text formats only, so the rows go through a file of our own that the engine reads
    // with file(): no text parsing on either side. As a Native block when the addon is built (regrouped by
    // column off the main thread; the engine reads it in bulk), else as the RowBinary it came in.
    // optimize_on_insert = 0: the engine would otherwise collapse duplicate keys within each inserted block
    // (ReplacingMergeTree) at about a third of the insert's CPU; reads use FINAL, and merges collapse them anyway.
    // The file declares plain String where the table has LowCardinality(String) (the same bytes): building
    // dictionaries while reading and again for the table cost another third; the INSERT converts once.
    const names = codec.columns.map((c) => quoteIdent(c.name)).join(', ');
    const path = join(this.spool(), `${table}-${++this.spoolSeq}`);
    // The block is written now (on the pool, while the lane may still be busy with another table).
    const native = this.nativeBlocks.write(path, codec, payload, rows);
    native?.catch(() => {}); // awaited in the lane; a failure before then must not count as unhandled
    const source = native ? `file(${quoteString(path)}, 'Native')` : `file(${quoteString(path)}, 'RowBinary', ${quoteString(rowBinaryStructure(codec))})`;
    await this.laned(payload.length, async (session) => {
      try {
        const bytes = native ? await native : (await writeFile(path, payload), payload.length);
        await session.queryAsync(
          `INSERT INTO ${quoteIdent(this.database)}.${quoteIdent(table)} (${names}) SELECT * FROM ${source} SETTINGS optimize_on_insert = 0`,
          { format: 'TabSeparated' },
        );
        this.writes++;
        this.bytesSent += bytes;
      } catch (err) {
        throw traceError(`insert of ${rows} rows into ${table} failed`, err);
      } finally {
        // Off the main thread: freeing a batch's tmpfs pages takes tens of milliseconds a drain.
        await rm(path, { force: true });
      }
    });
  }

  private spool(): string {
    if (this.spoolDir && existsSync(this.spoolDir)) return this.spoolDir;
    let base = tmpdir();
    try {
      accessSync('/dev/shm', constants.W_OK);
      base = '/dev/shm';
    } catch {
      // no tmpfs: the system temp directory
    }
    this.spoolDir = mkdtempSync(join(base, 'rlstream-chdb-insert-'));
    return this.spoolDir;
  }

  async insertRaw(table: TraceTable, jsonEachRow: Buffer, rows: number): Promise<void> {
    if (rows === 0) return;
    const session = this.live();
    quoteIdent(table);
    const name = `${this.database}.${table}`;
    await this.serial(async () => {
      try {
        // The engine refuses a field that is not a column (its default here skips it: a misspelt key stored nothing).
        await session.insert({ table: name, values: jsonEachRow, format: 'JSONEachRow', settings: { input_format_skip_unknown_fields: 0 } });
        this.writes++;
        this.bytesSent += jsonEachRow.length;
      } catch (err) {
        throw traceError(`insert of ${rows} rows into ${table} failed`, err);
      }
    });
  }

  async exec(sql: string): Promise<void> {
    const session = this.live();
    await this.serial(async () => {
      try {
        await this.use(session);
        await session.queryAsync(sql, { format: 'TabSeparated' });
        this.writes++;
      } catch (err) {
        throw traceError('statement failed', err);
      }
    });
  }

  async query(sql: string, options: QueryOptions = {}): Promise<QueryResult> {
    // Our own SELECTs with limits take the read-only path: they never need to write.
    if (options.limits) return this.queryReadonly(sql, options.limits);
    const session = this.live();
    return this.serial(async () => {
      try {
        await this.use(session);
        return parseJsonResult((await session.queryAsync(singleStatement(sql), { format: 'JSON' })).text());
      } catch (err) {
        throw traceError('query failed', err);
      }
    });
  }

  async queryReadonly(sql: string, limits?: QueryLimits): Promise<QueryResult> {
    this.live();
    this.sandbox ??= new SqlSandbox({ target: { kind: 'chdb' }, database: this.database, store: { dir: this.dir, writes: () => this.writes } });
    return this.sandbox.query(sql, limits);
  }

  /** Sessions on one directory may share a connection, and with it the current database: name ours first. */
  private async use(session: Session): Promise<void> {
    if (this.databaseReady) await session.queryAsync(`USE ${quoteIdent(this.database)}`, { format: 'TabSeparated' });
  }

  async close(): Promise<void> {
    if (!this.session) return;
    await this.chain;
    await Promise.all(this.lanes.map((l) => l.chain));
    for (const l of this.lanes.splice(0)) l.session.close();
    await this.sandbox?.close();
    this.sandbox = null;
    this.session.close();
    this.session = null;
    if (this.spoolDir) rmSync(this.spoolDir, { recursive: true, force: true });
    openCount--;
    if (openCount === 0) {
      await drainPending();
      openDir = null;
    }
  }
}
