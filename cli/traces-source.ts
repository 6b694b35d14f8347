// Where `rlstream query` reads traces from, as a new user expects: the store named by --store (a run directory,
// chdb:<dir> or a ClickHouse URL), RLSTREAM_TRACES / CLICKHOUSE_URL, or else the newest run under .rlstream/;
// never a new empty store. A live run holds its chDB directory's lock, so its traces are read through that run's
// admin API, whose link (with a token) the run writes to <run dir>/admin-url.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { describeError, RlstreamError } from '../core/errors.ts';
import { takeFromEnvironment } from '../core/auth/environ.ts';
import { openTraceStore } from '../core/traces/open.ts';
import { runNamed, type NamedQueries } from '../core/traces/queries.ts';
import type { QueryLimits, QueryResult, TraceStore } from '../core/traces/store.ts';

/** A trace source: the store itself, or a live run's admin API in front of it. */
export interface TraceSource extends NamedQueries {
  queryReadonly(sql: string, limits: QueryLimits): Promise<QueryResult>;
  close(): Promise<void>;
}

export interface ResolvedTraces {
  /** chdb:<dir> or an http(s) URL. */
  target: string;
  /** The run directory the store belongs to, when known (its admin-url is the way in while it runs). */
  runDir: string | null;
  /** Said on stderr when the choice was not the user's. */
  note: string | null;
}

const HOW = 'give --store <run dir> (e.g. .rlstream/calculator/<run id>), chdb:<dir> or a ClickHouse http(s):// URL';

/** Run directories (holding chdb/) under a data directory, one or two levels down. */
function runDirsUnder(root: string): string[] {
  if (!existsSync(root)) return [];
  const out: string[] = [];
  const visit = (dir: string, depth: number) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (!e.isDirectory()) continue;
      const d = join(dir, e.name);
      if (existsSync(join(d, 'chdb'))) out.push(d);
      else if (depth > 0) visit(d, depth - 1);
    }
  };
  visit(root, 1);
  return out;
}

export function resolveTraces(store: string | undefined, env: NodeJS.ProcessEnv = process.env, cwd = process.cwd()): ResolvedTraces {
  const spec = store ?? env['RLSTREAM_TRACES'] ?? env['CLICKHOUSE_URL'];
  if (spec !== undefined && /^https?:\/\//.test(spec)) return { target: spec, runDir: null, note: null };
  if (spec !== undefined) {
    const path = resolve(cwd, spec.startsWith('chdb:') ? spec.slice(5) : spec);
    if (!existsSync(path)) throw new RlstreamError('CONFIG_INVALID', `trace store ${spec} does not exist: ${HOW}`);
    if (existsSync(join(path, 'chdb'))) return { target: `chdb:${join(path, 'chdb')}`, runDir: path, note: null };
    // A chDB directory holds its catalogue in metadata/; anything else would be turned into a new empty store.
    if (existsSync(join(path, 'metadata'))) {
      const parent = resolve(path, '..');
      return { target: `chdb:${path}`, runDir: existsSync(join(parent, 'log')) ? parent : null, note: null };
    }
    // A data directory (run.data_dir): its newest run.
    const newest = newestRun(path, spec);
    if (newest) return newest;
    throw new RlstreamError('CONFIG_INVALID', `${spec} is no trace store, run directory or data directory with runs: ${HOW}`);
  }
  const found = newestRun(join(cwd, '.rlstream'), '.rlstream/');
  if (!found) throw new RlstreamError('CONFIG_INVALID', `no trace store given and no run under ${join(cwd, '.rlstream')}: ${HOW} (or set RLSTREAM_TRACES)`);
  return found;
}

/** The most recently written run directory under a data directory, or null. */
function newestRun(root: string, shown: string): ResolvedTraces | null {
  const runs = runDirsUnder(root).sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  const newest = runs[0];
  if (!newest) return null;
  return { target: `chdb:${join(newest, 'chdb')}`, runDir: newest, note: `reading the traces of ${newest} (the newest of ${runs.length} run(s) under ${shown}; --store <run dir> to choose)` };
}

class StoreSource implements TraceSource {
  constructor(private readonly store: TraceStore) {}
  get target(): string {
    return this.store.target;
  }
  queryReadonly(sql: string, limits: QueryLimits): Promise<QueryResult> {
    return this.store.queryReadonly(sql, limits);
  }
  runNamed(name: string, params: Record<string, unknown>, limits?: QueryLimits): Promise<QueryResult> {
    return runNamed(this.store, name, params, limits);
  }
  close(): Promise<void> {
    return this.store.close();
  }
}

/** The admin API of a live run, reached with the link it wrote (URL and token). */
export class AdminApiSource implements TraceSource {
  readonly target: string;

  constructor(
    private readonly base: string,
    private readonly token: string | null,
    runDir: string,
  ) {
    this.target = `the admin API of the running ${runDir} (${base}; its limits apply)`;
  }

  /** From `<run dir>/admin-url`: `<base>/dashboard/#token=<token>`. */
  static fromRunDir(runDir: string): AdminApiSource | null {
    const file = join(runDir, 'admin-url');
    if (!existsSync(file)) return null;
    const link = readFileSync(file, 'utf8').trim();
    const m = /^(https?:\/\/[^/]+)\/dashboard\/(?:#token=(.+))?$/.exec(link);
    if (!m) return null;
    return new AdminApiSource(m[1]!, m[2] ?? takeFromEnvironment('RLSTREAM_ADMIN_TOKEN') ?? null, runDir);
  }

  /** Whether the admin answers for this run now (an ended run's admin-url points at nothing, or another process). */
  async serves(runId: string): Promise<boolean> {
    try {
      const res = await fetch(`${this.base}/api/runs/${encodeURIComponent(runId)}`, { headers: this.token ? { authorization: `Bearer ${this.token}` } : {}, signal: AbortSignal.timeout(2_000) });
      return res.ok;
    } catch {
      return false;
    }
  }

  private async post(path: string, body: Record<string, unknown>): Promise<QueryResult> {
    let res: Response;
    try {
      res = await fetch(`${this.base}/api${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(this.token ? { authorization: `Bearer ${this.token}` } : {}) },
        body: JSON.stringify(body),
      });
    } catch (err) {
      throw new RlstreamError('TRACE_STORE', `${this.target} does not answer (${describeError(err)}): if the run has ended, query again; if it was killed, remove its admin-url`, { cause: err });
    }
    const json = (await res.json().catch(() => ({}))) as { message?: string; code?: string; columns?: QueryResult['columns']; rows?: QueryResult['rows']; stats?: { elapsedMs?: number } };
    if (res.status === 401) throw new RlstreamError('CONFIG_INVALID', `${this.target} refused the token: set RLSTREAM_ADMIN_TOKEN to a read token of that run`);
    if (!res.ok) throw new RlstreamError(res.status < 500 ? 'INPUT_INVALID' : 'TRACE_STORE', `${json.code ?? res.status}: ${json.message ?? res.statusText}`);
    return { columns: json.columns ?? [], rows: json.rows ?? [], elapsedMs: json.stats?.elapsedMs ?? 0 };
  }

  // The admin applies its own limits (at most its maxima, which are lower than the CLI's defaults).
  queryReadonly(sql: string): Promise<QueryResult> {
    return this.post('/traces/sql', { sql });
  }

  runNamed(name: string, params: Record<string, unknown>): Promise<QueryResult> {
    return this.post(`/traces/queries/${encodeURIComponent(name)}`, { params });
  }

  async close(): Promise<void> {}
}

export async function openTraceSource(r: ResolvedTraces): Promise<TraceSource> {
  // Ask the run first: its process holds the chDB lock while it runs (and chDB would print its refusal).
  const api = r.runDir && r.target.startsWith('chdb:') ? AdminApiSource.fromRunDir(r.runDir) : null;
  if (api && (await api.serves(basename(r.runDir!)))) return api;
  try {
    return new StoreSource(await openTraceStore(r.target));
  } catch (err) {
    if (!r.target.startsWith('chdb:')) throw err;
    throw new RlstreamError('TRACE_STORE', `${r.target} cannot be opened; if a live run holds it (chDB locks its directory), query through that run's admin API (the dashboard's SQL tab, or the admin-url in its run directory): ${describeError(err)}`, { cause: err });
  }
}
