// The SQL sandbox alone holds: with the check of the parsed tree turned OFF (layer 1), the queries that layer
// refuses (file() on secrets and /proc, INTO OUTFILE, writes, a second statement) run in the sandbox process
// and still reach nothing of this process's: not a 0600 token file, not this process's environment (a token
// is put there for the test), not /proc/<this pid>/environ; no file appears outside the sandbox's scratch
// directory, and the store's data is unchanged. A query that takes its process past the process memory limit
// fails alone: the next query gets a new process. Runs on chDB, with the isolation this machine gives
// (bubblewrap, or the uid-only mode when RLSTREAM_SQL_SANDBOX=uid; named in the test's diagnostics).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newId } from '../../core/ids.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { SqlSandbox } from '../../core/traces/sandbox/sandbox.ts';
import { sandboxIsolation } from '../../core/traces/sandbox/spawn.ts';

const TOKEN = `control-${newId()}-secret`;

test('with the check off, the sandbox alone keeps files, the environment and the store out of reach', { timeout: 300_000 }, async (t) => {
  const isolation = sandboxIsolation();
  if (isolation !== 'bwrap' && isolation !== 'uid') {
    t.skip(isolation);
    return;
  }
  t.diagnostic(`isolation: ${isolation}`);
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-sandbox-test-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // A run directory's secrets: an admin-url and a token file, 0600 as rlstream writes them.
  const adminUrl = join(dir, 'admin-url');
  const tokenFile = join(dir, 'tokens');
  writeFileSync(adminUrl, `http://127.0.0.1:1/dashboard/#token=${TOKEN}\n`, { mode: 0o600 });
  writeFileSync(tokenFile, `control:${TOKEN}\n`, { mode: 0o600 });
  process.env['RLSTREAM_TEST_SECRET'] = TOKEN;
  t.after(() => delete process.env['RLSTREAM_TEST_SECRET']);
  const outside = [join(dir, 'written'), join(tmpdir(), `rlstream-sandbox-outfile-${newId()}`), `/dev/shm/rlstream-sandbox-outfile-${newId()}`];

  const chdbDir = join(dir, 'chdb');
  const store = await openTraceStore(`chdb:${chdbDir}`);
  let writes = 0;
  const sandbox = new SqlSandbox({ target: { kind: 'chdb' }, database: store.database, store: { dir: chdbDir, writes: () => writes }, check: false, memoryBytes: 256 << 20 });
  t.after(async () => {
    await sandbox.close();
    await store.close();
    for (const f of outside) rmSync(f, { force: true });
  });
  await store.insert('tool_calls', [{ run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: 'e', time: Date.now(), _version: 1 }]);
  writes++;

  const answers: string[] = [];
  const attempt = async (sql: string) => {
    try {
      const r = await sandbox.query(sql, { maxSeconds: 20 });
      answers.push(`${sql} => ${JSON.stringify(r.rows)}`);
      return JSON.stringify(r.rows);
    } catch (err) {
      answers.push(`${sql} => ${(err as Error).message}`);
      return null;
    }
  };
  // The sandbox answers at all (the check being off is not what makes the rest fail).
  assert.equal(await attempt('SELECT count() AS n FROM tool_calls'), '[{"n":1}]');
  const env = await attempt("SELECT splitByChar('\\0', file('/proc/self/environ')) AS e");
  assert.notEqual(env, null, 'file() itself runs in the sandbox (layer 1 is off)');
  // bubblewrap sets PWD (its --chdir); nothing else is there.
  const vars = (JSON.parse(env!) as { e: string[] }[])[0]!.e.filter((v) => v !== '' && !v.startsWith('PWD='));
  assert.deepEqual(vars, [], 'the sandbox process has an empty environment');
  for (const sql of [
    `SELECT file('${adminUrl}') AS s`,
    `SELECT file('${tokenFile}') AS s`,
    `SELECT * FROM file('${tokenFile}', 'LineAsString')`,
    `SELECT file('/proc/${process.pid}/environ') AS s`,
    `SELECT file('/proc/${process.ppid}/environ') AS s`,
    `SELECT file('/proc/1/environ') AS s`,
    `SELECT file('/proc/${process.pid}/cmdline') AS s`,
    "SELECT * FROM file('/proc/*/environ', 'LineAsString')",
    `SELECT * FROM file('${dir}/*', 'LineAsString')`,
  ]) {
    const r = await attempt(sql);
    assert.ok(r === null || !r.includes(TOKEN), `${sql}: ${r}`);
  }
  for (const [i, path] of outside.entries()) {
    await attempt(`SELECT ${i} AS a INTO OUTFILE '${path}' TRUNCATE FORMAT RawBLOB`);
    await attempt(`INSERT INTO FUNCTION file('${path}', 'RawBLOB') SELECT 'x'`);
    // Without bubblewrap (uid mode) the sandbox writes where every user may: its documented limit.
    if (isolation === 'uid' && i > 0) t.diagnostic(`uid mode, ${path} written: ${existsSync(path)}`);
    else assert.equal(existsSync(path), false, `${path} was not written`);
  }
  await attempt("INSERT INTO tool_calls (run_id, trajectory_id, call_id) VALUES ('x', 'y', 'z')");
  await attempt('DROP TABLE tool_calls');
  await attempt('SELECT 1; DROP TABLE tool_calls');
  assert.equal(Number((await store.query('SELECT count() AS n FROM tool_calls')).rows[0]!['n']), 1, 'the store is unchanged');
  assert.deepEqual(readdirSync(dir).sort(), ['admin-url', 'chdb', 'tokens']);

  // Past the process's memory limit (the engine's own limit set above it): that query fails, the next runs.
  const heavy = await sandbox.query('SELECT length(groupArray(number)) AS n FROM (SELECT number FROM system.numbers LIMIT 300000000)', { maxMemoryBytes: 8 * 2 ** 30, maxRowsToRead: 1e9, maxSeconds: 60 }).then(
    () => 'answered',
    (err: Error) => err.message,
  );
  t.diagnostic(`a query past the process limit: ${heavy}`);
  assert.notEqual(heavy, 'answered');
  assert.equal(await attempt('SELECT count() AS n FROM tool_calls'), '[{"n":1}]', 'the next query runs');
  for (const a of answers) assert.equal(a.includes(TOKEN), false, a);
});

test('the snapshot follows the store: each write is seen by the next query, also while inserts and merges run', { timeout: 300_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-sandbox-snapshot-'));
  const store = await openTraceStore(`chdb:${join(dir, 'chdb')}`);
  t.after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const row = (i: number) => ({ run_id: 'r', trajectory_id: `t${i}`, group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: `e${i}`, time: Date.now(), _version: 1 });
  const count = async () => Number((await store.queryReadonly('SELECT count() AS n FROM tool_calls FINAL')).rows[0]!['n']);
  // Write-then-read rounds: each query after a write gets a process of its own with a new snapshot.
  for (let i = 0; i < 10; i++) {
    await store.insert('tool_calls', [row(i)]);
    assert.equal(await count(), i + 1, `after insert ${i + 1}`);
  }
  // Inserts and a merge while queries snapshot the directory: every query answers, and never less than before.
  let written = 10;
  const writer = (async () => {
    for (let i = 10; i < 40; i++) {
      await store.insert('tool_calls', [row(i)]);
      written = i + 1;
      if (i % 10 === 0) await store.exec('OPTIMIZE TABLE tool_calls FINAL');
    }
  })();
  let last = 10;
  const seen: number[] = [];
  while (written < 40) {
    const before = written;
    const n = await count();
    assert.ok(n >= last && n >= before && n <= 40, `count ${n} after ${last} (written ${before})`);
    last = n;
    seen.push(n);
  }
  await writer;
  assert.equal(await count(), 40);
  t.diagnostic(`counts seen while writing: ${seen.join(' ')}`);
});
