// Reading a topic "to its end" for restores and audits: until the consumer's position on every partition
// reaches the end offsets listed before the read. Positions pass the transaction markers a Kafka partition
// ends with, so the end is exact on both logs. A run of empty polls is not the end: right after a broker
// restart fetches stall for seconds, and restores that stopped there resumed from stale state (a step trained
// twice, a GRPO group never completed). A stall is not the end either: a trainer restore that took 15 s without
// movement as its end resumed a step behind the log and trained step 4 twice (CI, both Kafka clients, under
// load). So a read reaches its end or fails retriably at its deadline, and the role restarts.
import { RlstreamError } from '../errors.ts';
import type { Consumer, LogRecord } from './types.ts';

export interface ReadToEndOptions {
  /** What is being read, for the error message. */
  what: string;
  /** Give up with a retriable LOG_UNAVAILABLE after this long (default 120 s). */
  timeoutMs?: number;
}

export async function readToEnd(consumer: Consumer, topic: string, ends: ReadonlyMap<number, number>, each: (records: LogRecord[]) => Promise<void> | void, options: ReadToEndOptions): Promise<void> {
  const timeoutMs = options.timeoutMs ?? 120_000;
  const position = (p: number): number | undefined => consumer.assignment().find((a) => a.topic === topic && a.partition === p)?.offset;
  const snapshot = (): [number, number, number][] => [...ends].map(([p, end]) => [p, position(p) ?? -1, end]);
  const deadline = Date.now() + timeoutMs;
  let lastMove = Date.now();
  let last = '';
  for (;;) {
    const now = snapshot();
    if (now.every(([, at, end]) => at >= end)) return;
    const key = JSON.stringify(now);
    if (key !== last) {
      last = key;
      lastMove = Date.now();
    }
    if (Date.now() > deadline) throw new RlstreamError('LOG_UNAVAILABLE', `${options.what}: ${topic} was not read to its end within ${timeoutMs / 1000} s, the last ${((Date.now() - lastMove) / 1000).toFixed(0)} s without movement ([partition, position, end]: ${key})`, { retriable: true });
    const records = await consumer.poll({ maxRecords: 1000, timeoutMs: 200 });
    if (records.length > 0) {
      lastMove = Date.now();
      await each(records);
    }
  }
}
