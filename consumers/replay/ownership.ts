// Whose records a log holds: the run ids in the first records of each partition of its event topics. A replay
// into a log that already holds records checks this before it adds any (see `rlstream replay --into log:`).
import { newId } from '../../core/ids.ts';
import type { EventLog } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import { eventTopics } from './job.ts';
import { readRange } from './reader.ts';

export interface LogOwnership {
  /** Records in the event topics. */
  records: number;
  /** Run ids found in the sampled records, sorted. */
  runIds: string[];
}

function runIdOf(value: unknown): string | null {
  const v = value as { run_id?: unknown; trajectory?: { run_id?: unknown } } | null;
  const id = v?.run_id ?? v?.trajectory?.run_id;
  return typeof id === 'string' ? id : null;
}

/** The records of a log's event topics and the run ids of up to `sample` records at the start of each partition. */
export async function logOwnership(log: EventLog, serde: EventSerde, sample = 20): Promise<LogOwnership> {
  const ranges = [];
  let records = 0;
  for (const topic of eventTopics((await log.listTopics()).map((t) => t.name))) {
    for (const p of await log.offsets(topic)) {
      records += p.high - p.low;
      if (p.high > p.low) ranges.push({ topic, partition: p.partition, start: p.low, end: Math.min(p.high, p.low + sample) });
    }
  }
  const runIds = new Set<string>();
  await readRange(log, ranges, `ownership-${newId()}`, async (batch) => {
    for (const r of batch) {
      try {
        const id = runIdOf((await serde.decode(r.value)).value);
        if (id !== null) runIds.add(id);
      } catch {
        // An undecodable record names no run; the others do.
      }
    }
  });
  return { records, runIds: [...runIds].sort() };
}
