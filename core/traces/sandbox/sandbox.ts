// Untrusted SQL (the admin SQL route, named queries run for a user, `rlstream query`) runs here: in a separate
// process that holds nothing of the caller's (spawn.ts), after a check of what the engine itself parsed
// (../sql-check.ts). Per query:
// 1. chDB: a process reads one snapshot of the store, linked for it (snapshot.ts) before its first query;
//    after the store writes, the next query gets a new process (acquire);
// 2. the sandbox's engine parses the text (formatQuery: one statement; EXPLAIN AST: its tree) and this process
//    checks the tree against the allow-lists; a refusal is SqlRefusedError, nothing runs;
// 3. the sandbox runs the same text, with readonly=1 and the limits as engine settings, and this process stops
//    it (kills the process) when it overruns its time. A query that ends its process (its memory past the
//    process limit) fails alone; the next query starts a new process.
import { spawn, type ChildProcess } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import type { Readable, Duplex } from 'node:stream';
import { RlstreamError } from '../../errors.ts';
import { checkParsed, SqlRefusedError, type FunctionCatalogue } from '../sql-check.ts';
import { compileLimits, limitSettings, parseJsonResult, singleStatement, type QueryLimits, type QueryResult } from '../store.ts';
import type { FromSandbox, FunctionInfo, Parsed, SandboxRequest, SandboxTarget, ToSandbox } from './protocol.ts';
import { sandboxCommand, type Isolation } from './spawn.ts';
import { snapshotStore } from './snapshot.ts';

export interface SqlSandboxOptions {
  target: SandboxTarget;
  /** The trace database: the only one a query may name, and the one it runs in. */
  database: string;
  /** chDB: the live store's directory, and its write count (a new snapshot is taken when it changed). */
  store?: { dir: string; writes: () => number };
  /** Sandbox processes at once (each runs one query at a time); default 2. */
  processes?: number;
  /**
   * The allow-list check of the parsed tree (layer 1). Only the test that shows the sandbox alone holds turns
   * it off.
   */
  check?: boolean;
  /**
   * The process's memory beyond its own base (RLIMIT_DATA = SANDBOX_BASE_BYTES + this); default 512 MiB, twice
   * the engine's default per-query limit. A query allowed more by its limits ends the process instead.
   */
  memoryBytes?: number;
}

/** Process memory besides the query's own: node, the TypeScript loader and the engine (measured: README). */
export const SANDBOX_BASE_BYTES = 1024 << 20;
/** For the sandbox's own steps (start, parse, opening a snapshot): generous, as a loaded machine is slow. */
const PARSE_TIMEOUT_MS = 60_000;
/** Time past the engine's own max_execution_time before the process is killed. */
const KILL_GRACE_MS = 5_000;
const START_TIMEOUT_MS = 30_000;

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
}

class SandboxProcess {
  readonly child: ChildProcess;
  readonly ready: Promise<void>;
  private readonly channel: Duplex;
  private readonly pending = new Map<number, Pending>();
  private seq = 0;
  private output = '';
  exited: string | null = null;
  /** The store write count of the snapshot it reads (-1: none yet). */
  snapshotWrites = -1;
  /** The engine's data directory: a chDB store's snapshot, or (server) the parser's empty directory. */
  readonly dataDir: string;

  constructor(
    readonly scratch: string,
    readonly isolation: Isolation,
    command: ReturnType<typeof sandboxCommand>,
  ) {
    this.dataDir = join(scratch, 'data');
    this.child = spawn(command.command, command.args, command.options);
    this.channel = this.child.stdio[3] as Duplex;
    for (const s of [this.child.stdout, this.child.stderr] as Readable[]) {
      // Kept only to explain a failed start; never logged as is.
      s.setEncoding('utf8');
      s.on('data', (c: string) => (this.output = (this.output + c).slice(-4000)));
    }
    let buffered = '';
    let onReady: () => void = () => {};
    this.ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new RlstreamError('TRACE_STORE', `the SQL sandbox did not start within ${START_TIMEOUT_MS / 1000} s`)), START_TIMEOUT_MS);
      onReady = () => (clearTimeout(timer), resolve());
      this.child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new RlstreamError('TRACE_STORE', `the SQL sandbox (${isolation}) did not start (${signal ?? `exit code ${code}`}): ${this.output.trim().slice(-1000)}`));
      });
    });
    this.ready.catch(() => {});
    this.channel.setEncoding('utf8');
    this.channel.on('data', (chunk: string) => {
      buffered += chunk;
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const m = JSON.parse(buffered.slice(0, nl)) as FromSandbox;
        buffered = buffered.slice(nl + 1);
        if (m.id === 0) onReady();
        const p = this.pending.get(m.id);
        if (!p) continue;
        this.pending.delete(m.id);
        if (m.ok) p.resolve(m.value);
        else p.reject(new RlstreamError('TRACE_STORE', m.error));
      }
    });
    this.channel.on('error', () => {});
    this.child.on('exit', (code, signal) => {
      this.exited ??= signal ? `killed by ${signal}` : `exit code ${code}`;
      for (const p of this.pending.values()) p.reject(new RlstreamError('TRACE_STORE', `the query's sandbox process ended (${this.exited})`));
      this.pending.clear();
    });
  }

  call(m: SandboxRequest, timeoutMs: number): Promise<unknown> {
    if (this.exited) return Promise.reject(new RlstreamError('TRACE_STORE', `the query's sandbox process ended (${this.exited})`));
    const id = ++this.seq;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.kill();
        const what = m.op === 'run' ? 'TIMEOUT_EXCEEDED: the sandbox stopped the query' : `the sandbox's ${m.op} step did not end`;
        reject(new RlstreamError('TRACE_STORE', `${what} after ${Math.round(timeoutMs / 1000)} s (its process was killed)`));
      }, timeoutMs);
      this.pending.set(id, {
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
      this.channel.write(JSON.stringify({ ...m, id } satisfies ToSandbox) + '\n');
    });
  }

  kill(): void {
    if (this.exited) return;
    // Marked at once: the exit event comes later, and the process must not be handed out meanwhile.
    this.exited = 'killed by this process';
    if (process.env['RLSTREAM_SQL_SANDBOX_DEBUG']) process.stderr.write(`sandbox output: ${this.output}\n`);
    this.child.kill('SIGKILL');
  }
}

/**
 * Where scratch directories go: the temporary directory, unless the sandbox runs as another user and cannot walk
 * that path (a private TMPDIR, as test/run.sh and many CI systems give, is 0700): then the system's /tmp, which
 * every user can walk. The scratch directory itself is given to the sandbox's user.
 */
function scratchParent(otherUser: boolean): string {
  const dir = tmpdir();
  if (!otherUser || walkableByOthers(dir)) return dir;
  if (walkableByOthers('/tmp')) return '/tmp';
  throw new RlstreamError('TRACE_STORE', `the SQL sandbox runs as nobody and can reach neither ${dir} nor /tmp (each directory on the path needs o+x)`);
}

function walkableByOthers(path: string): boolean {
  for (let d = resolve(path); ; d = dirname(d)) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return false;
    } catch {
      return false;
    }
    if (dirname(d) === d) return true;
  }
}

export class SqlSandbox {
  private readonly idle: SandboxProcess[] = [];
  private readonly all = new Set<SandboxProcess>();
  private readonly waiting: { resolve: (p: SandboxProcess) => void; reject: (e: unknown) => void }[] = [];
  private catalogue: Promise<FunctionCatalogue> | null = null;
  private closed = false;

  constructor(private readonly options: SqlSandboxOptions) {}

  /** Parses, checks and runs one untrusted text; see the module comment. */
  async query(sql: string, limits?: QueryLimits): Promise<QueryResult> {
    const text = singleStatement(sql);
    const l = compileLimits(limits);
    const p = await this.acquire();
    let healthy = true;
    try {
      const store = this.options.store;
      if (store && p.snapshotWrites < 0) {
        // The process's one data directory, linked before its engine opens it (see acquire).
        const writes = store.writes();
        snapshotStore(store.dir, p.dataDir, this.owner());
        p.snapshotWrites = writes;
      }
      // A server (18.16 here) does not share chDB's lexer (heredocs, nested comments, Unicode quotes): it is sent
      // chDB's own rendering of the text, and that rendering is what was parsed and checked.
      const reformat = this.options.target.kind === 'server';
      const parsed = (await p.call({ op: 'parse', sql: text, reformat }, PARSE_TIMEOUT_MS).catch((err: unknown) => {
        if (/Multi-statements are not allowed/.test((err as Error).message)) throw new SqlRefusedError('refused', 'several statements in one query');
        throw err;
      })) as Parsed;
      if (this.options.check !== false) checkParsed(parsed, await this.functions(p), this.options.database);
      const json = (await p.call({ op: 'run', sql: reformat ? parsed.formatted : text, database: this.options.database, settings: limitSettings(l) }, l.maxSeconds * 1000 + KILL_GRACE_MS)) as string;
      return parseJsonResult(json);
    } catch (err) {
      // A process whose engine cannot open its directory any more answers nothing again.
      healthy = !p.exited && !/Failed to create connection/.test((err as Error).message);
      throw err;
    } finally {
      this.release(p, healthy);
    }
  }

  private owner(): { uid: number; gid: number } | null {
    return sandboxCommand('/', { dataBytes: 1, fileBytes: 1 }, false).owner;
  }

  private functions(p: SandboxProcess): Promise<FunctionCatalogue> {
    this.catalogue ??= (p.call({ op: 'functions' }, PARSE_TIMEOUT_MS) as Promise<FunctionInfo[]>).then((rows) => new Map(rows.map((r) => [r.name, r])));
    this.catalogue.catch(() => (this.catalogue = null));
    return this.catalogue;
  }

  /**
   * An idle process whose snapshot is current, else a new one. chDB binds one data directory per process and
   * hung, now and then, opening a second one after closing the first (measured: once in ~30 reopens), so a
   * process reads one snapshot all its life: after the store has written, its idle processes are replaced.
   */
  private async acquire(): Promise<SandboxProcess> {
    if (this.closed) throw new RlstreamError('TRACE_STORE', 'the SQL sandbox is closed');
    const store = this.options.store;
    for (const stale of this.idle.filter((p) => store && p.snapshotWrites >= 0 && p.snapshotWrites !== store.writes())) this.retire(stale);
    const free = this.idle.pop();
    if (free) return free;
    if (this.all.size >= (this.options.processes ?? 2)) return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
    return this.start();
  }

  private release(p: SandboxProcess, healthy: boolean): void {
    if (!healthy || this.closed) {
      this.retire(p);
      // The process's slot goes to a new process for the next waiter.
      const next = this.waiting.shift();
      if (next) this.start().then(next.resolve, next.reject);
      return;
    }
    const next = this.waiting.shift();
    if (next) next.resolve(p);
    else this.idle.push(p);
  }

  private retire(p: SandboxProcess): void {
    p.kill();
    this.all.delete(p);
    const i = this.idle.indexOf(p);
    if (i >= 0) this.idle.splice(i, 1);
    rmSync(p.scratch, { recursive: true, force: true });
  }

  private async start(): Promise<SandboxProcess> {
    // In the temporary directory, whose path every user can walk (a store's own directory may be private: the
    // snapshot's links give the sandbox its files, not its path). On another file system than the store's,
    // the snapshot copies (snapshot.ts).
    const owner = this.owner();
    const scratch = mkdtempSync(join(scratchParent(owner !== null), 'rlstream-sql-sandbox-'));
    const command = sandboxCommand(scratch, { dataBytes: SANDBOX_BASE_BYTES + (this.options.memoryBytes ?? 512 << 20), fileBytes: 1 << 30 }, this.options.target.kind === 'server');
    if (command.owner) chownSync(scratch, command.owner.uid, command.owner.gid);
    const p = new SandboxProcess(scratch, command.isolation, command);
    this.all.add(p);
    try {
      await p.ready;
      await p.call({ op: 'init', target: this.options.target, dir: p.dataDir }, PARSE_TIMEOUT_MS);
    } catch (err) {
      this.retire(p);
      throw err;
    }
    return p;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const w of this.waiting.splice(0)) w.reject(new RlstreamError('TRACE_STORE', 'the SQL sandbox is closed'));
    for (const p of [...this.all]) this.retire(p);
  }
}
