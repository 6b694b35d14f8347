// A pull-based Consumer on kafkajs's push-based eachBatch: batches land in per-partition queues that poll()
// drains. Memory is bounded by pausing a partition whose queue holds maxBufferedRecords and resuming it once
// poll has taken it below half. Offsets are committed only by commit() (autoCommit off) or by a transaction.
//
// Positions are decided here, not left to kafkajs: on every group join the member reads the group's committed
// offsets (or the topic's start/end for partitions without one), seeks kafkajs there, and only then publishes
// its assignment. Batches fetched before that seek took effect are dropped (their fetchedOffset differs from the
// target). So assignment() always carries a real offset and a record produced after assignment() shows a
// partition is never skipped by a "latest" resolved later.
import type { Consumer as KafkaJsConsumer, EachBatchPayload, Kafka, KafkaMessage } from 'kafkajs';
import { RlstreamError } from '../../errors.ts';
import type { Logger } from '../../telemetry.ts';
import type { Consumer, ConsumerOptions, Headers, LogRecord, PollOptions, TopicPartitionOffset } from '../types.ts';
import { fromKafka } from './errors.ts';
import type { CompiledKafkaLogOptions } from './options.ts';
import { partitionKey as key, PartitionQueues, pollLimits } from './partition-queues.ts';
import { Positions } from './positions.ts';

/** What a consumer needs from the log that owns it. */
export interface ConsumerHost {
  partitionCount(topic: string): Promise<number>;
  /** Where each partition starts for a group: its committed offset, else the topic's start or end. */
  startOffsets(groupId: string, topic: string, partitions: number[], fromBeginning: boolean): Promise<Map<number, number>>;
  offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]>;
  readonly options: CompiledKafkaLogOptions;
  readonly logger: Logger;
}

const REBALANCE_TYPES = new Set(['REBALANCE_IN_PROGRESS', 'ILLEGAL_GENERATION', 'UNKNOWN_MEMBER_ID', 'NOT_COORDINATOR']);

function headersOf(h: KafkaMessage['headers']): Headers {
  const out: Headers = {};
  if (!h) return out;
  for (const [name, v] of Object.entries(h)) {
    const last = Array.isArray(v) ? v[v.length - 1] : v;
    if (last !== undefined) out[name] = Buffer.isBuffer(last) ? last : Buffer.from(String(last));
  }
  return out;
}

function isRebalance(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; typeof e === 'object' && e !== null && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    const t = (e as { type?: string }).type;
    if (t !== undefined && REBALANCE_TYPES.has(t)) return true;
    if (/rebalanc/i.test((e as { message?: string }).message ?? '')) return true;
  }
  return false;
}

export class KafkaConsumer implements Consumer {
  private readonly queues = new PartitionQueues();
  private readonly positions = new Positions();
  /**
   * Per partition, the offset after the last batch kafkajs handed over, transaction markers and aborted records
   * included. Once everything polled, a position moves up to it: as in the Java client, a reader that has seen
   * the commit marker at the end of a transactional partition is at the end, not one offset short of it.
   */
  private readonly fetched = new Map<string, number>();
  /** Partitions waiting for the first batch fetched at a seek target; other batches are stale. */
  private readonly pendingSeek = new Map<string, number>();
  private readonly paused = new Set<string>();
  private generation = 0;
  private failure: RlstreamError | null = null;
  private closed = false;
  private readonly client: KafkaJsConsumer;
  private readonly maxBuffered: number;

  private constructor(
    private readonly host: ConsumerHost,
    kafka: Kafka,
    private readonly options: ConsumerOptions,
  ) {
    const o = host.options;
    this.maxBuffered = o.maxBufferedRecords;
    this.client = kafka.consumer({
      groupId: options.groupId,
      readUncommitted: options.readCommitted === false,
      sessionTimeout: o.sessionTimeoutMs,
      heartbeatInterval: o.heartbeatIntervalMs,
      maxWaitTimeInMs: o.maxWaitTimeMs,
      allowAutoTopicCreation: false,
      // Large enough for one maximum record plus a full batch; kafkajs grows it when a record is bigger.
      maxBytesPerPartition: 4 * 1024 * 1024,
      maxBytes: 16 * 1024 * 1024,
    });
  }

  static async open(host: ConsumerHost, kafka: Kafka, options: ConsumerOptions): Promise<KafkaConsumer> {
    if (typeof options.groupId !== 'string' || options.groupId === '') throw new RlstreamError('INPUT_INVALID', 'consumer groupId must be a non-empty string');
    const topics = [...new Set(options.topics)];
    if (topics.length === 0) throw new RlstreamError('INPUT_INVALID', `consumer of group ${options.groupId} needs at least one topic`);
    for (const t of topics) await host.partitionCount(t); // unknown topic → LOG_UNKNOWN_TOPIC before joining
    const c = new KafkaConsumer(host, kafka, options);
    await c.start(topics);
    return c;
  }

  private async start(topics: string[]): Promise<void> {
    const { events } = this.client;
    this.client.on(events.GROUP_JOIN, (e) => this.onJoin(e.payload.memberAssignment));
    // A fetch from a seek target that holds only transaction markers (a committed offset usually points at
    // one) never reaches eachBatch: kafkajs skips it and fetches on from after it. The seek is then done,
    // or every later batch would look fetched before the seek and be dropped, stalling the partition.
    this.client.on(events.START_BATCH_PROCESS, (e) => {
      const { topic, partition, batchSize, firstOffset, lastOffset } = e.payload as { topic: string; partition: number; batchSize: number; firstOffset: string | null; lastOffset: string };
      if (batchSize !== 0 || firstOffset === null) return;
      const k = key(topic, partition);
      const target = this.pendingSeek.get(k);
      if (target === Number(firstOffset)) this.pendingSeek.set(k, Number(lastOffset) + 1);
      else if (target !== undefined || !this.positions.has(k)) return; // fetched before the seek: stale
      this.fetched.set(k, Math.max(this.fetched.get(k) ?? 0, Number(lastOffset) + 1));
      this.notify();
    });
    this.client.on(events.CRASH, (e) => {
      const error = e.payload.error;
      // kafkajs restarts itself after a retriable crash; only a final one ends this consumer.
      if (e.payload.restart) this.host.logger.warn('Kafka consumer restarting after an error', { groupId: this.options.groupId, error: String(error) });
      else this.fail(fromKafka(error, `consumer of group ${this.options.groupId}`));
    });
    try {
      await this.client.connect();
      for (const topic of topics) await this.client.subscribe({ topic, fromBeginning: this.options.fromBeginning !== false });
      await this.client.run({
        autoCommit: false,
        eachBatchAutoResolve: true,
        partitionsConsumedConcurrently: 1,
        eachBatch: async (payload) => this.onBatch(payload),
      });
    } catch (err) {
      await this.client.disconnect().catch(() => {});
      throw fromKafka(err, `start consumer of group ${this.options.groupId}`);
    }
  }

  private fail(err: RlstreamError): void {
    this.failure = err;
    this.notify();
  }

  private notify(): void {
    this.queues.notify();
  }

  /** A new generation: forget what was buffered (kafkajs restarts from the offsets chosen below). */
  private onJoin(memberAssignment: Record<string, number[]>): void {
    const generation = ++this.generation;
    this.queues.clear();
    this.positions.reset();
    this.fetched.clear();
    this.pendingSeek.clear();
    const wasPaused = [...this.paused];
    this.paused.clear();
    if (wasPaused.length > 0) this.client.resume(wasPaused.map((k) => ({ topic: k.split('\u0000')[0]!, partitions: [Number(k.split('\u0000')[1])] })));
    void (async () => {
      const next: TopicPartitionOffset[] = [];
      for (const [topic, partitions] of Object.entries(memberAssignment)) {
        if (partitions.length === 0) continue;
        const starts = await this.host.startOffsets(this.options.groupId, topic, partitions, this.options.fromBeginning !== false);
        for (const partition of partitions) next.push({ topic, partition, offset: starts.get(partition) ?? 0 });
      }
      if (generation !== this.generation || this.closed) return;
      this.positions.start(next);
      for (const tp of next) {
        this.pendingSeek.set(key(tp.topic, tp.partition), tp.offset);
        this.client.seek({ topic: tp.topic, partition: tp.partition, offset: String(tp.offset) });
      }
      this.positions.publish(next);
      this.host.logger.debug('assigned', { groupId: this.options.groupId, generation, offsets: next.map((o) => `${o.topic}/${o.partition}@${o.offset}`).join(',') });
      this.notify();
    })().catch((err: unknown) => {
      // A failed lookup leaves the member without a published assignment; the next join retries.
      if (generation === this.generation) this.host.logger.warn('could not resolve start offsets after a group join', { groupId: this.options.groupId, error: String(err) });
    });
  }

  private async onBatch({ batch, isStale, isRunning }: EachBatchPayload): Promise<void> {
    if (isStale() || !isRunning() || this.closed) return;
    const k = key(batch.topic, batch.partition);
    if (!this.positions.has(k)) return; // fetched before this generation's start offsets were set
    const target = this.pendingSeek.get(k);
    if (target !== undefined) {
      if (Number((batch as unknown as { fetchedOffset: string }).fetchedOffset) !== target) return; // fetched before the seek took effect
      this.pendingSeek.delete(k);
    }
    this.fetched.set(k, Math.max(this.fetched.get(k) ?? 0, Number(batch.lastOffset()) + 1));
    if (batch.messages.length === 0) return;
    const records: LogRecord[] = [];
    for (const m of batch.messages) {
      records.push({
        topic: batch.topic,
        partition: batch.partition,
        offset: Number(m.offset),
        key: m.key ?? null,
        value: m.value ?? Buffer.alloc(0),
        timestamp: Number(m.timestamp),
        headers: headersOf(m.headers),
      });
    }
    if (this.queues.length(k) + records.length >= this.maxBuffered && !this.paused.has(k)) {
      this.paused.add(k);
      this.client.pause([{ topic: batch.topic, partitions: [batch.partition] }]);
    }
    this.queues.push(k, records);
  }

  private check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `consumer of group ${this.options.groupId} is closed`);
    if (this.failure) throw this.failure;
  }

  /** Records fetched and not yet polled (for tests and metrics). */
  bufferedRecords(): number {
    return this.queues.size;
  }

  /** Partitions paused because their queue is full (for tests and metrics). */
  pausedPartitions(): number {
    return this.paused.size;
  }

  async poll(options: PollOptions = {}): Promise<LogRecord[]> {
    this.check();
    const { max, timeoutMs } = pollLimits(options);
    await this.queues.wait(timeoutMs, () => this.closed || this.failure !== null);
    this.check();
    const out = this.queues.take(max, (k, last, left) => {
      this.positions.after(k, last);
      if (this.paused.has(k) && left < this.maxBuffered / 2) {
        this.paused.delete(k);
        this.client.resume([{ topic: last.topic, partitions: [last.partition] }]);
      }
    });
    for (const k of this.positions.keys()) this.passMarkers(k);
    return out;
  }

  /** Move a partition's position past the markers fetched after its last record, once nothing is queued. */
  private passMarkers(k: string): void {
    const pos = this.positions.get(k);
    const fetched = this.fetched.get(k);
    if (!pos || fetched === undefined || fetched <= pos.offset || this.queues.length(k) > 0) return;
    pos.offset = fetched;
  }

  async commit(offsets?: TopicPartitionOffset[]): Promise<void> {
    this.check();
    await this.positions.commit(offsets, this.options.groupId, this.host.logger, {
      send: (list) => this.client.commitOffsets(list.map((o) => ({ topic: o.topic, partition: o.partition, offset: String(o.offset) }))),
      isRebalance,
      wrap: fromKafka,
    });
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    this.check();
    const k = this.positions.seekTo(topic, partition, offset, this.options.groupId);
    this.queues.drop(k);
    this.fetched.delete(k);
    this.pendingSeek.set(k, offset);
    this.client.seek({ topic, partition, offset: String(offset) });
    if (this.paused.delete(k)) this.client.resume([{ topic, partitions: [partition] }]);
  }

  async seekToTimestamp(topic: string, timestampMs: number): Promise<void> {
    this.check();
    for (const o of this.positions.held(topic, await this.host.offsetsForTimestamp(topic, timestampMs))) await this.seek(topic, o.partition, o.offset);
  }

  assignment(): TopicPartitionOffset[] {
    return this.positions.assignment();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.generation++;
    this.notify();
    await this.client.disconnect().catch((err: unknown) => this.host.logger.debug('consumer disconnect failed', { error: String(err) }));
  }
}
