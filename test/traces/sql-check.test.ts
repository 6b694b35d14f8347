// The allow-lists against the engine: every reviewed function exists in chDB's system.functions under that
// canonical name (a typo would allow nothing, a renamed function would silently vanish), and every named query
// passes the check on each target (they run checked, with a user's parameters bound, even hostile ones).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Session, drainPending } from 'chdb';
import { listNamedQueries, runNamed } from '../../core/traces/queries.ts';
import { SqlRefusedError } from '../../core/traces/sql-check.ts';
import { ALLOWED_FUNCTIONS } from '../../core/traces/sql-functions.ts';
import { targets } from './targets.ts';

test('every allowed function is a canonical name of the engine', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-functions-'));
  const s = new Session(dir);
  try {
    const rows = JSON.parse((await s.queryAsync('SELECT name, alias_to FROM system.functions', { format: 'JSONCompact' })).text()).data as [string, string][];
    const canonical = new Set(rows.filter(([, alias]) => alias === '').map(([name]) => name));
    const missing = [...ALLOWED_FUNCTIONS].filter((n) => n !== 'lambda' && !canonical.has(n));
    assert.deepEqual(missing, []);
    assert.ok(ALLOWED_FUNCTIONS.size > 1000, `${ALLOWED_FUNCTIONS.size} functions`);
    for (const forbidden of ['file', 'url', 'getSetting', 'getServerSetting', 'hostName', 'dictGet', 'joinGet', 'getMacro', 'filesystemAvailable', 'generateSerialID', 'naiveBayesClassifier']) {
      assert.equal(ALLOWED_FUNCTIONS.has(forbidden), false, forbidden);
    }
  } finally {
    s.close();
    await drainPending();
    rmSync(dir, { recursive: true, force: true });
  }
});

const HOSTILE = "' || file('/etc/passwd') || '";

for (const target of targets()) {
  test(`${target.name}: every named query passes the check, with hostile parameters too`, { skip: target.skip ?? false, timeout: 300_000 }, async (t) => {
    const store = await target.open('named');
    t.after(() => store.close());
    const refused: string[] = [];
    for (const q of listNamedQueries()) {
      for (const hostile of [false, true]) {
        const params = Object.fromEntries(q.params.filter((p) => hostile || p.default === undefined).map((p) => [p.name, p.type === 'String' ? (hostile ? HOSTILE : 'x') : 1]));
        await runNamed(store, q.name, params, { maxSeconds: 10 }).catch((err: unknown) => {
          if (err instanceof SqlRefusedError) refused.push(`${q.name} ${JSON.stringify(params)}: ${err.message}`);
          else throw err;
        });
      }
    }
    assert.deepEqual(refused, []);
  });
}
