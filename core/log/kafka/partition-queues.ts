// The records a Kafka consumer fetched and poll() has not yet handed over, one queue per partition, shared by
// both clients (./consumer.ts on kafkajs, ./librdkafka/consumer.ts). A client's fetch side pushes into it and
// wakes a waiting poll; poll waits for records (or its timeout, or the consumer's end) and takes up to its
// maximum round-robin over the partitions, so one busy partition cannot starve the others.
import { RlstreamError } from '../../errors.ts';
import type { LogRecord, PollOptions } from '../types.ts';

export const DEFAULT_MAX_RECORDS = 500;
export const DEFAULT_TIMEOUT_MS = 1000;

export const partitionKey = (topic: string, partition: number): string => `${topic}\u0000${partition}`;

/** A poll's maximum and wait, checked. */
export function pollLimits(options: PollOptions): { max: number; timeoutMs: number } {
  const max = options.maxRecords ?? DEFAULT_MAX_RECORDS;
  const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (!Number.isInteger(max) || max < 1) throw new RlstreamError('INPUT_INVALID', `poll maxRecords must be a positive integer, got ${max}`);
  return { max, timeoutMs };
}

export class PartitionQueues {
  private readonly queues = new Map<string, LogRecord[]>();
  private count = 0;
  private rotate = 0;
  private wake: (() => void) | null = null;

  /** Records queued in all partitions. */
  get size(): number {
    return this.count;
  }

  /** Records queued for one partition. */
  length(k: string): number {
    return this.queues.get(k)?.length ?? 0;
  }

  /** Appends a partition's records (in offset order) and wakes a waiting poll. */
  push(k: string, records: LogRecord[]): void {
    if (records.length === 0) return;
    const q = this.queues.get(k);
    if (q === undefined || q.length === 0) this.queues.set(k, records);
    else for (const r of records) q.push(r);
    this.count += records.length;
    this.notify();
  }

  /** Drops a partition's queue (a seek); returns how many records it held. */
  drop(k: string): number {
    const n = this.length(k);
    this.queues.delete(k);
    this.count -= n;
    return n;
  }

  /** Drops every queue (a new assignment). */
  clear(): void {
    this.queues.clear();
    this.count = 0;
  }

  /** Ends a wait early: records came, or the consumer failed or closed. */
  notify(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /**
   * Waits until a record is queued, `stop()` holds or `timeoutMs` passed. Wake-ups without records (a join, a
   * seek) do not end the wait: an empty poll waits its full time.
   */
  async wait(timeoutMs: number, stop: () => boolean): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.count === 0 && !stop()) {
      const left = deadline - Date.now();
      if (left <= 0) return;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => {
          if (this.wake === done) this.wake = null;
          resolve();
        }, left);
        this.wake = done;
      });
    }
  }

  /**
   * Takes up to `max` records, starting one partition further each call. `taken` hears of each partition
   * taken from: its key, the last record taken and how many records it still holds.
   */
  take(max: number, taken: (k: string, last: LogRecord, left: number) => void): LogRecord[] {
    let out: LogRecord[] = [];
    const keys = [...this.queues.keys()];
    for (let i = 0; i < keys.length && out.length < max; i++) {
      const k = keys[(i + this.rotate) % keys.length]!;
      const q = this.queues.get(k)!;
      if (q.length === 0) continue;
      let part: LogRecord[];
      if (out.length === 0 && q.length <= max) {
        // The common case, a whole queue: handed over as it is, no copy.
        part = q;
        this.queues.set(k, []);
      } else part = q.splice(0, max - out.length);
      out = out.length === 0 ? part : out.concat(part);
      this.count -= part.length;
      taken(k, part[part.length - 1]!, this.length(k));
    }
    this.rotate++;
    return out;
  }
}
