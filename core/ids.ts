// Identifiers. Random ids for new facts; derived ids for results computed from other events, so that a
// replay or a retry produces the same id and every idempotent sink drops the duplicate.
import { createHash, randomUUID } from 'node:crypto';

export function newId(): string {
  return randomUUID();
}

/** A stable id from its parts: the same inputs always give the same id (32 hex chars). */
export function deriveId(...parts: (string | number)[]): string {
  const h = createHash('sha256');
  for (const p of parts) h.update(String(p)).update('\u0000');
  return h.digest('hex').slice(0, 32);
}
