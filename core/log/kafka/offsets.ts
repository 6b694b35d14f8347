// Offsets a caller hands to a Kafka client (a commit, or offsets committed in a transaction), checked alike by
// both clients before any reaches the broker.
import { RlstreamError } from '../../errors.ts';
import type { TopicPartitionOffset } from '../types.ts';

/** Each offset a non-negative integer. */
export function checkOffsets(offsets: readonly TopicPartitionOffset[]): void {
  for (const o of offsets) {
    if (!Number.isInteger(o.offset) || o.offset < 0) throw new RlstreamError('INPUT_INVALID', `offset for ${o.topic}/${o.partition} must be a non-negative integer, got ${o.offset}`);
  }
}

