// Opens a trace store from a target string: `chdb:<dir>` (embedded, default shape) or an http(s) ClickHouse
// URL (server). A `#<database>` suffix picks the database (default 'rlstream').
import { RlstreamError } from '../errors.ts';
import { ChdbTraceStore } from './chdb.ts';
import { ServerTraceStore } from './server.ts';
import type { TraceStore } from './store.ts';

export interface OpenStoreOptions {
  database?: string;
  /** Apply pending migrations before returning (default true). */
  migrate?: boolean;
  /** Server credentials, where they are not in the URL (chDB has none). */
  username?: string;
  password?: string;
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

export async function openTraceStore(target: string, options: OpenStoreOptions = {}): Promise<TraceStore> {
  const t = parseStoreTarget(target);
  const database = options.database ?? t.database;
  const store: TraceStore =
    t.kind === 'chdb'
      ? await ChdbTraceStore.open({ dir: t.location, ...(database ? { database } : {}) })
      : await ServerTraceStore.open({
          url: t.location,
          ...(database ? { database } : {}),
          ...(options.username === undefined ? {} : { username: options.username }),
          ...(options.password === undefined ? {} : { password: options.password }),
        });
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
