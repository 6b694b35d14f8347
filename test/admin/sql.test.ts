// The SQL route cannot write, create, drop, change settings, read host files or kill queries: each attempt is a
// 403 ADM_ERR_SQL_REFUSED and afterwards the data is unchanged. On chDB always; on a ClickHouse server when
// CLICKHOUSE_URL is set (required under RLSTREAM_REQUIRE_SERVICES=1).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildAdminServer } from '../../admin/server.ts';
import { blankLiteralsAndComments, guardReadonlySql } from '../../admin/sql-guard.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';
import { newId } from '../../core/ids.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { auth, fixture, READ_TOKEN, TOKENS, type Fixture } from './helpers.ts';

const OUTFILE = join(tmpdir(), `rlstream-admin-outfile-${newId()}.json`);

/** Statements that must be refused, with the reason each is dangerous. */
const ATTEMPTS: [string, string][] = [
  ["INSERT INTO tool_calls (run_id, trajectory_id, call_id) VALUES ('x', 'y', 'z')", 'insert'],
  ['CREATE TABLE evil (a Int32) ENGINE = Memory', 'create table'],
  ['CREATE DATABASE evil', 'create database'],
  ['CREATE TEMPORARY TABLE evil (a Int32)', 'temporary table'],
  ['DROP TABLE tool_calls', 'drop table'],
  ['TRUNCATE TABLE tool_calls', 'truncate'],
  ['ALTER TABLE tool_calls DELETE WHERE 1', 'mutation'],
  ['ALTER TABLE tool_calls ADD COLUMN evil Int32', 'alter'],
  ['RENAME TABLE tool_calls TO evil', 'rename'],
  ['OPTIMIZE TABLE tool_calls FINAL', 'optimize'],
  ['SET readonly = 0', 'SET readonly'],
  ['SET max_result_rows = 100000000', 'SET a limit'],
  ['SELECT 1 SETTINGS readonly = 0', 'SETTINGS readonly'],
  ['SELECT count() FROM tool_calls SETTINGS max_result_rows = 100000000', 'SETTINGS lifts a limit'],
  ['SELECT 1; DROP TABLE tool_calls', 'second statement'],
  ["SELECT * FROM file('/etc/passwd', 'LineAsString')", 'host file read'],
  ["INSERT INTO FUNCTION file('/tmp/rlstream-evil', 'CSV') SELECT 1", 'host file write'],
  [`SELECT * FROM tool_calls INTO OUTFILE '${OUTFILE}'`, 'INTO OUTFILE'],
  ['SELECT 1 /* comment */ INTO   OUTFILE \'/tmp/x2\' FORMAT CSV', 'INTO OUTFILE after a comment'],
  ['KILL QUERY WHERE 1', 'kill queries'],
  ['SYSTEM DROP DNS CACHE', 'system command'],
];

async function sqlRefusals(app: FastifyInstance, store: TraceStore) {
  const before = Number((await store.query('SELECT count() AS n FROM tool_calls')).rows[0]!['n']);
  const tables = (await store.query('SHOW TABLES')).rows.length;
  const failures: string[] = [];
  for (const [sql, what] of ATTEMPTS) {
    const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql } });
    const body = JSON.parse(res.body) as { code?: string };
    if (res.statusCode !== 403 || body.code !== 'ADM_ERR_SQL_REFUSED') failures.push(`${what}: ${res.statusCode} ${res.body.slice(0, 200)}`);
  }
  assert.deepEqual(failures, [], 'every attempt is refused with ADM_ERR_SQL_REFUSED');
  assert.equal(Number((await store.query('SELECT count() AS n FROM tool_calls')).rows[0]!['n']), before, 'no row changed');
  assert.equal((await store.query('SHOW TABLES')).rows.length, tables, 'no table created or dropped');
  assert.equal(existsSync(OUTFILE), false, 'no file was written');
  // The connection is still usable and still read-only after all of that.
  const ok = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql: "SELECT value FROM system.settings WHERE name = 'readonly'" } });
  assert.equal(ok.statusCode, 200, ok.body);
  assert.equal(String((JSON.parse(ok.body) as { rows: { value: unknown }[] }).rows[0]!.value), '1');
}

describe('sql guard', () => {
  test('literals and comments are blanked before checking', () => {
    const blanked = blankLiteralsAndComments("SELECT 'INTO OUTFILE' -- KILL QUERY\n, `a``b`, 'it\\'s' /* x */ FROM t");
    assert.equal(blanked.replace(/\s+/g, ' '), 'SELECT , , FROM t');
    assert.doesNotThrow(() => guardReadonlySql("SELECT 'into outfile', 'kill query' FROM t"));
    assert.throws(() => guardReadonlySql("select 1 into\noutfile 'x'"), /INTO OUTFILE/);
    assert.throws(() => guardReadonlySql('select 1; kill  mutation where 1'), /KILL/);
  });
});

describe('chDB', () => {
  let f: Fixture;
  let app: FastifyInstance;
  before(async () => {
    f = await fixture({ traces: true });
    await f.store!.insert('tool_calls', [{ run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: 'e', time: Date.now(), _version: 1 }]);
    app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false });
  });
  after(async () => {
    await app.close();
    await f.close();
    rmSync(OUTFILE, { force: true });
  });
  test('writes, DDL, settings changes, host files and KILL are refused', async () => {
    await sqlRefusals(app, f.store!);
  });
});

describe('ClickHouse server', () => {
  const url = process.env['CLICKHOUSE_URL'];
  let f: Fixture;
  let store: TraceStore;
  let app: FastifyInstance;
  const database = `admin_test_${newId().replace(/-/g, '').slice(0, 12)}`;
  before(async () => {
    if (!url) return;
    f = await fixture();
    store = await openTraceStore(`${url}#${database}`);
    await store.insert('tool_calls', [{ run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: 'e', time: Date.now(), _version: 1 }]);
    app = await buildAdminServer({ ...f.ctx, traces: adminTraceStore(store) }, { tokens: TOKENS, env: {}, tail: false });
  });
  after(async () => {
    if (!url) return;
    await app.close();
    await store.exec(`DROP DATABASE IF EXISTS ${database}`).catch(() => {});
    await store.close();
    await f.close();
  });
  test('writes, DDL, settings changes, host files and KILL are refused', async (t) => {
    if (!url) {
      if (process.env['RLSTREAM_REQUIRE_SERVICES'] === '1') assert.fail('CLICKHOUSE_URL is not set');
      t.skip('CLICKHOUSE_URL is not set');
      return;
    }
    await sqlRefusals(app, store);
  });
});

