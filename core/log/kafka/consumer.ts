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

/** What a consumer needs from the log that owns it. */
export interface ConsumerHost {
  partitionCount(topic: string): Promise<number>;
  /** Where each partition starts for a group: its committed offset, else the topic's start or end. */
  startOffsets(groupId: string, topic: string, partitions: number[], fromBeginning: boolean): Promise<Map<number, number>>;
  offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]>;
  readonly options: CompiledKafkaLogOptions;
  readonly logger: Logger;
}

const DEFAULT_MAX_RECORDS = 500;
const DEFAULT_TIMEOUT_MS = 1000;
const REBALANCE_TYPES = new Set(['REBALANCE_IN_PROGRESS', 'ILLEGAL_GENERATION', 'UNKNOWN_MEMBER_ID', 'NOT_COORDINATOR']);

const key = (topic: string, partition: number) => `${topic}\u0000${partition}`;

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
  private readonly queues = new Map<string, LogRecord[]>();
  /** Next offset to read per assigned partition: the join's start, then after each polled record or seek. */
  private readonly positions = new Map<string, TopicPartitionOffset>();
  /**
   * Per partition, the offset after the last batch kafkajs handed over, transaction markers and aborted records
   * included. Once everything polled, a position moves up to it: as in the Java client, a reader that has seen
   * the commit marker at the end of a transactional partition is at the end, not one offset short of it.
   */
  private readonly fetched = new Map<string, number>();
  /** Partitions waiting for the first batch fetched at a seek target; other batches are stale. */
  private readonly pendingSeek = new Map<string, number>();
  private readonly paused = new Set<string>();
  private assigned: TopicPartitionOffset[] = [];
  private generation = 0;
  private wake: (() => void) | null = null;
  private failure: RlstreamError | null = null;
  private rotate = 0;
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
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  /** A new generation: forget what was buffered (kafkajs restarts from the offsets chosen below). */
  private onJoin(memberAssignment: Record<string, number[]>): void {
    const generation = ++this.generation;
    this.queues.clear();
    this.positions.clear();
    this.fetched.clear();
    this.pendingSeek.clear();
    this.assigned = [];
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
      for (const tp of next) {
        const k = key(tp.topic, tp.partition);
        this.positions.set(k, { ...tp });
        this.pendingSeek.set(k, tp.offset);
        this.client.seek({ topic: tp.topic, partition: tp.partition, offset: String(tp.offset) });
      }
      this.assigned = next.sort((a, b) => (a.topic === b.topic ? a.partition - b.partition : a.topic < b.topic ? -1 : 1));
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
    const q = this.queues.get(k) ?? [];
    for (const m of batch.messages) {
      q.push({
        topic: batch.topic,
        partition: batch.partition,
        offset: Number(m.offset),
        key: m.key ?? null,
        value: m.value ?? Buffer.alloc(0),
        timestamp: Number(m.timestamp),
        headers: headersOf(m.headers),
      });
    }
    this.queues.set(k, q);
    if (q.length >= this.maxBuffered && !this.paused.has(k)) {
      this.paused.add(k);
      this.client.pause([{ topic: batch.topic, partitions: [batch.partition] }]);
    }
    this.notify();
  }

  private check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `consumer of group ${this.options.groupId} is closed`);
    if (this.failure) throw this.failure;
  }

  /** Records fetched and not yet polled (for tests and metrics). */
  bufferedRecords(): number {
    let n = 0;
    for (const q of this.queues.values()) n += q.length;
    return n;
  }

  /** Partitions paused because their queue is full (for tests and metrics). */
  pausedPartitions(): number {
    return this.paused.size;
  }

  private buffered(): boolean {
    for (const q of this.queues.values()) if (q.length > 0) return true;
    return false;
  }

  async poll(options: PollOptions = {}): Promise<LogRecord[]> {
    this.check();
    const max = options.maxRecords ?? DEFAULT_MAX_RECORDS;
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!Number.isInteger(max) || max < 1) throw new RlstreamError('INPUT_INVALID', `poll maxRecords must be a positive integer, got ${max}`);
    // Wake-ups without records (a join, a seek) do not end the wait: an empty poll waits its full time.
    const deadline = Date.now() + timeoutMs;
    while (!this.buffered() && !this.closed && !this.failure) {
      const left = deadline - Date.now();
      if (left <= 0) break;
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
    this.check();
    const out: LogRecord[] = [];
    const keys = [...this.queues.keys()];
    for (let i = 0; i < keys.length && out.length < max; i++) {
      const k = keys[(i + this.rotate) % keys.length]!;
      const q = this.queues.get(k)!;
      if (q.length === 0) continue;
      const taken = q.splice(0, max - out.length);
      out.push(...taken);
      const last = taken[taken.length - 1]!;
      this.positions.set(k, { topic: last.topic, partition: last.partition, offset: last.offset + 1 });
      if (this.paused.has(k) && q.length < this.maxBuffered / 2) {
        this.paused.delete(k);
        this.client.resume([{ topic: last.topic, partitions: [last.partition] }]);
      }
    }
    this.rotate++;
    for (const k of this.positions.keys()) this.passMarkers(k);
    return out;
  }

  /** Move a partition's position past the markers fetched after its last record, once nothing is queued. */
  private passMarkers(k: string): void {
    const pos = this.positions.get(k);
    const fetched = this.fetched.get(k);
    if (!pos || fetched === undefined || fetched <= pos.offset || (this.queues.get(k)?.length ?? 0) > 0) return;
    pos.offset = fetched;
  }

  async commit(offsets?: TopicPartitionOffset[]): Promise<void> {
    this.check();
    const explicit = offsets !== undefined;
    const list = offsets ?? this.assigned.map((a) => this.positions.get(key(a.topic, a.partition))).filter((p): p is TopicPartitionOffset => p !== undefined);
    for (const o of list) {
      if (!Number.isInteger(o.offset) || o.offset < 0) throw new RlstreamError('INPUT_INVALID', `offset for ${o.topic}/${o.partition} must be a non-negative integer, got ${o.offset}`);
    }
    if (list.length === 0) return;
    try {
      await this.client.commitOffsets(list.map((o) => ({ topic: o.topic, partition: o.partition, offset: String(o.offset) })));
    } catch (err) {
      // During a rebalance the positions of this member are void (the next owner starts from the last
      // commit), so an implicit commit has nothing left to do; explicit offsets are the caller's to retry.
      if (isRebalance(err) && !explicit) {
        this.host.logger.debug('commit skipped: the group is rebalancing', { groupId: this.options.groupId });
        return;
      }
      if (isRebalance(err)) throw new RlstreamError('LOG_UNAVAILABLE', `commit of group ${this.options.groupId}: the group is rebalancing, retry after the next poll`, { cause: err, retriable: true });
      throw fromKafka(err, `commit of group ${this.options.groupId}`);
    }
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    this.check();
    if (!Number.isInteger(offset) || offset < 0) throw new RlstreamError('INPUT_INVALID', `seek offset must be a non-negative integer, got ${offset}`);
    const k = key(topic, partition);
    if (!this.positions.has(k)) throw new RlstreamError('LOG_UNKNOWN_PARTITION', `${topic}/${partition} is not assigned to this consumer of group ${this.options.groupId}`);
    this.queues.delete(k);
    this.fetched.delete(k);
    this.positions.set(k, { topic, partition, offset });
    this.pendingSeek.set(k, offset);
    this.client.seek({ topic, partition, offset: String(offset) });
    if (this.paused.delete(k)) this.client.resume([{ topic, partitions: [partition] }]);
  }

  async seekToTimestamp(topic: string, timestampMs: number): Promise<void> {
    this.check();
    const at = await this.host.offsetsForTimestamp(topic, timestampMs);
    for (const o of at) if (this.positions.has(key(topic, o.partition))) await this.seek(topic, o.partition, o.offset);
  }

  assignment(): TopicPartitionOffset[] {
    return this.assigned.map((a) => this.positions.get(key(a.topic, a.partition)) ?? a).map((p) => ({ ...p }));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.generation++;
    this.notify();
    await this.client.disconnect().catch((err: unknown) => this.host.logger.debug('consumer disconnect failed', { error: String(err) }));
  }
}
