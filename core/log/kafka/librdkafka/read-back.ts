// Reading a group's committed offsets back until they show what was committed: librdkafka reports some commits
// before the coordinator holds them (a consumer's commit is only queued; a transaction's across a broker outage
// was seen not to hold at all), so both the consumer's commit() and the producer's transaction check this way.
import { RlstreamError } from '../../../errors.ts';
import { retry } from '../../../retry.ts';
import type { TopicPartitionOffset } from '../../types.ts';
import type { RdKafkaConsumer as RdClient, RdTopicPartition } from './binding.ts';

/** Both reads: up to 30 s in all, each offset fetch up to 5 s. */
const READ_BACK_MS = 30_000;
const READ_MS = 5_000;

export interface ReadBackOptions {
  groupId: string;
  /** Whether `o` still waits, given the offset the group shows for its partition (undefined: none). */
  pending(o: TopicPartitionOffset, shown: number | undefined): boolean;
  /** Checked before each read: a non-undefined result ends the wait with it. */
  stop?: () => 'rebalanced' | undefined;
  /** Which failures of a read are tried again (default: all). */
  retriable?: (err: unknown) => boolean;
  initialDelayMs: number;
  maxDelayMs: number;
}

/** Resolves once no offset of `list` is pending (or `stop` said why not); throws the last read's failure after READ_BACK_MS. */
export function readBack(client: RdClient, list: TopicPartitionOffset[], o: ReadBackOptions): Promise<void | 'rebalanced'> {
  const toppars = (): RdTopicPartition[] => list.map((t) => ({ topic: t.topic, partition: t.partition }));
  return retry(
    async (): Promise<void | 'rebalanced'> => {
      const stopped = o.stop?.();
      if (stopped !== undefined) return stopped;
      const shown = await new Promise<RdTopicPartition[]>((resolve, reject) => client.committed(toppars(), READ_MS, (err, tps) => (err ? reject(err) : resolve(tps))));
      const pending = list.filter((t) => o.pending(t, shown.find((s) => s.topic === t.topic && s.partition === t.partition)?.offset));
      if (pending.length > 0) {
        const what = pending.map((t) => `${t.topic}/${t.partition}@${t.offset}`).join(', ');
        throw new RlstreamError('LOG_UNAVAILABLE', `group ${o.groupId}: the coordinator does not show ${what}`, { retriable: true });
      }
    },
    { forMs: READ_BACK_MS, initialDelayMs: o.initialDelayMs, maxDelayMs: o.maxDelayMs, retriable: o.retriable ?? (() => true) },
  );
}
