// The columns of a trace table as its engine reports them (DESCRIBE TABLE, asked once per table and kept until a
// migration changes tables), and the refusal of a row that carries a key which is not one of them. Both insert
// paths dropped such a key without a word: the RowBinary codec reads only the columns it knows, and JSONEachRow
// skips unknown fields on chDB (the engine's default there), so a misspelt column stored its default. The allowed
// set is what the engine said, never a list kept here.
import { RlstreamError } from '../errors.ts';
import type { Row } from './store.ts';

export interface ColumnSpec {
  name: string;
  type: string;
}

/** Column kinds an INSERT does not write: the engine computes them (or, EPHEMERAL, takes them only to compute others). */
const NOT_INSERTED = new Set(['MATERIALIZED', 'ALIAS', 'EPHEMERAL']);

export interface TableColumns {
  table: string;
  /** The columns an INSERT writes, in table order: the only keys a row may carry. */
  insertable: ColumnSpec[];
  /** The other columns of the table, name → its kind (MATERIALIZED, ALIAS, EPHEMERAL). */
  computed: ReadonlyMap<string, string>;
}

/** A table's columns from the rows of DESCRIBE TABLE (name, type, default_type, ...). */
export function tableColumns(table: string, describe: readonly Row[]): TableColumns {
  const insertable: ColumnSpec[] = [];
  const computed = new Map<string, string>();
  for (const r of describe) {
    const kind = String(r['default_type'] ?? '');
    if (NOT_INSERTED.has(kind)) computed.set(String(r['name']), kind);
    else insertable.push({ name: String(r['name']), type: String(r['type']) });
  }
  return { table, insertable, computed };
}

/** Edit distance (insertions, deletions, substitutions, adjacent swaps), for naming the column a key was meant to be. */
function distance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

/** The columns nearest to `key`: a match but for case first, else those at the smallest edit distance (at most a third of the key). */
export function nearestColumns(key: string, names: readonly string[]): string[] {
  const lower = key.toLowerCase();
  const byCase = names.filter((n) => n.toLowerCase() === lower);
  if (byCase.length > 0) return byCase;
  let best = Math.max(2, Math.ceil(key.length / 3));
  let out: string[] = [];
  for (const n of names) {
    const dist = distance(lower, n.toLowerCase());
    if (dist < best) [best, out] = [dist, [n]];
    else if (dist === best) out.push(n);
  }
  return out;
}

/** The refusal of a row whose key `key` is not a column an INSERT into the table writes. */
export function unknownKeyError(cols: TableColumns, key: string, row?: number): RlstreamError {
  const names = cols.insertable.map((c) => c.name);
  const kind = cols.computed.get(key);
  const near = nearestColumns(key, names);
  const why =
    kind !== undefined
      ? `is a ${kind} column of ${cols.table}, which the engine computes: a row may not carry it`
      : `is not a column of ${cols.table}${near.length > 0 ? ` (did you mean ${near.map((n) => JSON.stringify(n)).join(' or ')}?)` : ''}`;
  const at = row === undefined ? 'a row' : `row ${row}`;
  return new RlstreamError('INPUT_INVALID', `insert into ${cols.table} refused, nothing written: ${at} has key ${JSON.stringify(key)}, which ${why}; its columns: ${names.join(', ')}`);
}

/**
 * A check of one row's keys against the table's insertable columns: throws unknownKeyError for the first key that
 * is not one (own or inherited enumerable keys, whatever their value, undefined included). On the encoders' path:
 * rows of one table mostly come with the same keys in the same order, so a row whose own keys are those of the
 * last row accepted is accepted by comparing them (a third to a half of what a lookup of every key cost).
 */
export function keyChecker(cols: TableColumns): (row: Row, index?: number) => void {
  const allowed = new Set(cols.insertable.map((c) => c.name));
  let accepted: string[] = [];
  return (row, index) => {
    const proto = Object.getPrototypeOf(row) as unknown;
    if (proto !== Object.prototype && proto !== null) {
      // Enumerable keys it inherits are read as its keys too.
      for (const k in row) if (!allowed.has(k)) throw unknownKeyError(cols, k, index);
      return;
    }
    const keys = Object.keys(row);
    if (keys.length === accepted.length) {
      let i = 0;
      while (i < keys.length && keys[i] === accepted[i]) i++;
      if (i === keys.length) return;
    }
    for (const k of keys) if (!allowed.has(k)) throw unknownKeyError(cols, k, index);
    accepted = keys;
  };
}

/** Every row's keys, before anything is written: throws for the first key that is not an insertable column. */
export function checkRowKeys(cols: TableColumns, rows: readonly Row[]): void {
  const check = keyChecker(cols);
  for (let i = 0; i < rows.length; i++) check(rows[i]!, i);
}

/** Per-table columns, from DESCRIBE TABLE on first use; reset after migrations change tables. */
export class ColumnCache {
  private readonly cache = new Map<string, Promise<TableColumns>>();

  constructor(private readonly describe: (table: string) => Promise<readonly Row[]>) {}

  get(table: string): Promise<TableColumns> {
    let p = this.cache.get(table);
    if (!p) {
      p = this.describe(table).then((rows) => tableColumns(table, rows));
      this.cache.set(table, p);
      // A failed DESCRIBE (a table not created yet) is asked again next time.
      p.catch(() => this.cache.delete(table));
    }
    return p;
  }

  reset(): void {
    this.cache.clear();
  }
}
