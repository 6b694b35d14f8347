// The adversarial corpus (sql-corpus.ts, over 300 spellings) against every target: chDB always and the
// ClickHouse server of CLICKHOUSE_URL, through the store's queryReadonly (what `rlstream query` calls) and, on
// chDB, through the admin SQL route with a read token. Each must be refused or answer with no secret (a token
// in a 0600 file and in this process's environment, /etc/passwd, an environment); no probe writes a file.
import { spawn } from 'node:child_process';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildAdminServer } from '../../admin/server.ts';
import { newId } from '../../core/ids.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { auth, fixture, READ_TOKEN, TOKENS } from '../admin/helpers.ts';
import { openTraceStore } from '../../core/traces/open.ts';
import { corpus } from './sql-corpus.ts';
import { targets } from './targets.ts';

const TOKEN = `corpus-${newId()}-token`;
const dir = mkdtempSync(join(tmpdir(), 'rlstream-sql-corpus-'));
const secret = join(dir, 'admin-url');
writeFileSync(secret, `http://127.0.0.1:1/dashboard/#token=${TOKEN}\n`, { mode: 0o600 });
process.env['RLSTREAM_ADMIN_TOKENS'] = `control:${TOKEN}`;
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
const outfiles: string[] = [];
const outfile = (i: number) => (outfiles[i] = join(i % 2 ? tmpdir() : dir, `outfile-${i}-${newId()}`));
const probes = corpus(secret, outfile);

/** Text that only a leak could put into an answer. */
function leaks(text: string): boolean {
  return text.includes(TOKEN) || text.includes('root:x:0:0') || /\bPATH=/.test(text) || text.includes('RLSTREAM_');
}

test('the corpus has at least 300 spellings', () => {
  assert.ok(probes.length >= 300, `${probes.length} probes`);
  assert.equal(new Set(probes.map((p) => p.sql)).size, probes.length, 'no duplicates');
});

async function runAll(run: (sql: string) => Promise<string>, t: { diagnostic(s: string): void }): Promise<void> {
  const failures: string[] = [];
  let refused = 0;
  let answered = 0;
  for (const p of probes) {
    const text = await run(p.sql).catch((err: Error) => `ERROR ${err.message}`);
    if (text.startsWith('ERROR ')) refused++;
    else answered++;
    if (leaks(text)) failures.push(`${p.what}: ${JSON.stringify(p.sql)} => ${text.slice(0, 200)}`);
  }
  t.diagnostic(`${probes.length} probes: ${refused} refused or failed, ${answered} answered (without a secret)`);
  assert.deepEqual(failures, []);
  assert.deepEqual(outfiles.filter((f) => f && existsSync(f)), [], 'no probe wrote a file');
}

for (const target of targets()) {
  test(`${target.name}: every probe is refused or answers without a secret (queryReadonly)`, { skip: target.skip ?? false, timeout: 600_000 }, async (t) => {
    const store: TraceStore = await target.open('corpus');
    t.after(() => store.close());
    await store.insert('tool_calls', [{ run_id: 'r', trajectory_id: 't', group_id: 'g', turn_index: 0, call_id: 'c', tool_name: 'calc', arguments_json: '{}', status: 'ok', result_text: '1', latency_ms: 1, reward: 0, metric_names: [], metric_values: [], event_id: 'e', time: Date.now(), _version: 1 }]);
    await runAll(async (sql) => JSON.stringify((await store.queryReadonly(sql, { maxSeconds: 5 })).rows), t);
    // The check names what it refused.
    await assert.rejects(store.queryReadonly(`SELECT file('${secret}')`), /function file\(\) is not on the reviewed list/);
  });
}

test('chdb: through the admin SQL route, every probe is a 4xx or answers without a secret', { timeout: 600_000 }, async (t) => {
  const f = await fixture({ traces: true });
  const app = await buildAdminServer(f.ctx, { tokens: TOKENS, env: {}, tail: false });
  t.after(async () => {
    await app.close();
    await f.close();
  });
  const statuses = new Map<number, number>();
  await runAll(async (sql) => {
    const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql } });
    statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
    if (res.statusCode >= 500) throw new Error(`${res.statusCode} ${res.body}`);
    return res.statusCode === 200 ? res.body : `ERROR ${res.body}`;
  }, t);
  t.diagnostic(`statuses: ${JSON.stringify(Object.fromEntries(statuses))}`);
  assert.deepEqual([...statuses.keys()].filter((s) => s >= 500), [], 'no probe is a server error');
  // A query that reads outside is refused by name, as a 403.
  const res = await app.inject({ method: 'POST', url: '/api/traces/sql', headers: auth(READ_TOKEN), payload: { sql: 'SELECT “file”(\'/etc/passwd\')' } });
  assert.equal(res.statusCode, 403, res.body);
  assert.match(res.body, /ADM_ERR_SQL_REFUSED.*file/);
});

const BIN = join(import.meta.dirname, '..', '..', 'bin', 'rlstream.js');

/** `rlstream query --store <store> --format json <sql>` as a real process, with a token in its environment. */
function cli(store: string, sql: string): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [BIN, 'query', '--store', store, '--format', 'json', sql], { env: { ...process.env, RLSTREAM_ADMIN_TOKENS: `control:${TOKEN}` }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    child.on('exit', (code) => resolve({ code, out }));
  });
}

// A sample (every 50th probe and the issue's own spellings): a process per probe costs seconds.
const SAMPLE = [
  ...probes.filter((_p, i) => i % 50 === 0).map((p) => p.sql),
  `SELECT “file”('${secret}')`,
  `SELECT $$'$$ AS a, file('${secret}') -- '`,
  `SELECT /* /* */ ' */ file('${secret}') -- '`,
  `SELECT file\u00a0('${secret}')`,
  `SELECT a FROM (SELECT $$X$$ AS a, $$'$$ AS b) INTO OUTFILE '${outfile(4000)}' TRUNCATE FORMAT RawBLOB -- '`,
];

for (const target of targets()) {
  test(`${target.name}: rlstream query refuses the sample or answers without a secret`, { skip: target.skip ?? false, timeout: 600_000 }, async (t) => {
    const url = process.env['CLICKHOUSE_URL'];
    let store: string;
    if (target.name === 'chdb') {
      store = `chdb:${join(dir, 'cli-chdb')}`;
      const s = await openTraceStore(store);
      await s.close();
    } else {
      store = `${url}#corpus_cli_${process.pid}`;
      const s = await openTraceStore(store);
      t.after(async () => {
        const again = await openTraceStore(store, { migrate: false });
        await again.exec(`DROP DATABASE IF EXISTS corpus_cli_${process.pid}`);
        await again.close();
      });
      await s.close();
    }
    const leaked: string[] = [];
    let refused = 0;
    for (const sql of SAMPLE) {
      const r = await cli(store, sql);
      if (r.code !== 0) refused++;
      if (leaks(r.out)) leaked.push(`${JSON.stringify(sql)} => ${r.out.slice(0, 200)}`);
    }
    t.diagnostic(`${SAMPLE.length} probes through rlstream query: ${refused} refused (exit code not 0)`);
    assert.deepEqual(leaked, []);
    assert.deepEqual(outfiles.filter((f) => f && existsSync(f)), [], 'no probe wrote a file');
    const ok = await cli(store, 'SELECT count() AS n FROM tool_calls');
    assert.equal(ok.code, 0, ok.out);
  });
}
