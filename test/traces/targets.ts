// Trace store targets for tests: chDB always (one data directory per test process, a fresh database per
// test), the ClickHouse server of CLICKHOUSE_URL when set (skipped with a message otherwise, or failing when
// RLSTREAM_REQUIRE_SERVICES=1).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';

let chdbDir: string | null = null;

export interface Target {
  name: 'chdb' | 'server';
  /** Why this target cannot run here, or null. */
  skip: string | null;
  open(prefix: string): Promise<TraceStore>;
}

function uniqueDb(prefix: string): string {
  return `${prefix}_${process.pid}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`;
}

export function targets(): Target[] {
  const url = process.env['CLICKHOUSE_URL'];
  const require = process.env['RLSTREAM_REQUIRE_SERVICES'] === '1';
  return [
    {
      name: 'chdb',
      skip: null,
      open: (prefix) => {
        if (!chdbDir) {
          const dir = (chdbDir = mkdtempSync(join(tmpdir(), 'rlstream-chdb-')));
          process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
        }
        return openTraceStore(`chdb:${chdbDir}`, { database: uniqueDb(prefix) });
      },
    },
    {
      name: 'server',
      skip: url || require ? null : 'CLICKHOUSE_URL is not set: ClickHouse server tests skipped',
      open: (prefix) => {
        if (!url) throw new Error('CLICKHOUSE_URL is not set but RLSTREAM_REQUIRE_SERVICES=1');
        return openTraceStore(url, { database: uniqueDb(prefix) }).then(dropOnClose);
      },
    },
  ];
}

/** A test's server database is dropped when its store closes, so the shared server does not fill up. */
function dropOnClose(store: TraceStore): TraceStore {
  const close = store.close.bind(store);
  store.close = async () => {
    await store.exec(`DROP DATABASE IF EXISTS ${store.database}`).catch(() => undefined);
    await close();
  };
  return store;
}
