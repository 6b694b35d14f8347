// The admin SQL route's guard: core/traces/sql-guard.ts (which every store's queryReadonly applies too), with
// its refusal mapped to the route's stable ADM_ERR_SQL_REFUSED before the store is asked at all.
import { readonlySqlRefusal } from '../core/traces/sql-guard.ts';
import { AdminError } from './errors.ts';

export { blankLiteralsAndComments } from '../core/traces/sql-guard.ts';

/** Throws ADM_ERR_SQL_REFUSED for the statements readonly=1 lets through but the route must not run. */
export function guardReadonlySql(sql: string): void {
  const why = readonlySqlRefusal(sql);
  if (why) throw new AdminError('ADM_ERR_SQL_REFUSED', { detail: why });
}
