// The admin SQL route's guard: core/traces/sql-guard.ts (which every store's queryReadonly applies too), with
// its verdict mapped to the route's stable codes before the store is asked at all: what would reach outside the
// trace tables is ADM_ERR_SQL_REFUSED (403), a clause the route cannot answer (FORMAT) ADM_ERR_SQL_INVALID (400).
import { readonlySqlVerdict } from '../core/traces/sql-guard.ts';
import { AdminError } from './errors.ts';

export { blankLiteralsAndComments } from '../core/traces/sql-guard.ts';

/** Throws ADM_ERR_SQL_REFUSED or ADM_ERR_SQL_INVALID for SQL the route must not run. */
export function guardReadonlySql(sql: string): void {
  const verdict = readonlySqlVerdict(sql);
  if (!verdict) return;
  throw new AdminError(verdict.kind === 'refused' ? 'ADM_ERR_SQL_REFUSED' : 'ADM_ERR_SQL_INVALID', { detail: verdict.why });
}
