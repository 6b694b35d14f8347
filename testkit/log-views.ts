// Views of an EventLog that lie in one controlled way, for tests of what readers do when the log misleads them.
import type { EventLog } from '../core/log/types.ts';

/** The log with `topic`'s end listed `extra` records past what it holds: a read to that end cannot finish. */
export function listingPastTheEnd(log: EventLog, topic: string, extra: number): EventLog {
  return new Proxy(log, {
    get: (t, p) =>
      p === 'offsets'
        ? async (name: string) => (await t.offsets(name)).map((o) => (name === topic ? { ...o, high: o.high + extra } : o))
        : (Reflect.get(t, p) as unknown),
  });
}
