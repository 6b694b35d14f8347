// A read token cannot reach a control token, by any route. `rlstream admin` runs as a real process with both
// tokens in RLSTREAM_ADMIN_TOKENS and a run's admin-url (a control token) beside its log; then every
// documented GET route, every named query and the SQL route (file() on the environment, on the admin-url and
// on /proc, system tables) are called with the read token and without one, and no answer holds the control
// token. The variable is also gone from the process's environment, /proc/<pid>/environ included.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { recordRun, startAdmin } from './helpers.ts';

const READ = 'secrets-read-token-0123456789';
const CONTROL = 'secrets-control-token-9876543210';

test('no route gives a read token the control token', { timeout: 120_000 }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-admin-secrets-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const logDir = join(dir, 'log');
  const runId = await recordRun(logDir, 2);
  const adminUrl = join(dir, 'admin-url');
  writeFileSync(adminUrl, `http://127.0.0.1:1/dashboard/#token=${CONTROL}\n`, { mode: 0o600 });
  assert.equal(statSync(adminUrl).mode & 0o777, 0o600);

  const admin = await startAdmin(logDir, join(dir, 'traces'), `read:${READ},control:${CONTROL}`);
  const { url, pid } = admin;
  try {
    const environ = readFileSync(`/proc/${pid}/environ`);
    assert.equal(environ.includes(CONTROL), false, '/proc/<pid>/environ no longer holds the control token');
    assert.equal(environ.includes('RLSTREAM_ADMIN_TOKENS='), false);
    // The control token still works: it was read before it was removed.
    const ok = await fetch(`${url}/api/runs`, { headers: { authorization: `Bearer ${CONTROL}` } });
    assert.equal(ok.status, 200, await ok.text());

    const leaks: string[] = [];
    const serverErrors: string[] = [];
    const call = async (method: string, path: string, token: string | null, body?: unknown) => {
      const headers: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {};
      if (body !== undefined) headers['content-type'] = 'application/json';
      const res = await fetch(`${url}${path}`, { method, headers, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
      const text = await res.text();
      if (text.includes(CONTROL)) leaks.push(`${method} ${path} ${JSON.stringify(body ?? '')}`);
      if (res.status >= 500) serverErrors.push(`${method} ${path} ${res.status} ${text.slice(0, 200)}`);
      return { status: res.status, text };
    };

    const doc = JSON.parse((await call('GET', '/openapi.json', null)).text) as { paths: Record<string, Record<string, unknown>> };
    const fill = (p: string) => p.replace('{runId}', runId).replace(/\{[^}]+\}/g, 'x');
    let gets = 0;
    for (const [path, ops] of Object.entries(doc.paths)) {
      if (!('get' in ops)) continue;
      for (const token of [READ, null]) await call('GET', fill(path), token);
      gets++;
    }
    assert.ok(gets >= 10, `${gets} GET routes documented`);
    for (const page of ['/', '/dashboard/', '/docs', '/metrics', '/openapi.json']) await call('GET', page, READ);

    const named = JSON.parse((await call('GET', '/api/traces/queries', READ)).text) as { queries: { name: string; params: { name: string }[] }[] };
    for (const q of named.queries) {
      const params = Object.fromEntries(q.params.map((p) => [p.name, `' || file('${adminUrl}') || '`]));
      await call('POST', `/api/traces/queries/${q.name}`, READ, { params });
    }

    const probes = [
      "SELECT file('/proc/self/environ')",
      "SELECT splitByChar('\\0', file('/proc/self/environ'))",
      `SELECT file('/proc/${pid}/environ')`,
      `SELECT file('${adminUrl}')`,
      `SELECT * FROM file('${adminUrl}', 'LineAsString')`,
      "SELECT * FROM file('/proc/self/cmdline', 'LineAsString')",
      'SELECT * FROM system.settings',
      'SELECT * FROM system.server_settings',
      'SELECT * FROM system.processes',
      'SELECT * FROM system.query_log',
      "SELECT getServerSetting('user_files_path')",
      'SHOW PROCESSLIST',
    ];
    for (const sql of probes) {
      for (const token of [READ, null]) {
        const r = await call('POST', '/api/traces/sql', token, { sql });
        assert.ok(r.status === 401 || r.status === 403, `${sql} with ${token ? 'the read token' : 'no token'}: ${r.status} ${r.text.slice(0, 200)}`);
      }
    }
    assert.deepEqual(leaks, [], 'no answer holds the control token');
    assert.deepEqual(serverErrors, []);
    const { out, err } = admin.output();
    assert.equal(out.includes(CONTROL) || err.includes(CONTROL), false, 'nor does the process output');
  } finally {
    await admin.stop();
  }
});
