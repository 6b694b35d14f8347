// The SQL route cannot write, create, drop, change settings, read host files, server settings or other
// system tables, or kill queries: each attempt is a 403 ADM_ERR_SQL_REFUSED and afterwards the data is
// unchanged; a query past the memory or rows-read limit is a 422 ADM_ERR_SQL_LIMIT and the process stays small;
// FORMAT clauses are a 400. On chDB always; on a ClickHouse server when CLICKHOUSE_URL is set (required under
// RLSTREAM_REQUIRE_SERVICES=1).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { buildAdminServer } from '../../admin/server.ts';
import { adminTraceStore } from '../../admin/traces-adapter.ts';
import { newId } from '../../core/ids.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { auth, fixture, READ_TOKEN, TOKENS, type Fixture } from './helpers.ts';

const OUTFILE = join(tmpdir(), `rlstream-admin-outfile-${newId()}.json`);
/** Stands for a run's admin-url: a file beside the traces that holds a control token. */
const SECRET_FILE = join(tmpdir(), `rlstream-admin-secret-${newId()}`);
const SECRET = `control-${newId()}`;

/** Statements that must be refused, with the reason each is dangerous. */
const ATTEMPTS: [string, string][] = [
  ["SELECT file('/etc/passwd')", 'file() reads a host file'],
  [`SELECT file('${SECRET_FILE}')`, "file() reads a run's admin-url"],
  ["SELECT splitByChar('\\0', file('/proc/self/environ'))", 'file() reads the environment'],
  ["SELECT `file`('/etc/passwd')", 'file() as a quoted name'],
  ['SELECT "file" (\'/etc/passwd\')', 'file() as a double-quoted name with a space'],
  ["SELECT FILE/* x */('/etc/passwd')", 'file() in capitals after a comment'],
  ["SELECT `fi\\x6ce`('/etc/passwd')", 'file() spelled with an escape'],
  ["SELECT length(arrayJoin([file('/etc/hostname')]))", 'file() inside another call'],
  ["SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String')", 'url table function'],
  ["SELECT * FROM remote('127.0.0.1', system.one)", 'remote table function'],
  ["SELECT * FROM executable('id', 'TSV', 'a String')", 'executable table function'],
  ["SELECT * FROM mysql('127.0.0.1:1', 'd', 't', 'u', 'p')", 'mysql table function'],
  ["SELECT getSetting('max_memory_usage')", 'server state by function'],
  ['SELECT * FROM system.settings', 'system.settings'],
  ['SELECT * FROM system.server_settings', 'system.server_settings (paths)'],
  ['SELECT * FROM system.disks', 'system.disks (paths)'],
  ['SELECT * FROM system.parts', 'system.parts (paths)'],
  ['SELECT data_paths FROM system.tables', 'system.tables (paths)'],
  ['SELECT * FROM system.processes', 'other sessions\' queries'],
  ['SELECT * FROM `system`.`settings`', 'system table by quoted names'],
  ['SHOW PROCESSLIST', 'SHOW PROCESSLIST'],
  ['SELECT 1 SETTINGS max_memory_usage = 0', 'SETTINGS lifts the memory limit'],
  ['SELECT count() FROM system.numbers SETTINGS max_rows_to_read = 0', 'SETTINGS lifts the rows-read limit'],
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

/** Queries past a limit, each answered 422 ADM_ERR_SQL_LIMIT. */
const OVER_LIMIT: [string, string, string][] = [
  // ClickHouse 18.16 refuses the numbers() table function in readonly mode; 26.x stops it at the limit.
  ['SELECT length(groupArray(number)) FROM numbers(200000000)', 'the memory probe of the issue', 'ADM_ERR_SQL_LIMIT|ADM_ERR_SQL_REFUSED'],
  ['SELECT length(groupArray(number)) FROM (SELECT number FROM system.numbers LIMIT 200000000)', 'the memory probe over system.numbers', 'ADM_ERR_SQL_LIMIT'],
  ['SELECT length(groupArray(number)) FROM (SELECT number FROM system.numbers LIMIT 60000000)', 'memory alone (~480 MB of array)', 'ADM_ERR_SQL_LIMIT'],
  ['SELECT count() FROM system.numbers', 'rows to read without end', 'ADM_ERR_SQL_LIMIT'],
];
/** The largest growth of the admin process's RSS while the over-limit queries run (the memory limit is 256 MiB). */
const RSS_GROWTH_BOUND = 512 * 1024 * 1024;

async function post(app: FastifyInstance, sql: string) {
  const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql } });
  return { status: res.statusCode, body: res.body, code: (JSON.parse(res.body) as { code?: string }).code };
}

async function sqlLimits(app: FastifyInstance, report: (line: string) => void) {
  const base = process.memoryUsage().rss;
  let peak = base;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 5);
  try {
    for (const [sql, what, codes] of OVER_LIMIT) {
      const r = await post(app, sql);
      assert.ok(codes.split('|').includes(r.code ?? ''), `${what}: ${r.status} ${r.body.slice(0, 300)}`);
      assert.ok(r.status === 422 || r.status === 403, `${what}: ${r.status}`);
    }
  } finally {
    clearInterval(sampler);
  }
  peak = Math.max(peak, process.memoryUsage().rss);
  report(`RSS ${Math.round(base / 2 ** 20)} MiB before, ${Math.round(peak / 2 ** 20)} MiB at most during the over-limit queries, one at a time`);
  assert.ok(peak - base < RSS_GROWTH_BOUND, `RSS grew by ${Math.round((peak - base) / 2 ** 20)} MiB (bound ${RSS_GROWTH_BOUND / 2 ** 20} MiB)`);
  // The pool's most at once: 2 running at their memory limit and 8 waiting (the 11th is a 429).
  const memoryProbe = OVER_LIMIT[2]![0];
  let concurrentPeak = process.memoryUsage().rss;
  const sampler2 = setInterval(() => (concurrentPeak = Math.max(concurrentPeak, process.memoryUsage().rss)), 5);
  const codes = await Promise.all(Array.from({ length: 11 }, () => post(app, memoryProbe).then((r) => r.code ?? String(r.status)))).finally(() => clearInterval(sampler2));
  report(`RSS ${Math.round(base / 2 ** 20)} MiB before, ${Math.round(concurrentPeak / 2 ** 20)} MiB at most with 11 memory probes sent at once (${codes.join(' ')})`);
  assert.ok(codes.every((c) => c === 'ADM_ERR_SQL_LIMIT' || c === 'ADM_ERR_BUSY'), codes.join(' '));
  assert.ok(concurrentPeak - base < RSS_GROWTH_BOUND, `RSS grew by ${Math.round((concurrentPeak - base) / 2 ** 20)} MiB with the pool full`);
  // FORMAT clauses: the route always answers JSON, so another format is a client mistake, not a 500 or `rows: []`.
  for (const format of ['Native', 'Pretty', 'RowBinary', 'Parquet', 'XML', 'Vertical', 'CSV', 'TSV', 'JSONEachRow', 'Null']) {
    const r = await post(app, `SELECT 1 AS one FORMAT ${format}`);
    assert.equal(`${r.status} ${r.code}`, '400 ADM_ERR_SQL_INVALID', `FORMAT ${format}: ${r.body.slice(0, 200)}`);
  }
  // Names that only look like the refused ones still run.
  const ok = await post(app, "SELECT concat('file(', '') AS format, 'system.settings' AS s FROM system.one");
  assert.equal(ok.status, 200, ok.body);
}

async function sqlRefusals(app: FastifyInstance, store: TraceStore) {
  const before = Number((await store.query('SELECT count() AS n FROM tool_calls')).rows[0]!['n']);
  const tables = (await store.query('SHOW TABLES')).rows.length;
  const failures: string[] = [];
  for (const [sql, what] of ATTEMPTS) {
    const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql } });
    const body = JSON.parse(res.body) as { code?: string };
    if (res.statusCode !== 403 || body.code !== 'ADM_ERR_SQL_REFUSED') failures.push(`${what}: ${res.statusCode} ${res.body.slice(0, 200)}`);
    if (res.body.includes(SECRET) || res.body.includes('root:x:0:0')) failures.push(`${what}: the answer holds a file's contents`);
  }
  assert.deepEqual(failures, [], 'every attempt is refused with ADM_ERR_SQL_REFUSED');
  assert.equal(Number((await store.query('SELECT count() AS n FROM tool_calls')).rows[0]!['n']), before, 'no row changed');
  assert.equal((await store.query('SHOW TABLES')).rows.length, tables, 'no table created or dropped');
  assert.equal(existsSync(OUTFILE), false, 'no file was written');
  // The connection is still usable and still read-only after all of that.
  const ok = await post(app, 'SELECT count() AS n FROM tool_calls');
  assert.equal(ok.status, 200, ok.body);
  assert.equal(Number((JSON.parse(ok.body) as { rows: { n: unknown }[] }).rows[0]!.n), before);
  assert.equal((await post(app, 'SELECT 1 SETTINGS readonly = 0')).code, 'ADM_ERR_SQL_REFUSED');
}

before(() => writeFileSync(SECRET_FILE, SECRET, { mode: 0o600 }));
after(() => rmSync(SECRET_FILE, { force: true }));

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
  test('memory and rows-read limits hold and the process stays small; FORMAT is a 400', async (t) => {
    await sqlLimits(app, (line) => t.diagnostic(line));
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
  test('memory and rows-read limits hold; FORMAT is a 400', async (t) => {
    if (!url) {
      t.skip('CLICKHOUSE_URL is not set');
      return;
    }
    await sqlLimits(app, (line) => t.diagnostic(line));
  });
});

