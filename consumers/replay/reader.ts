// Reads a fixed range of a log, partition by partition positions, with a private consumer group that never
// commits (a replay must not move anyone's offsets). Records past a partition's end are dropped, so the
// replay reads exactly the resolved range even while producers keep appending.
import { RlstreamError } from '../../core/errors.ts';
import type { EventLog, LogRecord, RecordChunk } from '../../core/log/types.ts';
import type { PartitionRange } from './range.ts';

export interface ReadOptions {
  batchRecords?: number;
  /** Checked between polls. */
  cancelled?: () => boolean;
  /** Give up when no record arrives for this long while records are still due (default 30 s). */
  stallMs?: number;
}

/**
 * Read the ranges, handing over what was read: as LogRecords to `onBatch`, or, where the log can (the embedded
 * log) and `onChunks` is given, as chunks of frames read in place, trimmed to the ranges. onChunks must keep
 * nothing that refers to the chunks' bytes once it resolves: the log reads later records into them.
 */
export async function readRange(
  log: EventLog,
  ranges: readonly PartitionRange[],
  groupId: string,
  onBatch: (records: LogRecord[]) => Promise<void>,
  options: ReadOptions = {},
  onChunks?: (chunks: RecordChunk[]) => Promise<void>,
): Promise<void> {
  const todo = ranges.filter((r) => r.end > r.start);
  if (todo.length === 0) return;
  const topics = [...new Set(todo.map((r) => r.topic))];
  const consumer = await log.consumer({ groupId, topics, fromBeginning: true });
  try {
    const endOf = new Map<string, number>();
    const position = new Map<string, number>();
    for (const r of ranges) endOf.set(`${r.topic}/${r.partition}`, r.end);
    // Kafka assigns partitions once the group is joined, which happens inside poll: poll (and discard) until
    // every partition of the range is ours, then seek. The embedded log assigns at once.
    const wanted = new Set(todo.map((r) => `${r.topic}/${r.partition}`));
    const deadline = Date.now() + (options.stallMs ?? 30_000);
    while ([...wanted].some((k) => !consumer.assignment().some((a) => `${a.topic}/${a.partition}` === k))) {
      if (Date.now() > deadline) throw new RlstreamError('LOG_UNAVAILABLE', `replay: partitions ${[...wanted].join(', ')} were not assigned in time`);
      await consumer.poll({ maxRecords: 1, timeoutMs: 200 });
    }
    for (const r of todo) {
      await consumer.seek(r.topic, r.partition, r.start);
      position.set(`${r.topic}/${r.partition}`, r.start);
    }
    const remaining = () => [...position].some(([k, p]) => p < (endOf.get(k) ?? 0));
    let lastProgress = Date.now();
    while (remaining()) {
      if (options.cancelled?.()) return;
      const poll = { maxRecords: options.batchRecords ?? 2_000, timeoutMs: 200 };
      let kept = 0;
      let hand: () => Promise<void>;
      if (onChunks && consumer.pollChunks) {
        const chunks: RecordChunk[] = [];
        const polled = await consumer.pollChunks(poll);
        for (const c of polled) {
          const k = `${c.topic}/${c.partition}`;
          const end = endOf.get(k);
          if (end === undefined || !position.has(k)) continue;
          // A chunk's records have consecutive offsets: the range's end cuts it at one place.
          const head = c.head(end - c.firstOffset);
          if (head.count === 0) continue;
          chunks.push(head);
          position.set(k, c.firstOffset + head.count);
          kept += head.count;
        }
        // onChunks is done with the bytes when it resolves: the log may read into them again.
        hand = () => onChunks(chunks).then(() => consumer.releaseChunks?.(polled));
      } else {
        const keep: LogRecord[] = [];
        for (const rec of await consumer.poll(poll)) {
          const k = `${rec.topic}/${rec.partition}`;
          const end = endOf.get(k);
          if (end === undefined || !position.has(k) || rec.offset >= end) continue;
          keep.push(rec);
          position.set(k, rec.offset + 1);
        }
        kept = keep.length;
        hand = () => onBatch(keep);
      }
      // Read positions can pass offsets that hold no readable record (transaction markers, aborted records).
      for (const a of consumer.assignment()) {
        const k = `${a.topic}/${a.partition}`;
        if (position.has(k) && a.offset > position.get(k)!) position.set(k, a.offset);
      }
      if (kept > 0) {
        lastProgress = Date.now();
        await hand();
      } else if (Date.now() - lastProgress > (options.stallMs ?? 30_000)) {
        throw new RlstreamError('LOG_UNAVAILABLE', `replay stalled: no records for ${options.stallMs ?? 30_000} ms before the end of its range`);
      }
    }
  } finally {
    await consumer.close();
  }
}
