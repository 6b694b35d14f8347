// A row whose key is not a column of its table is refused before anything is written, naming the table, the key
// and the column it was likely meant to be (and the table's columns), on chDB and on the ClickHouse server: the
// allowed set is what the engine describes. Before, a misspelt key was dropped on both insert paths and the column
// stored its default. Here: hand-written keys and a generated corpus (misspellings of every real column, case
// changes, extra keys) over every table's real rows (a synthetic run through rowsOf, as the sink writes them),
// each placed among accepted rows; the same real rows are then all accepted. The engine's own refusal behind it
// is shown with the check bypassed (insertRaw sends JSONEachRow lines unchecked), and the writer keeps the rows
// of a refused flush.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRlstreamError } from '../../core/errors.ts';
import { rng } from '../../core/random.ts';
import type { DecodedEvent } from '../../core/serde/events.ts';
import { checkRowKeys, nearestColumns, tableColumns, unknownKeyError } from '../../core/traces/columns.ts';
import { quoteString } from '../../core/traces/sql.ts';
import { TRACE_TABLES, toJsonEachRow, type Row, type TraceStore, type TraceTable } from '../../core/traces/store.ts';
import { rowsOf } from '../../consumers/traces/rows.ts';
import { TraceWriter } from '../../consumers/traces/writer.ts';
import { syntheticRun } from '../../testkit/synthetic-run.ts';
import { targets } from './targets.ts';

/** Real rows of every table the sink fills from events (dead_letters has none in a clean run). */
function realRows(): Map<TraceTable, Row[]> {
  const by = new Map<TraceTable, Row[]>();
  for (const ev of syntheticRun({ groups: 3, groupSize: 2, assistantTurns: 2, tokensPerTurn: 5, trajectoriesPerStep: 2, seed: 17 })) {
    for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as DecodedEvent)) (by.get(table) ?? by.set(table, []).get(table)!).push(row);
  }
  return by;
}

const LETTERS = 'abcdefghijklmnopqrstuvwxyz_0123456789';

/** A misspelling of `name`: one character deleted, inserted, changed or swapped with the next, or the case changed. */
function misspell(name: string, r: () => number): string {
  const i = Math.floor(r() * name.length);
  const c = LETTERS[Math.floor(r() * LETTERS.length)]!;
  switch (Math.floor(r() * 6)) {
    case 0:
      return name.slice(0, i) + name.slice(i + 1);
    case 1:
      return name.slice(0, i) + c + name.slice(i);
    case 2:
      return name.slice(0, i) + c + name.slice(i + 1);
    case 3:
      return i + 1 < name.length ? name.slice(0, i) + name[i + 1] + name[i] + name.slice(i + 2) : name + c;
    case 4:
      return name.toUpperCase();
    default:
      return name.slice(0, i) + name[i]!.toUpperCase() + name.slice(i + 1);
  }
}

/** Keys that are not columns of any table, by hand: near misses, separators, whitespace, prototype names, unicode. */
const HAND = ['', ' ', 'run_id ', ' run_id', 'run-id', 'run.id', 'runid', 'RUN_ID', 'Run_Id', 'rսn_id', 'run_id\u0000', '__proto__', 'constructor', 'toString', 'hasOwnProperty', '0', 'id', 'extra', 'é'];

interface BadRow {
  row: Row;
  key: string;
  /** The column a misspelt key came from (it must be named as the nearest). */
  from?: string;
}

/** The generated and hand-written bad rows of a table, each a real row with one key renamed or added. */
function corpus(columns: readonly string[], base: readonly Row[], seed: number): BadRow[] {
  const r = rng(seed);
  const real = new Set(columns);
  const out: BadRow[] = [];
  const pick = () => base[Math.floor(r() * base.length)]!;
  for (const from of columns) {
    for (let n = 0; n < 3; n++) {
      const key = misspell(from, r);
      if (real.has(key)) continue;
      // Renamed (the real key gone) or added beside the real one.
      const row = { ...pick() };
      const value = row[from];
      if (r() < 0.5) delete row[from];
      out.push({ row: Object.defineProperty(row, key, { value, enumerable: true, configurable: true, writable: true }), key, from });
    }
  }
  for (const key of HAND) {
    if (real.has(key)) continue;
    out.push({ row: Object.defineProperty({ ...pick() }, key, { value: 'x', enumerable: true, configurable: true, writable: true }), key });
  }
  for (let n = 0; n < 8; n++) {
    const key = Array.from({ length: 1 + Math.floor(r() * 12) }, () => LETTERS[Math.floor(r() * LETTERS.length)]).join('');
    if (!real.has(key)) out.push({ row: { ...pick(), [key]: r() < 0.5 ? null : 1 }, key });
  }
  // A key whose value is undefined is still a key; an inherited enumerable one is read as one.
  out.push({ row: { ...pick(), undefined_value: undefined }, key: 'undefined_value' });
  out.push({ row: Object.assign(Object.create({ inherited_key: 1 }) as Row, pick()), key: 'inherited_key' });
  return out;
}

test('the refusal names the table, the key, the nearest column and the columns', () => {
  const cols = tableColumns('t', [
    { name: 'run_id', type: 'String', default_type: '' },
    { name: 'token_ids', type: 'Array(UInt32)', default_type: '' },
    { name: 'trajectory_id', type: 'String', default_type: 'DEFAULT' },
    { name: 'n_tokens', type: 'UInt32', default_type: 'MATERIALIZED' },
  ]);
  assert.deepEqual(cols.insertable.map((c) => c.name), ['run_id', 'token_ids', 'trajectory_id']);
  assert.deepEqual(nearestColumns('Token_IDS', ['run_id', 'token_ids']), ['token_ids']);
  assert.deepEqual(nearestColumns('tokn_ids', ['run_id', 'token_ids']), ['token_ids']);
  assert.deepEqual(nearestColumns('trajcetory_id', ['run_id', 'trajectory_id']), ['trajectory_id']);
  assert.deepEqual(nearestColumns('completely_else', ['run_id', 'token_ids']), []);
  const e = unknownKeyError(cols, 'tokn_ids', 3);
  assert.equal(e.code, 'INPUT_INVALID');
  assert.equal(e.message, 'insert into t refused, nothing written: row 3 has key "tokn_ids", which is not a column of t (did you mean "token_ids"?); its columns: run_id, token_ids, trajectory_id');
  assert.match(unknownKeyError(cols, 'n_tokens').message, /a row has key "n_tokens", which is a MATERIALIZED column of t, which the engine computes/);
  assert.throws(() => checkRowKeys(cols, [{ run_id: 'a' }, { run_id: 'b', trajectory_idd: 'x' }]), /row 1 has key "trajectory_idd".*did you mean "trajectory_id"/);
  assert.doesNotThrow(() => checkRowKeys(cols, [{}, { run_id: 'a', token_ids: [1], trajectory_id: undefined }]));
});

const count = async (store: TraceStore, table: string): Promise<number> => Number((await store.query(`SELECT count() AS n FROM ${table}`)).rows[0]?.['n']);

for (const target of targets()) {
  test(`${target.name}: rows with a key that is not a column are refused before anything is written; every real row is accepted`, { skip: target.skip ?? false, timeout: 120_000 }, async () => {
    const store = await target.open('keys');
    try {
      const rows = realRows();
      let refused = 0;
      for (const [i, table] of TRACE_TABLES.entries()) {
        const base = rows.get(table);
        if (!base) continue;
        // What the engine itself says the table's columns are (not what the store cached).
        const columns = (await store.query(`SELECT name FROM system.columns WHERE database = ${quoteString(store.database)} AND table = ${quoteString(table)}`)).rows.map((r) => String(r['name']));
        const r = rng(100 + i);
        for (const bad of corpus(columns, base, 200 + i)) {
          // Among real rows, at a random place: the whole insert is refused.
          const batch = [...base];
          const at = Math.floor(r() * (batch.length + 1));
          batch.splice(at, 0, bad.row);
          await assert.rejects(
            store.insert(table, batch),
            (e: unknown) => {
              if (!isRlstreamError(e, 'INPUT_INVALID')) return false;
              const named = e.message.startsWith(`insert into ${table} refused, nothing written: row ${at} has key ${JSON.stringify(bad.key)}`) && e.message.endsWith(`its columns: ${columns.join(', ')}`);
              // A misspelling (one edit, or the case) names the column it came from as (one of) the nearest.
              const near = bad.from === undefined || e.message.includes(`did you mean "${bad.from}"`) || e.message.includes(`or "${bad.from}"`);
              assert.ok(named && near, `${table} ${JSON.stringify(bad.key)} (from ${bad.from}): ${e.message}`);
              return true;
            },
            `${table}: key ${JSON.stringify(bad.key)}`,
          );
          refused++;
        }
        assert.equal(await count(store, table), 0, `${table}: nothing written by refused inserts`);
        // The real rows, as the product writes them, are all accepted and stored.
        await store.insert(table, base);
        assert.equal(await count(store, table), base.length, `${table}: every real row stored`);
      }
      assert.ok(refused > 300, `refused ${refused} bad rows`);
      process.stderr.write(`# ${target.name}: ${refused} rows with a key that is not a column refused, ${[...rows.values()].reduce((n, x) => n + x.length, 0)} real rows of ${rows.size} tables accepted\n`);

      // A column the engine computes is a column of the table, but no row may carry it.
      await store.exec('CREATE TABLE computed_cols (a String, b String MATERIALIZED upper(a)) ENGINE = MergeTree ORDER BY a');
      await assert.rejects(store.insert('computed_cols' as TraceTable, [{ a: 'x', b: 'y' }]), (e: unknown) => isRlstreamError(e, 'INPUT_INVALID') && /key "b", which is a MATERIALIZED column of computed_cols/.test(e.message));
      await store.insert('computed_cols' as TraceTable, [{ a: 'x' }]);
      assert.deepEqual((await store.query('SELECT a, b FROM computed_cols')).rows, [{ a: 'x', b: 'X' }]);
    } finally {
      await store.close();
    }
  });

  test(`${target.name}: with the check bypassed (insertRaw), the engine itself refuses a field that is not a column`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('rawkeys');
    try {
      const turn = realRows().get('turns')![0]!;
      for (const key of ['tokn_ids', 'Text', 'extra']) {
        const lines = toJsonEachRow([{ ...turn, turn_index: 1 }, { ...turn, turn_index: 2, [key]: 'x' }]);
        await assert.rejects(store.insertRaw('turns', lines, 2), (e: unknown) => isRlstreamError(e, 'TRACE_STORE') && e.message.includes(key), key);
      }
      assert.equal(await count(store, 'turns'), 0);
      await store.insertRaw('turns', toJsonEachRow([{ ...turn, turn_index: 1 }]), 1);
      assert.equal(await count(store, 'turns'), 1);
    } finally {
      await store.close();
    }
  });

  test(`${target.name}: the trace writer's flush of a row with an unknown key is refused and keeps every row`, { skip: target.skip ?? false }, async () => {
    const store = await target.open('writerkeys');
    try {
      const turns = realRows().get('turns')!;
      const writer = new TraceWriter(store, { maxDelayMs: 60_000 });
      await writer.prepare(['turns']);
      for (const row of turns) writer.add('turns', row);
      writer.add('turns', { ...turns[0]!, turn_index: 99, tokens_ids: [1] });
      await assert.rejects(writer.flush(), (e: unknown) => isRlstreamError(e, 'INPUT_INVALID') && /turns refused.*"tokens_ids".*did you mean "token_ids"/.test(e.message));
      assert.equal(await count(store, 'turns'), 0);
      assert.equal(writer.pending, turns.length + 1, 'every row kept for the next attempt');
    } finally {
      await store.close();
    }
  });
}
