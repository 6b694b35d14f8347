// Records a synthetic run into an event log, as the live roles would: topics created, events encoded in
// Confluent framing with the log's registry, keyed by group. `duplicateEvery` sends every n-th event twice
// (a producer retry), which every idempotent reader must absorb.
import type { EventLog } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { TOPICS } from '../core/topics.ts';
import type { EventName } from '../schemas/index.ts';
import type { EventTypes } from '../schemas/generated/types.ts';
import { syntheticRun, type SyntheticEvent, type SyntheticRunOptions } from './synthetic-run.ts';

export interface Recorded {
  /** The synthetic events, in order (empty when not kept). */
  events: SyntheticEvent[];
  /** Records sent, duplicates included. */
  sent: number;
  /** Bytes of encoded event values sent. */
  bytes: number;
}

/**
 * `keepEvents: false` keeps only the counts, so a run of millions of events (the traces benchmark) is encoded
 * and sent in chunks without being held in memory.
 */
export async function recordRun(log: EventLog, serde: EventSerde, run: SyntheticRunOptions, duplicateEvery = 0, keepEvents = true, createTopics = true): Promise<Recorded> {
  // createTopics false: the log already has them (a run's context makes the contract's topics).
  if (createTopics) for (const name of Object.values(TOPICS)) if (name !== TOPICS.schemas) await log.createTopic({ name, partitions: name === TOPICS.rolloutEvents ? 3 : 1 });
  const producer = await log.producer();
  const out: Recorded = { events: [], sent: 0, bytes: 0 };
  let i = 0;
  let batches = new Map<string, { key: string | null; value: Buffer; timestamp: number }[]>();
  let buffered = 0;
  const sendBuffered = async () => {
    for (const [topic, records] of batches) for (let k = 0; k < records.length; k += 500) await producer.send(topic, records.slice(k, k + 500));
    batches = new Map();
    buffered = 0;
  };
  for (const e of syntheticRun(run)) {
    if (keepEvents) out.events.push(e);
    const value = serde.encode(e.name as EventName, e.value as EventTypes[EventName]);
    const rec = { key: e.key, value, timestamp: (e.value as { time_ms?: number }).time_ms ?? Date.now() };
    const list = batches.get(e.topic) ?? [];
    list.push(rec);
    out.sent++;
    out.bytes += value.length;
    if (duplicateEvery > 0 && ++i % duplicateEvery === 0) {
      list.push(rec);
      out.sent++;
      out.bytes += value.length;
    }
    batches.set(e.topic, list);
    if (++buffered >= 2_000) await sendBuffered();
  }
  await sendBuffered();
  await producer.close();
  return out;
}
