// Trace TTL (traces.ttl_days): rows older than the TTL leave every trace table at the next merge. Every table
// has a `time` column (the event time), which the TTL reads. Table TTL came to ClickHouse in 19.6: chDB has it,
// the 18.16 server this project supports does not, so the config refuses ttl_days for a clickhouse store.
import { quoteIdent } from './sql.ts';
import { TRACE_TABLES, type TraceStore } from './store.ts';

/** Set (days) or remove (null) the TTL of every trace table; idempotent, run at every start. */
export async function applyTraceTtl(store: TraceStore, database: string, days: number | null): Promise<void> {
  for (const table of TRACE_TABLES) {
    const name = `${quoteIdent(database)}.${quoteIdent(table)}`;
    if (days === null) {
      const r = await store.query(`SELECT engine_full FROM system.tables WHERE database = '${database.replace(/'/g, "''")}' AND name = '${table}'`);
      if (/\bTTL\b/.test(String(r.rows[0]?.['engine_full'] ?? ''))) await store.exec(`ALTER TABLE ${name} REMOVE TTL`);
    } else await store.exec(`ALTER TABLE ${name} MODIFY TTL toDateTime(time) + toIntervalDay(${Math.trunc(days)})`);
  }
}
