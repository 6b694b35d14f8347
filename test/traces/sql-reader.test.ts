// The server layer of untrusted SQL on ClickHouse 18.16: a private clickhouse-server started from infra's own
// config and users.xml, whose `rlstream_reader` user the sandbox runs as. With the check of the parsed tree
// turned OFF, the server alone refuses writes, DDL and every database but the trace database (directly and
// through merge()/remote()); what 18.16 does not refuse to this user (system tables, table functions such as
// url(), a SETTINGS clause, KILL QUERY) is shown in the diagnostics, as the documented limit that layer 1 and the process cover.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, copyFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openTraceStore } from '../../core/traces/open.ts';
import { SqlSandbox } from '../../core/traces/sandbox/sandbox.ts';

const READER = { username: 'rlstream_reader', password: 'rlstream-reader-dev' };

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

const server = spawnSync('sh', ['-c', 'command -v clickhouse-server']).status === 0;

test('ClickHouse 18.16: the reader user alone keeps untrusted SQL to the trace database, read-only', { skip: server ? false : 'clickhouse-server is not installed', timeout: 180_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-reader-'));
  for (const d of ['log', 'data', 'tmp', 'user_files', 'format_schemas']) mkdirSync(join(dir, d));
  const [http, tcp, inter] = [await freePort(), await freePort(), await freePort()];
  const config = readFileSync('infra/clickhouse/config.xml', 'utf8').replaceAll('@DIR@', dir).replace('18123', String(http)).replace('19000', String(tcp)).replace('19009', String(inter));
  writeFileSync(join(dir, 'config.xml'), config);
  copyFileSync('infra/clickhouse/users.xml', join(dir, 'users.xml'));
  const child = spawn('clickhouse-server', [`--config-file=${join(dir, 'config.xml')}`], { stdio: 'ignore' });
  t.after(() => {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });
  const url = `http://127.0.0.1:${http}`;
  for (let i = 0; ; i++) {
    const ok = await fetch(`${url}/ping`).then((r) => r.ok, () => false);
    if (ok) break;
    if (i > 100) throw new Error('clickhouse-server did not start');
    await new Promise((r) => setTimeout(r, 200));
  }
  const admin = await openTraceStore(`${url}#rlstream`);
  t.after(() => admin.close());
  await admin.insert('tool_calls', [{ run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: 'e', time: Date.now(), _version: 1 }]);
  await admin.exec('CREATE DATABASE IF NOT EXISTS other');
  await admin.exec("CREATE TABLE IF NOT EXISTS other.secret (s String) ENGINE = Memory");
  await admin.exec("INSERT INTO other.secret VALUES ('other-database-secret')");

  // The store as a run opens it with traces.reader_username: its checked path answers.
  const store = await openTraceStore(`${url}#rlstream`, { reader: READER, migrate: false });
  t.after(() => store.close());
  assert.deepEqual((await store.queryReadonly('SELECT count() AS n FROM tool_calls')).rows, [{ n: 1 }]);
  // Where chDB's lexer and 18.16's differ (nested comments, heredocs: 18.16 has neither), the server is sent
  // chDB's rendering of what it parsed: the url() that 18.16 alone would see never reaches it (this reader's
  // readonly=2 profile would run it). A listener stands for a host inside the network.
  let connections = 0;
  const listener = createServer((socket) => {
    connections++;
    socket.destroy();
  });
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  t.after(() => listener.close());
  const target = `http://127.0.0.1:${(listener.address() as { port: number }).port}/`;
  for (const sql of [
    `SELECT count() AS n FROM tool_calls /* /* */ , url('${target}', 'CSV', 'a String') -- */`,
    `SELECT count() AS n FROM tool_calls /* /* */ UNION ALL SELECT count() FROM url('${target}', 'CSV', 'a String') -- */`,
    `SELECT $$ /* $$ AS a FROM tool_calls, url('${target}', 'CSV', 'a String') -- */`,
  ]) {
    const r = await store.queryReadonly(sql).then((x) => JSON.stringify(x.rows), (e: Error) => `ERROR ${e.message}`);
    t.diagnostic(`${sql.slice(0, 60)}… => ${r.slice(0, 120)}`);
  }
  assert.equal(connections, 0, 'the server never fetched the URL');

  const unchecked = new SqlSandbox({ target: { kind: 'server', url, ...READER, readonlySetting: false }, database: 'rlstream', check: false });
  t.after(() => unchecked.close());
  const run = (sql: string) => unchecked.query(sql).then((r) => JSON.stringify(r.rows), (e: Error) => `ERROR ${e.message}`);
  assert.equal(await run('SELECT count() AS n FROM tool_calls'), '[{"n":1}]');
  for (const sql of ['SELECT * FROM other.secret', "SELECT * FROM merge('other', '.*')", `SELECT * FROM remote('127.0.0.1:${tcp}', other.secret)`, 'SELECT * FROM default.x']) {
    assert.match(await run(sql), /ERROR .*Access denied to database/, sql);
  }
  for (const sql of ["INSERT INTO tool_calls (run_id) VALUES ('x')", 'CREATE TABLE evil (a UInt8) ENGINE = Memory', 'DROP TABLE tool_calls', 'ALTER TABLE tool_calls DELETE WHERE 1', 'SET readonly = 0']) {
    // (chDB renders ALTER … DELETE in a form 18.16 cannot parse: a syntax error, so it never runs either.)
    assert.match(await run(sql), /ERROR .*(readonly|read-only|Access denied|Cannot|Syntax error)/i, sql);
  }
  assert.deepEqual((await admin.query('SELECT count() AS n FROM tool_calls')).rows, [{ n: 1 }], 'the data is unchanged');
  // What 18.16 lets this user do: layer 1 refuses each of these (test/traces/sql-corpus.test.ts).
  const limits = {
    'system.settings': await run('SELECT count() > 0 AS n FROM system.settings'),
    'a SETTINGS clause': await run('SELECT 1 AS n SETTINGS max_memory_usage = 0'),
    'KILL QUERY': await run("KILL QUERY WHERE query_id = 'none'"),
  };
  t.diagnostic(`18.16 lets the reader: ${JSON.stringify(limits)}`);
});
