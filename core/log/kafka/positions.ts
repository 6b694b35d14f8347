// Where a Kafka consumer reads next, per assigned partition, and the commit of those positions, shared by both
// clients (./consumer.ts on kafkajs, ./librdkafka/consumer.ts). Each client decides the start of every
// partition it is assigned (the group's committed offset, else the topic's start or end) and publishes the
// assignment only then, so assignment() always carries a real offset.
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import type { LogRecord, TopicPartitionOffset } from '../types.ts';
import { checkOffsets } from './offsets.ts';
import { partitionKey } from './partition-queues.ts';

/** Next offset to read per partition, keyed by partitionKey: the assignment's start, then after each polled record or seek. */
export class Positions extends Map<string, TopicPartitionOffset> {
  private assigned: TopicPartitionOffset[] = [];

  /** A new assignment is being resolved: nothing is assigned until publish(). */
  reset(): void {
    this.clear();
    this.assigned = [];
  }

  /** Starts reading each partition at its offset (the assignment is not yet published). */
  start(list: readonly TopicPartitionOffset[]): void {
    for (const tp of list) this.set(partitionKey(tp.topic, tp.partition), { ...tp });
  }

  /** The assignment, once every partition's start is set. */
  publish(list: TopicPartitionOffset[]): void {
    this.assigned = list.sort((a, b) => (a.topic === b.topic ? a.partition - b.partition : a.topic < b.topic ? -1 : 1));
  }

  get published(): boolean {
    return this.assigned.length > 0;
  }

  /** A partition's position after a polled record. */
  after(k: string, last: LogRecord): void {
    this.set(k, { topic: last.topic, partition: last.partition, offset: last.offset + 1 });
  }

  /** A seek's target, checked and set; returns the partition's key. */
  seekTo(topic: string, partition: number, offset: number, groupId: string): string {
    if (!Number.isInteger(offset) || offset < 0) throw new RlstreamError('INPUT_INVALID', `seek offset must be a non-negative integer, got ${offset}`);
    const k = partitionKey(topic, partition);
    if (!this.has(k)) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `${topic}/${partition} is not assigned to this consumer of group ${groupId}`);
    this.set(k, { topic, partition, offset });
    return k;
  }

  /** The offsets of a topic's partitions this member holds, of those given (a seek to a timestamp). */
  held(topic: string, offsets: readonly TopicPartitionOffset[]): TopicPartitionOffset[] {
    return offsets.filter((o) => this.has(partitionKey(topic, o.partition)));
  }

  /** The published assignment at its current positions. */
  assignment(): TopicPartitionOffset[] {
    return this.assigned.map((a) => this.get(partitionKey(a.topic, a.partition)) ?? a).map((p) => ({ ...p }));
  }

  private current(): TopicPartitionOffset[] {
    return this.assigned.map((a) => this.get(partitionKey(a.topic, a.partition))).filter((p): p is TopicPartitionOffset => p !== undefined);
  }

  /**
   * Commits `offsets`, or without them the positions after everything polled, through `client`. During a
   * rebalance this member's positions are void (the next owner starts from the last commit), so an implicit
   * commit has nothing left to do; explicit offsets are the caller's to retry.
   */
  async commit(
    offsets: TopicPartitionOffset[] | undefined,
    groupId: string,
    logger: Logger,
    /**
     * send commits the list; it resolves 'rebalanced' where it learns, other than from the library's error, that
     * the group moved on before the coordinator wrote the commit.
     */
    client: { send(list: TopicPartitionOffset[]): Promise<void | 'rebalanced'>; isRebalance(err: unknown): boolean; wrap(err: unknown, what: string): RlstreamError },
  ): Promise<void> {
    const list = offsets ?? this.current();
    checkOffsets(list);
    if (list.length === 0) return;
    let cause: unknown;
    try {
      if ((await client.send(list)) !== 'rebalanced') return;
      cause = new Error('the group rebalanced before the commit was confirmed');
    } catch (err) {
      if (!client.isRebalance(err)) throw client.wrap(err, `commit of group ${groupId}`);
      cause = err;
    }
    if (offsets === undefined) {
      logger.debug('commit skipped: the group is rebalancing', { groupId });
      return;
    }
    throw new RlstreamError('LOG_UNAVAILABLE', `commit of group ${groupId}: the group is rebalancing, retry after the next poll`, { cause, retriable: true });
  }
}
