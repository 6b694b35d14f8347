// Dead letters for damage the embedded log found on open: one DeadLetter per quarantined range, on the
// dead-letter topic when the log has one, so the loss shows where failed records are looked for (admin, replay)
// and not only in a warning. The log itself cannot encode events (it has no serde); the role that opens the log
// and the serde together sends them.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { deriveId } from '../../ids.ts';
import type { EventSerde } from '../../serde/events.ts';
import { TOPICS } from '../../topics.ts';
import type { EventLog } from '../types.ts';
import { fileKind } from './damage.ts';
import { EmbeddedLog } from './index.ts';

/** Bytes of a quarantine file carried in its dead letter; the file itself keeps them all. */
const MAX_VALUE_BYTES = 1024 * 1024;
const CONSUMER = 'embedded-log-recovery';

/** Send a DeadLetter for each range this open quarantined; returns how many were sent (0 on Kafka or without the topic). */
export async function sendDamageDeadLetters(log: EventLog, serde: EventSerde, topic: string = TOPICS.deadLetter): Promise<number> {
  if (!(log instanceof EmbeddedLog)) return 0;
  const found = log.damageReport().foundNow;
  if (found.length === 0 || !(await log.listTopics()).some((t) => t.name === topic)) return 0;
  const now = Date.now();
  const records = found.map((d) => {
    const dir = join(log.options.dir, 'topics', d.topic, String(d.partition));
    // A quarantine can be a whole directory moved aside (one that stood where a segment belongs): no bytes then.
    let bytes = d.quarantine && fileKind(join(dir, d.quarantine)) === 'file' ? readFileSync(join(dir, d.quarantine)) : Buffer.alloc(0);
    const cut = bytes.length > MAX_VALUE_BYTES;
    if (cut) bytes = bytes.subarray(0, MAX_VALUE_BYTES);
    const range = d.toOffset === null ? `offsets from ${d.fromOffset}` : `offsets ${d.fromOffset} to ${d.toOffset - 1}`;
    const where = d.quarantine ? `${d.bytes} bytes quarantined in ${join(dir, d.quarantine)}${cut ? ` (the first ${MAX_VALUE_BYTES} here)` : ''}` : `no bytes (${d.file})`;
    return {
      key: null,
      value: serde.encode('DeadLetter', {
        event_id: deriveId('dead-letter', CONSUMER, d.topic, d.partition, d.fromOffset),
        time_ms: now,
        consumer: CONSUMER,
        source_topic: d.topic,
        source_partition: d.partition,
        source_offset: d.fromOffset,
        error_code: 'LOG_CORRUPT',
        error: `${d.reason}: ${range} of ${d.topic}/${d.partition} lost; ${where}`,
        key: null,
        value: bytes,
      }),
      headers: { 'rlstream-error-code': Buffer.from('LOG_CORRUPT') },
    };
  });
  const producer = await log.producer();
  try {
    await producer.send(topic, records);
  } finally {
    await producer.close();
  }
  return records.length;
}
