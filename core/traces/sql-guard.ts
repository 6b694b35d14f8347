// A narrow second line behind the trace store's readonly=1: the few statements ClickHouse still runs in
// readonly mode that untrusted SQL must not. Writes, DDL, SET and table functions are refused by the engine;
// these are not (checked on chDB 26.7):
// - `... INTO OUTFILE 'path'`: chDB is client and server in one process, so it writes the file on this host;
// - `KILL QUERY`: readonly users may kill their own queries, and in chDB every session is the same user, so a
//   reader could kill the trace sink's inserts.
// Both stores' queryReadonly apply it (the server too, for symmetry), so every caller is covered: the admin SQL
// route, `rlstream query`, scripts. Literals, quoted identifiers and comments are blanked first, so text inside
// them never trips the check.
import { RlstreamError } from '../errors.ts';

/** The SQL with string literals, quoted identifiers and comments replaced by spaces. */
export function blankLiteralsAndComments(sql: string): string {
  let out = '';
  let i = 0;
  while (i < sql.length) {
    const c = sql[i]!;
    const next = sql[i + 1];
    if (c === '-' && next === '-') {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? sql.length : end;
      out += ' ';
    } else if (c === '/' && next === '*') {
      const end = sql.indexOf('*/', i + 2);
      i = end < 0 ? sql.length : end + 2;
      out += ' ';
    } else if (c === "'" || c === '"' || c === '`') {
      let j = i + 1;
      while (j < sql.length && sql[j] !== c) j += sql[j] === '\\' ? 2 : 1;
      i = j + 1;
      out += ' ';
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

const FORBIDDEN: [RegExp, string][] = [
  [/\bINTO\s+OUTFILE\b/i, 'INTO OUTFILE writes a file'],
  [/\bKILL\s+(QUERY|MUTATION)\b/i, 'KILL stops queries'],
];

/** Why readonly SQL must not run although readonly=1 would let it, or null when it may run. */
export function readonlySqlRefusal(sql: string): string | null {
  const text = blankLiteralsAndComments(sql);
  for (const [re, why] of FORBIDDEN) if (re.test(text)) return why;
  // One statement per request: chDB would run each of several (the server refuses them as a syntax error).
  if (/;\s*\S/.test(text)) return 'several statements in one query';
  return null;
}

/** Throws TRACE_STORE (as the engine's own read-only refusals do) for the statements readonly=1 lets through but untrusted SQL must not run. */
export function guardReadonlySql(sql: string): void {
  const why = readonlySqlRefusal(sql);
  if (why) throw new RlstreamError('TRACE_STORE', `read-only query refused: ${why}`);
}
