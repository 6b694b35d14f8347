// Routes a record that cannot be processed to the dead-letter topic as a DeadLetter event: who gave up, where
// the record was, why, and its raw bytes, so it can be inspected and replayed. Sent through the caller's
// transaction when it has one, so the dead letter and the consumed offset commit together.
import type { DeadLetter } from '../schemas/generated/types.ts';
import { RlstreamError } from './errors.ts';
import { deriveId } from './ids.ts';
import type { LogRecord, ProduceRecord, Producer, Transaction } from './log/types.ts';
import type { EventSerde } from './serde/events.ts';
import { TOPICS } from './topics.ts';

/** Longest error text kept; stack-like messages from user code can be huge. */
const MAX_ERROR_CHARS = 4000;

export function errorCodeOf(err: unknown): string {
  return err instanceof RlstreamError ? err.code : 'INTERNAL';
}

function errorText(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  return text.length > MAX_ERROR_CHARS ? text.slice(0, MAX_ERROR_CHARS) + '…' : text;
}

/** The DeadLetter event for a record; its id is derived from consumer and position, so a replay repeats it. */
function deadLetterEvent(consumer: string, record: LogRecord, err: unknown, now = Date.now()): DeadLetter {
  return {
    event_id: deriveId('dead-letter', consumer, record.topic, record.partition, record.offset),
    time_ms: now,
    consumer,
    source_topic: record.topic,
    source_partition: record.partition,
    source_offset: record.offset,
    error_code: errorCodeOf(err),
    error: errorText(err),
    key: record.key,
    value: record.value,
  };
}

/** The record to send: keyed like the source (so a key's dead letters keep their order), with the reason in headers. */
function deadLetterRecord(serde: EventSerde, consumer: string, record: LogRecord, err: unknown, now = Date.now()): ProduceRecord {
  const event = deadLetterEvent(consumer, record, err, now);
  return {
    key: record.key,
    value: serde.encode('DeadLetter', event),
    headers: { 'rlstream-error-code': Buffer.from(event.error_code) },
  };
}

/** Send dead letters through a transaction (preferred: atomic with the offsets) or a plain producer. */
export async function sendDeadLetters(
  target: Transaction | Producer,
  serde: EventSerde,
  consumer: string,
  failures: { record: LogRecord; error: unknown }[],
  topic: string = TOPICS.deadLetter,
): Promise<void> {
  if (failures.length === 0) return;
  const now = Date.now();
  await target.send(topic, failures.map((f) => deadLetterRecord(serde, consumer, f.record, f.error, now)));
}
