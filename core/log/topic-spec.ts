// What both logs accept as a topic to create: a name Kafka allows, a positive partition count, and retention limits
// that are positive integers, null (no limit) or absent (the log's default). Checked before anything is made.
import { RlstreamError } from '../errors.ts';
import type { TopicSpec } from './types.ts';

/** Kafka's legal topic names (the embedded log keeps the same rule, so a log can be copied either way). */
const TOPIC_NAME = /^[A-Za-z0-9._-]{1,249}$/;

export function checkTopicSpec(spec: TopicSpec): void {
  if (typeof spec.name !== 'string' || !TOPIC_NAME.test(spec.name)) throw new RlstreamError('INPUT_INVALID', `topic name ${JSON.stringify(spec.name)} must match ${TOPIC_NAME}`);
  if (!Number.isInteger(spec.partitions) || spec.partitions < 1) throw new RlstreamError('INPUT_INVALID', `topic ${spec.name}: partitions must be a positive integer, got ${spec.partitions}`);
  for (const field of ['maxAgeMs', 'maxBytes'] as const) {
    const v = spec.retention?.[field];
    if (v === undefined || v === null) continue;
    if (!Number.isSafeInteger(v) || v < 1) throw new RlstreamError('INPUT_INVALID', `topic ${spec.name}: retention.${field} must be a positive integer or null (no limit), got ${JSON.stringify(v)}`);
  }
}
