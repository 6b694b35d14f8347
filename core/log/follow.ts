// Following topics for as long as a role runs (policy versions, control commands): a loop that polls and hands
// each batch to the caller. A consumer whose client failed for good (a crash its client does not restart, as
// after a broker restart) throws on every poll, so after a failed poll the consumer is closed and the next turn
// opens a new one, which joins afresh. Records read again after a reopen reach the handler again: handlers ignore
// what they already applied (a version not newer than the current one, a command older than the process).
// A handler's own failure is reported and the loop goes on with the same consumer.
import { sleep } from '../retry.ts';
import type { Consumer, ConsumerOptions, EventLog, LogRecord, PollOptions } from './types.ts';

export interface FollowOptions {
  /** The consumer to open, asked each time one is opened (a fresh group id per opening is the caller's choice). */
  consumer: () => ConsumerOptions;
  poll: PollOptions;
  /** The wait after a failure before the next try (default 500 ms). */
  retryDelayMs?: number;
  /** Each failure: 'poll' (opening or polling; the consumer is replaced) or 'handle' (the handler threw). */
  onError(err: unknown, where: 'poll' | 'handle'): void;
}

export interface Follower {
  /** Ends the loop (a wait ends at once, a poll within its timeout) and closes the consumer. */
  close(): Promise<void>;
}

export function follow(log: EventLog, handle: (records: LogRecord[]) => Promise<void> | void, options: FollowOptions): Follower {
  const retryDelayMs = options.retryDelayMs ?? 500;
  const stop = new AbortController();
  let consumer: Consumer | undefined;
  const pause = (): Promise<void> => sleep(retryDelayMs, stop.signal).catch(() => {});
  const loop = (async () => {
    while (!stop.signal.aborted) {
      let records: LogRecord[];
      try {
        consumer ??= await log.consumer(options.consumer());
        records = await consumer.poll(options.poll);
      } catch (err) {
        if (stop.signal.aborted) break;
        options.onError(err, 'poll');
        const failed = consumer;
        consumer = undefined;
        await failed?.close().catch(() => {});
        await pause();
        continue;
      }
      if (records.length === 0 || stop.signal.aborted) continue;
      try {
        await handle(records);
      } catch (err) {
        if (stop.signal.aborted) break;
        options.onError(err, 'handle');
        await pause();
      }
    }
  })();
  return {
    async close() {
      stop.abort();
      await loop;
      await consumer?.close().catch(() => {});
      consumer = undefined;
    },
  };
}
