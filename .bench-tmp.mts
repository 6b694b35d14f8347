import { compileRowBinary, RowBinaryBuffer } from './core/traces/rowbinary.ts';
import { keyChecker, tableColumns } from './core/traces/columns.ts';
import { openTraceStore } from './core/traces/open.ts';
import { rowsOf } from './consumers/traces/rows.ts';
import { syntheticRun } from './testkit/synthetic-run.ts';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
const store = await openTraceStore(`chdb:${mkdtempSync(join(tmpdir(), 'b-'))}`, { database: 'b' });
const by = new Map<string, Record<string, unknown>[]>();
for (const ev of syntheticRun({ groups: 200, groupSize: 4, assistantTurns: 3, tokensPerTurn: 50, seed: 1 })) for (const { table, row } of rowsOf({ name: ev.name, value: ev.value, schemaId: 0 } as never)) (by.get(table) ?? by.set(table, []).get(table)!).push(row);
for (const table of ['turns', 'tool_calls', 'trajectories']) {
  const cols = tableColumns(table, (await store.query(`DESCRIBE TABLE ${table}`)).rows);
  const codec = compileRowBinary(table, cols.insertable, cols.computed)!;
  const check = keyChecker(cols);
  const rows = by.get(table)!;
  const out = new RowBinaryBuffer(1 << 26);
  const time = (f: () => void) => { for (let w = 0; w < 5; w++) f(); const t = process.hrtime.bigint(); for (let k = 0; k < 20; k++) f(); return Number(process.hrtime.bigint() - t) / 20 / rows.length; };
  const enc = time(() => { out.reset(); for (const r of rows) codec.append(out, r); });
  const chk = time(() => { for (const r of rows) check(r); });
  console.log(`${table}: ${rows.length} rows, ${cols.insertable.length} columns: append (with the key check) ${enc.toFixed(0)} ns/row, the key check alone ${chk.toFixed(0)} ns/row`);
}
await store.close();
