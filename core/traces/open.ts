// Opens a trace store from a target string: `chdb:<dir>` (embedded, default shape) or an http(s) ClickHouse
// URL (server). A `#<database>` suffix picks the database (default 'rlstream').
import { RlstreamError } from '../errors.ts';
import { objectShape, Registry } from '../config/registry.ts';
import { ServerTraceStore } from './server.ts';
import type { TraceStore } from './store.ts';

export interface OpenStoreOptions {
  database?: string;
  /** Apply pending migrations before returning (default true). */
  migrate?: boolean;
  /** Server credentials, where they are not in the URL (chDB has none). */
  username?: string;
  password?: string;
  /** Server: the user untrusted SQL runs as (SELECT on the trace database only); default the credentials above. */
  reader?: { username: string; password: string };
}

export function parseStoreTarget(target: string): { kind: 'chdb' | 'server'; location: string; database?: string } {
  const hash = target.lastIndexOf('#');
  const database = hash >= 0 ? target.slice(hash + 1) : undefined;
  const base = hash >= 0 ? target.slice(0, hash) : target;
  if (base.startsWith('chdb:')) {
    const dir = base.slice(5);
    if (dir === '') throw new RlstreamError('CONFIG_INVALID', 'chdb: target needs a directory, as chdb:<dir>');
    return { kind: 'chdb', location: dir, ...(database ? { database } : {}) };
  }
  if (/^https?:\/\//.test(base)) return { kind: 'server', location: base, ...(database ? { database } : {}) };
  throw new RlstreamError('CONFIG_INVALID', `trace store ${JSON.stringify(target)} is neither chdb:<dir> nor an http(s):// ClickHouse URL`);
}

export interface TraceStorePlugin {
  /** `location` is the target without its kind prefix (a directory, a URL). */
  open(location: string, options: OpenStoreOptions): Promise<TraceStore>;
}

/** Trace stores by the kind of their target; another registers itself with `traceStores.register(kind, plugin)`. */
export const traceStores = new Registry<TraceStorePlugin>('trace store', objectShape('a trace store plug-in ({ open(location, options) })', ['open']));

// chDB's engine (a 540 MB native library) loads when a chdb store is opened, not with this module: a run with
// another store, or none, works where the engine is not installed (a GPU machine given only what it needs).
traceStores.register('chdb', { open: async (dir, o) => (await import('./chdb.ts')).ChdbTraceStore.open({ dir, ...(o.database ? { database: o.database } : {}) }) });
traceStores.register('server', {
  open: (url, o) =>
    ServerTraceStore.open({
      url,
      ...(o.database ? { database: o.database } : {}),
      ...(o.username === undefined ? {} : { username: o.username }),
      ...(o.password === undefined ? {} : { password: o.password }),
      ...(o.reader === undefined ? {} : { reader: o.reader }),
    }),
});

export async function openTraceStore(target: string, options: OpenStoreOptions = {}): Promise<TraceStore> {
  const t = parseStoreTarget(target);
  const database = options.database ?? t.database;
  const store = await traceStores.get(t.kind, 'traces.kind').open(t.location, { ...options, ...(database ? { database } : {}) });
  if (options.migrate ?? true) {
    try {
      await store.migrate();
    } catch (err) {
      await store.close();
      throw err;
    }
  }
  return store;
}
