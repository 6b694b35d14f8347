// Turns a ClickHouse failure of a user's query into a catalogue error: a refused write or setting change is
// ADM_ERR_SQL_REFUSED, a broken query ADM_ERR_SQL_INVALID, an exceeded row/byte/time limit ADM_ERR_SQL_LIMIT.
// ClickHouse (server and chDB) put `Code: <n>` and the error's name in their messages; both are matched.
import { SqlRefusedError } from '../core/traces/sql-check.ts';
import { AdminError } from './errors.ts';

// https://github.com/ClickHouse/ClickHouse/blob/master/src/Common/ErrorCodes.cpp (numbers stable since 18.x)
const REFUSED = new Set([164 /* READONLY */, 497 /* ACCESS_DENIED */, 446 /* FUNCTION_NOT_ALLOWED */]);
const LIMIT = new Set([158 /* TOO_MANY_ROWS */, 159 /* TIMEOUT_EXCEEDED */, 160 /* TOO_SLOW */, 173 /* CANNOT_ALLOCATE_MEMORY: the sandbox process's own limit */, 241 /* MEMORY_LIMIT_EXCEEDED */, 307 /* TOO_MANY_BYTES */, 394 /* QUERY_WAS_CANCELLED */, 396 /* TOO_MANY_ROWS_OR_BYTES */]);
const REFUSED_NAMES = /\b(READONLY|ACCESS_DENIED|FUNCTION_NOT_ALLOWED)\b|readonly mode|not allowed in readonly|read-only query refused:/i;
const LIMIT_NAMES = /\b(TOO_MANY_ROWS|TOO_MANY_BYTES|TOO_MANY_ROWS_OR_BYTES|TIMEOUT_EXCEEDED|TOO_SLOW|MEMORY_LIMIT_EXCEEDED|CANNOT_ALLOCATE_MEMORY|QUERY_WAS_CANCELLED)\b|Limit for (result|rows|bytes)|Timeout exceeded/i;

/** The first line of a ClickHouse message, without the stack trace and version banner. */
function shortMessage(message: string): string {
  const line = message.split('\n')[0] ?? message;
  return line.replace(/\s*\(version [^)]*\)\s*$/, '').slice(0, 500);
}

function messagesOf(err: unknown): string {
  const parts: string[] = [];
  let e: unknown = err;
  for (let depth = 0; e && depth < 4; depth++) {
    if (e instanceof Error) {
      parts.push(e.message);
      e = e.cause;
    } else {
      parts.push(String(e));
      break;
    }
  }
  return parts.join('\n');
}

/** A catalogue error for a failed user query, or null when the failure does not look like ClickHouse's. */
export function classifyQueryError(err: unknown): AdminError | null {
  // The check of the parsed tree (core/traces/sql-check.ts) names what it refused.
  if (err instanceof SqlRefusedError) return new AdminError(err.kind === 'refused' ? 'ADM_ERR_SQL_REFUSED' : 'ADM_ERR_SQL_INVALID', { detail: err.why }, { cause: err });
  const text = messagesOf(err);
  const m = /Code:\s*(\d+)/.exec(text);
  const code = m ? Number(m[1]) : null;
  const detail = shortMessage(err instanceof Error ? err.message : text);
  // The engine's code decides where there is one; the names only where a message carries no code.
  if (code !== null ? REFUSED.has(code) : REFUSED_NAMES.test(text)) return new AdminError('ADM_ERR_SQL_REFUSED', { detail }, { cause: err });
  if (code !== null ? LIMIT.has(code) : LIMIT_NAMES.test(text)) return new AdminError('ADM_ERR_SQL_LIMIT', { detail }, { cause: err });
  if (code !== null || /syntax error|unknown (table|identifier|function)|doesn't exist|does not exist/i.test(text)) {
    return new AdminError('ADM_ERR_SQL_INVALID', { detail }, { cause: err });
  }
  return null;
}
