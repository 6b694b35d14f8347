// Trace store on chDB and on the ClickHouse server: literal escaping round-trips through the engine,
// migrations are idempotent and recorded, times survive per dialect, and the read-only SQL route is
// enforced by the engine (writes, DDL, SET, table functions refused; row limits hold).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRlstreamError } from '../../core/errors.ts';
import { bind, literal, quoteIdent, quoteString } from '../../core/traces/sql.ts';
import { loadMigrations, splitStatements } from '../../core/traces/migrate.ts';
import { TRACE_TABLES } from '../../core/traces/store.ts';
import { targets } from './targets.ts';

const NASTY = [
  '',
  "it's",
  'back\\slash',
  "\\'; DROP TABLE turns; --",
  "x' OR '1'='1",
  'line\nbreak\r\ttab',
  'nul\u0000byte',
  'bell\u0007 esc\u001b del\u007f',
  'unicode: λ 字 🙂',
  "trailing backslash \\",
  "{run:String} looks like a placeholder",
];

test('literal helpers validate their input', () => {
  assert.equal(quoteString("a'b"), "'a\\'b'");
  assert.equal(literal('UInt64', '42'), '42');
  assert.equal(literal('Int64', -7), '-7');
  assert.throws(() => literal('UInt64', '-1'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
  assert.throws(() => literal('UInt64', '1; DROP TABLE x'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
  assert.throws(() => literal('Int64', '99999999999999999999'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
  assert.throws(() => literal('Float64', 'NaN'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
  assert.throws(() => quoteIdent('a`b'), (e) => isRlstreamError(e, 'INPUT_INVALID'));
  assert.throws(() => bind('SELECT {a:String}', {}), /missing parameter a/);
  // A value that looks like a placeholder is data, not a second substitution.
  assert.equal(bind('SELECT {a:String}, {b:UInt64}', { a: '{b:UInt64}', b: 3 }), "SELECT '{b:UInt64}', 3");
});

test('migration files split into statements and both dialects define every table', () => {
  assert.deepEqual(splitStatements('-- c\nA;\nB\n;\n\nC'), ['A', 'B', 'C']);
  for (const dialect of ['current', 'compat-18'] as const) {
    const sql = loadMigrations(dialect).flatMap((m) => m.statements).join('\n');
    for (const t of TRACE_TABLES) assert.match(sql, new RegExp(`CREATE TABLE IF NOT EXISTS ${t} \\(`), `${dialect} lacks ${t}`);
    if (dialect === 'compat-18') assert.doesNotMatch(sql, /LowCardinality|DateTime64|CODEC|TTL/);
  }
});

for (const target of targets()) {
  test(`${target.name}: escaped literals read back exactly`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('esc');
    try {
      for (const s of NASTY) {
        const r = await store.query(`SELECT ${quoteString(s)} AS v, length(${quoteString(s)}) AS n`);
        assert.equal(r.rows[0]?.['v'], s, `round trip of ${JSON.stringify(s)}`);
        assert.equal(r.rows[0]?.['n'], Buffer.byteLength(s), `byte length of ${JSON.stringify(s)}`);
      }
      const big = await store.query(`SELECT ${literal('UInt64', '18446744073709551615')} AS v`);
      assert.equal(String(big.rows[0]?.['v']), '18446744073709552000');
    } finally {
      await store.close();
    }
  });

  test(`${target.name}: migrations are applied once and recorded`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('mig');
    try {
      const again = await store.migrate();
      assert.deepEqual(again.applied, []);
      const all = loadMigrations(store.dialect);
      assert.ok(all.length >= 2);
      assert.deepEqual(again.skipped, all.map((m) => `${String(m.version).padStart(4, '0')}_${m.name}`));
      const rows = (await store.query('SELECT version, dialect FROM schema_migrations ORDER BY version')).rows;
      assert.deepEqual(rows, all.map((m) => ({ version: m.version, dialect: store.dialect })));
      const cols = (await store.query(`SELECT name FROM system.columns WHERE database = ${quoteString(store.database)} AND table = 'train_steps'`)).rows.map((r) => r['name']);
      assert.ok(cols.includes('dropped_trajectory_ids'), 'migration 0002 added dropped_trajectory_ids');
      if (store.dialect === 'current') {
        const codecs = await store.query(
          `SELECT table, name, compression_codec AS codec FROM system.columns WHERE database = ${quoteString(store.database)} AND ((table = 'turns' AND name = 'token_ids') OR (table = 'trajectories' AND name = 'response_ids') OR (table = 'advantages' AND name = 'advantages')) ORDER BY table`,
        );
        // 0003 moved the busiest tables' big columns to LZ4 and left the others on ZSTD.
        assert.deepEqual(
          codecs.rows.map((r) => `${r['table']}.${r['name']} ${r['codec']}`),
          ['advantages.advantages CODEC(ZSTD(1))', 'trajectories.response_ids CODEC(LZ4)', 'turns.token_ids CODEC(LZ4)'],
        );
        // 0004: the busy tables' insert-sized parts are Compact (one data file), merged parts above 128 MiB Wide.
        const settings = await store.query(
          `SELECT name, engine_full FROM system.tables WHERE database = ${quoteString(store.database)} AND name IN ('turns', 'trajectories', 'train_steps') ORDER BY name`,
        );
        assert.deepEqual(
          settings.rows.map((r) => `${r['name']} ${/min_bytes_for_wide_part = (\d+)/.exec(String(r['engine_full']))?.[1] ?? 'default'}`),
          ['train_steps default', 'trajectories 134217728', 'turns 134217728'],
        );
      }
      const tables = (await store.query(`SELECT name FROM system.tables WHERE database = ${quoteString(store.database)} ORDER BY name`)).rows.map((r) => r['name']);
      for (const t of TRACE_TABLES) assert.ok(tables.includes(t), `table ${t} exists`);
      if (target.name === 'server') assert.equal(store.dialect, /^18\./.test(String((await store.query('SELECT version() AS v')).rows[0]?.['v'])) ? 'compat-18' : 'current');
    } finally {
      await store.close();
    }
  });

  test(`${target.name}: event times keep their instant; duplicates collapse under FINAL`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('time');
    try {
      const t = Date.UTC(2026, 10, 21, 12, 34, 56, 789);
      const row = { run_id: 'r', command: 'pause', staleness_bound: null, reason: '', issued_by: '', event_id: 'e1', time: t, _version: t };
      await store.insert('control', [row]);
      await store.insert('control', [row]);
      const r = await store.query('SELECT toUnixTimestamp(time) AS s, count() AS n FROM control FINAL GROUP BY s');
      assert.deepEqual(r.rows, [{ s: Math.floor(t / 1000), n: 1 }]);
    } finally {
      await store.close();
    }
  });

  test(`${target.name}: the read-only route is refused writes, DDL and SET by the engine, and limited`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('ro');
    try {
      await store.insert('control', [{ run_id: 'r', command: 'stop', staleness_bound: 3, reason: '', issued_by: '', event_id: 'e', time: 1, _version: 1 }]);
      const refused = [
        "INSERT INTO control (run_id, command, event_id) VALUES ('x', 'stop', 'y')",
        'CREATE TABLE evil (a UInt8) ENGINE = Memory',
        'DROP TABLE control',
        'ALTER TABLE control DELETE WHERE 1',
        'TRUNCATE TABLE control',
        'SET readonly = 0',
        'SET max_result_rows = 0',
        'SELECT 1; DROP TABLE control',
        'SELECT count() FROM control SETTINGS readonly = 0',
        'SELECT number FROM system.numbers LIMIT 100 SETTINGS max_result_rows = 0',
        "SELECT * FROM file('/etc/passwd', 'TSV', 'a String')",
      ];
      for (const sql of refused) {
        await assert.rejects(store.queryReadonly(sql, { maxRows: 10 }), (e) => isRlstreamError(e, 'TRACE_STORE'), `refused: ${sql}`);
      }
      // Nothing changed.
      assert.deepEqual((await store.query('SELECT count() AS n FROM control')).rows, [{ n: 1 }]);
      assert.deepEqual((await store.queryReadonly('SELECT count() AS n FROM control')).rows, [{ n: 1 }]);
      // Row limits are the engine's: an over-long result fails in 'throw' mode and is cut in 'break' mode.
      await assert.rejects(store.queryReadonly('SELECT number FROM system.numbers LIMIT 100000', { maxRows: 1000 }), /Limit for result exceeded/);
      const cut = await store.queryReadonly('SELECT number FROM system.numbers LIMIT 100000', { maxRows: 1000, overflow: 'break' });
      assert.ok(cut.rows.length >= 1000 && cut.rows.length < 100000, `break mode cut the result (${cut.rows.length} rows)`);
      // Rows to read unbounded here, so that the time limit is the one that stops the count.
      await assert.rejects(store.queryReadonly('SELECT count() FROM system.numbers', { maxSeconds: 1, maxRowsToRead: 1e15 }), /Timeout|time/i);
      // After refusals the route still answers.
      assert.deepEqual((await store.queryReadonly('SELECT 1 AS one')).rows, [{ one: 1 }]);
    } finally {
      await store.close();
    }
  });
}
