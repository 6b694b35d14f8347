// A pull-based Consumer on librdkafka. librdkafka fetches on its own threads into its queue; a pump here moves
// whole batches from that queue into per-partition queues that poll() drains, so a poll hands over everything
// fetched up to maxRecords (not a fixed slice). The pump never blocks a libuv thread waiting for data: it
// consumes with a zero timeout and sleeps until librdkafka signals that its queue is no longer empty
// (queue_non_empty_cb). It stops taking records once maxBufferedRecords wait unpolled (librdkafka then pauses
// fetching by itself once its own queue is full), so memory stays bounded.
//
// Positions are decided here, as in the kafkajs consumer (../consumer.ts): on every assignment the member reads
// the group's committed offsets (or the topic's start or end) and assigns librdkafka exactly there, then
// publishes its assignment. Records a consume call returns for a partition that was seeked or reassigned
// after the call began are dropped. A partition's position passes the transaction markers after its last
// record once everything fetched was polled: librdkafka's own position moves past them when it serves them.
import { RlstreamError } from '../../../errors.ts';
import { retry } from '../../../retry.ts';
import type { Logger } from '../../../telemetry.ts';
import type { Consumer, ConsumerOptions, LogRecord, PollOptions, TopicPartitionOffset } from '../../types.ts';
import type { CompiledKafkaLogOptions } from '../options.ts';
import { partitionKey as key, PartitionQueues, pollLimits } from '../partition-queues.ts';
import { Positions } from '../positions.ts';
import type { RdConfig, RdError, RdKafka, RdKafkaConsumer as RdClient, RdTopicPartition } from './binding.ts';
import { toRecord, unpackBatch } from './records.ts';
import { fromRdKafka, isRdRebalance, RD, rdCall, withDeadline } from './errors.ts';
import { routeRdLogs } from './log-events.ts';

/** What a consumer needs from the log that owns it. */
export interface RdConsumerHost {
  partitionCount(topic: string): Promise<number>;
  startOffsets(groupId: string, topic: string, partitions: number[], fromBeginning: boolean): Promise<Map<number, number>>;
  offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]>;
  baseConfig(): RdConfig;
  readonly options: CompiledKafkaLogOptions;
  readonly logger: Logger;
}

/** Records per consume call of the pump. */
const PUMP_BATCH = 4096;
/**
 * The pump's wait after a consume call that found librdkafka's queue empty: from 1 ms, doubled while it stays
 * empty, up to this. queue_non_empty_cb ends a wait early, but it does not fire reliably (a pump waiting on it
 * alone, with a fixed 100 ms fallback, consumed at less than half the rate), so the wait is kept short while
 * records flow.
 */
const PUMP_IDLE_MS = 100;
const INVALID_OFFSET = -1001;
/** How long commit() waits for the coordinator to show a commit (see commitConfirmed), and each read's limit. */
const COMMIT_CONFIRM_MS = 30_000;
const COMMIT_READ_MS = 5_000;
export class RdKafkaConsumer implements Consumer {
  private readonly queues = new PartitionQueues();
  private readonly positions = new Positions();
  /** Consume calls numbered from 1: records of a partition from a call numbered below its entry are stale. */
  private readonly validFrom = new Map<string, number>();
  private consumeSeq = 0;
  private consuming = false;
  /** The consume call in flight (resolved when none). */
  private inflight: Promise<void> = Promise.resolve();
  /** The pump starts no consume call before this resolves (a seek or an assignment is being applied). */
  private gate: Promise<void> = Promise.resolve();
  private generation = 0;
  /** Commits numbered from 1, and per partition the number of the newest commit that named it. */
  private commits = 0;
  private readonly commitSeq = new Map<string, number>();
  private pumpWake: (() => void) | null = null;
  private failure: RlstreamError | null = null;
  private closed = false;
  private pumping: Promise<void> = Promise.resolve();
  readonly client: RdClient;
  private readonly maxBuffered: number;
  /**
   * RLSTREAM_RDKAFKA_PACKED=0 (read when the consumer opens): the stock per-message consume even where the build
   * has consumeBatch, to measure one against the other (docs/kafka.md, "A JavaScript object per record").
   */
  private readonly packed = process.env['RLSTREAM_RDKAFKA_PACKED'] !== '0';

  private constructor(
    private readonly host: RdConsumerHost,
    rd: RdKafka,
    private readonly options: ConsumerOptions,
  ) {
    const o = host.options;
    this.maxBuffered = o.maxBufferedRecords;
    this.client = new rd.KafkaConsumer({
      ...host.baseConfig(),
      'group.id': options.groupId,
      'enable.auto.commit': false,
      'enable.auto.offset.store': false,
      'isolation.level': options.readCommitted === false ? 'read_uncommitted' : 'read_committed',
      'auto.offset.reset': options.fromBeginning === false ? 'latest' : 'earliest',
      'session.timeout.ms': o.sessionTimeoutMs,
      'heartbeat.interval.ms': o.heartbeatIntervalMs,
      'fetch.wait.max.ms': o.maxWaitTimeMs,
      'allow.auto.create.topics': false,
      // Eager rebalancing: a member gives up all its partitions, then gets its new share with offsets chosen here.
      'partition.assignment.strategy': 'range,roundrobin',
      'max.partition.fetch.bytes': 4 * 1024 * 1024,
      'fetch.max.bytes': 16 * 1024 * 1024,
      // librdkafka stops fetching a partition whose records fill its queue (queued.max.messages.kbytes) and looks
      // again only after this backoff, 1 s by default: a consumer reading faster than one fetch a second then sat
      // idle most of the time (docs/kafka.md, "Where the time goes"). 0 spins the broker thread at a full core
      // while nothing is polled; 10 ms costs nothing measurable there.
      'fetch.queue.backoff.ms': 10,
      rebalance_cb: (err: RdError | undefined, assignment: RdTopicPartition[]) => this.onRebalance(err, assignment),
      queue_non_empty_cb: () => this.wakePump(),
    });
    this.client.on('event.error', (err) => this.onError(err));
    routeRdLogs(this.client, host.logger, `consumer of group ${options.groupId}`);
  }

  static async open(host: RdConsumerHost, rd: RdKafka, options: ConsumerOptions): Promise<RdKafkaConsumer> {
    if (typeof options.groupId !== 'string' || options.groupId === '') throw new RlstreamError('INPUT_INVALID', 'consumer groupId must be a non-empty string');
    const topics = [...new Set(options.topics)];
    if (topics.length === 0) throw new RlstreamError('INPUT_INVALID', `consumer of group ${options.groupId} needs at least one topic`);
    for (const t of topics) await host.partitionCount(t); // unknown topic → LOG_UNKNOWN_TOPIC before joining
    const c = new RdKafkaConsumer(host, rd, options);
    try {
      await rdCall('connect', (cb) => c.client.connect(null, cb));
      c.client.setDefaultConsumeTimeout(0);
      c.client.setDefaultIsTimeoutOnlyForFirstMessage(true);
      c.client.subscribe(topics);
    } catch (err) {
      c.closed = true;
      await rdCall('disconnect', (cb) => c.client.disconnect(cb)).catch(() => {});
      throw fromRdKafka(err, `start consumer of group ${options.groupId}`);
    }
    c.pumping = c.pump();
    return c;
  }

  private onError(err: RdError): void {
    // librdkafka retries lost connections itself; only a fatal error ends this consumer.
    if (err.isFatal) this.fail(fromRdKafka(err, `consumer of group ${this.options.groupId}`));
    else this.host.logger.debug('librdkafka consumer error', { groupId: this.options.groupId, error: err.message, code: err.code });
  }

  private fail(err: RlstreamError): void {
    this.failure ??= err;
    this.notify();
  }

  private notify(): void {
    this.queues.notify();
  }

  private wakePump(): void {
    const w = this.pumpWake;
    this.pumpWake = null;
    w?.();
  }

  private sleepPump(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        if (this.pumpWake === done) this.pumpWake = null;
        resolve();
      }, ms);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      this.pumpWake = done;
    });
  }

  /** Moves librdkafka's queue into the partition queues; rebalances are served by these consume calls too. */
  private async pump(): Promise<void> {
    let idleMs = 1;
    while (!this.closed) {
      await this.gate;
      if (this.closed) return;
      if (this.queues.size >= this.maxBuffered) {
        await this.sleepPump(PUMP_IDLE_MS);
        continue;
      }
      // Never more than the room left: the buffer stays within maxBufferedRecords.
      const want = Math.min(PUMP_BATCH, this.maxBuffered - this.queues.size);
      const seq = ++this.consumeSeq;
      this.consuming = true;
      let messages: LogRecord[];
      try {
        const call = this.consume(want);
        this.inflight = call.then(
          () => {},
          () => {},
        );
        messages = await call;
      } catch (err) {
        this.consuming = false;
        if (this.closed) return;
        const code = (err as RdError).code;
        if (code === RD.TIMED_OUT || code === RD.TIMED_OUT_QUEUE) continue;
        if ((err as RdError).isFatal) {
          this.fail(fromRdKafka(err, `consumer of group ${this.options.groupId}`));
          return;
        }
        this.host.logger.debug('librdkafka consume failed; trying again', { groupId: this.options.groupId, error: String((err as Error).message), code });
        await this.sleepPump(PUMP_IDLE_MS);
        continue;
      }
      this.consuming = false;
      if (this.closed) return;
      if (messages.length > 0) {
        this.accept(messages, seq);
        idleMs = 1;
      }
      // A full batch may have left more behind: consume again at once.
      if (messages.length < want) {
        await this.sleepPump(idleMs);
        if (messages.length === 0) idleMs = Math.min(PUMP_IDLE_MS, idleMs * 2);
      }
    }
  }

  /** Up to n records from librdkafka's queue: packed (records.ts) where the build has consumeBatch, else one object each. */
  private consume(n: number): Promise<LogRecord[]> {
    const client = this.client;
    if (this.packed && client.consumeBatch) return new Promise((resolve, reject) => client.consumeBatch!(n, (err, b) => (err ? reject(err) : resolve(unpackBatch(b)))));
    return new Promise((resolve, reject) => client.consume(n, (err, m) => (err ? reject(err) : resolve(m.map(toRecord)))));
  }

  private accept(messages: LogRecord[], seq: number): void {
    let k = '';
    let run: LogRecord[] | null = null;
    let lastTopic = '';
    let lastPartition = -1;
    for (const m of messages) {
      if (m.partition !== lastPartition || m.topic !== lastTopic) {
        if (run) this.queues.push(k, run);
        lastTopic = m.topic;
        lastPartition = m.partition;
        k = key(m.topic, m.partition);
        const from = this.validFrom.get(k);
        // Revoked, or fetched before a seek or assignment took effect: dropped.
        run = !this.positions.has(k) || (from !== undefined && seq < from) ? null : [];
      }
      run?.push(m);
    }
    if (run) this.queues.push(k, run);
  }

  /**
   * Runs `apply` (a seek or an assignment, which librdkafka carries out on another thread) while no consume
   * call is under way, and marks the partitions' records from every call begun before it as stale. A consume
   * call running alongside could return records from either side of the change, and the ones from after it
   * cannot be told apart from the others, nor fetched again once dropped.
   */
  private exclusive(parts: string[], apply: () => void | Promise<void>): Promise<void> {
    for (const k of parts) this.validFrom.set(k, Number.POSITIVE_INFINITY);
    const run = (async () => {
      await this.inflight;
      try {
        await apply();
      } finally {
        for (const k of parts) if (this.validFrom.get(k) === Number.POSITIVE_INFINITY) this.validFrom.set(k, this.consumeSeq + 1);
      }
    })();
    const previous = this.gate;
    this.gate = Promise.all([previous, run]).then(
      () => {},
      () => {},
    );
    this.wakePump();
    return run;
  }

  private onRebalance(err: RdError | undefined, assignment: RdTopicPartition[]): void {
    const generation = ++this.generation;
    this.queues.clear();
    this.positions.reset();
    const parts = assignment.map((tp) => `${tp.topic}/${tp.partition}`).join(',');
    this.host.logger.debug('rebalance', { groupId: this.options.groupId, generation, event: err?.code === RD.ASSIGN_PARTITIONS ? 'assign' : 'revoke', code: err?.code, partitions: parts });
    if (err?.code !== RD.ASSIGN_PARTITIONS) {
      try {
        this.client.unassign();
      } catch (e) {
        if (!this.closed) this.host.logger.debug('unassign failed', { groupId: this.options.groupId, error: String(e) });
      }
      return;
    }
    const byTopic = new Map<string, number[]>();
    for (const tp of assignment) byTopic.set(tp.topic, [...(byTopic.get(tp.topic) ?? []), tp.partition]);
    void (async () => {
      const next: TopicPartitionOffset[] = [];
      for (const [topic, partitions] of byTopic) {
        const starts = await retry(() => this.host.startOffsets(this.options.groupId, topic, partitions, this.options.fromBeginning !== false), { forMs: 30_000, initialDelayMs: 100, maxDelayMs: 1000 });
        for (const partition of partitions) next.push({ topic, partition, offset: starts.get(partition) ?? 0 });
      }
      if (generation !== this.generation || this.closed) {
        this.host.logger.debug('assignment superseded before assigning', { groupId: this.options.groupId, generation, now: this.generation });
        return;
      }
      await this.exclusive(
        next.map((tp) => key(tp.topic, tp.partition)),
        () => {
          if (generation !== this.generation || this.closed) return;
          this.client.assign(next.map((tp) => ({ ...tp })));
          this.positions.start(next);
        },
      );
      if (generation !== this.generation || this.closed) {
        this.host.logger.debug('assignment superseded', { groupId: this.options.groupId, generation, now: this.generation });
        return;
      }
      this.positions.publish(next);
      this.host.logger.debug('assigned', { groupId: this.options.groupId, generation, offsets: next.map((o) => `${o.topic}/${o.partition}@${o.offset}`).join(',') });
      this.notify();
      this.wakePump();
    })().catch((e: unknown) => {
      if (generation === this.generation && !this.closed) this.fail(fromRdKafka(e, `assign partitions to a member of group ${this.options.groupId}`));
    });
  }

  private check(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `consumer of group ${this.options.groupId} is closed`);
    if (this.failure) throw this.failure;
  }

  /** Records fetched and not yet polled (for tests and metrics). */
  bufferedRecords(): number {
    return this.queues.size;
  }

  async poll(options: PollOptions = {}): Promise<LogRecord[]> {
    this.check();
    const { max, timeoutMs } = pollLimits(options);
    await this.queues.wait(timeoutMs, () => this.closed || this.failure !== null);
    this.check();
    const out = this.queues.take(max, (k, last) => this.positions.after(k, last));
    this.passMarkers();
    if (this.queues.size < this.maxBuffered) this.wakePump();
    return out;
  }

  /**
   * Moves each drained partition's position up to librdkafka's, which passes the transaction markers after its
   * last record. Only while no consume call is under way: one in flight may have taken records librdkafka
   * counts as consumed that are not queued here yet.
   */
  private passMarkers(): void {
    if (this.consuming || !this.positions.published) return;
    const drained: RdTopicPartition[] = [];
    for (const [k, pos] of this.positions) {
      if (this.queues.length(k) > 0 || this.validFrom.get(k) === Number.POSITIVE_INFINITY) continue;
      drained.push({ topic: pos.topic, partition: pos.partition });
    }
    if (drained.length === 0) return;
    let at: RdTopicPartition[];
    try {
      at = this.client.position(drained);
    } catch {
      return;
    }
    for (const tp of at) {
      const k = key(tp.topic, tp.partition);
      const pos = this.positions.get(k);
      if (pos && tp.offset !== undefined && tp.offset !== INVALID_OFFSET && tp.offset > pos.offset) pos.offset = tp.offset;
    }
  }

  async commit(offsets?: TopicPartitionOffset[]): Promise<void> {
    this.check();
    await this.positions.commit(offsets, this.options.groupId, this.host.logger, {
      send: (list) => this.commitConfirmed(list),
      isRebalance: isRdRebalance,
      wrap: fromRdKafka,
    });
  }

  /**
   * Commits `list` and returns once the coordinator shows it. The binding's commitCb calls librdkafka's
   * commitAsync, whose callback says the commit was queued, not written; its result comes only through
   * offset_commit_cb, which librdkafka serves from consume calls the pump does not make while its buffer is
   * full (a caller awaiting commit before its next poll would wait forever). So the commit is read back: an
   * offset fetch asked after the commit was sent, until each partition shows its offset or a newer commit of
   * this member replaced it. A rebalance meanwhile means the coordinator may have turned the commit away.
   */
  private async commitConfirmed(list: TopicPartitionOffset[]): Promise<void | 'rebalanced'> {
    const seq = ++this.commits;
    for (const o of list) this.commitSeq.set(key(o.topic, o.partition), seq);
    const generation = this.generation;
    const toppars = (): RdTopicPartition[] => list.map((o) => ({ topic: o.topic, partition: o.partition, offset: o.offset }));
    await new Promise<void>((resolve, reject) => this.client.commitCb(toppars(), (err) => (err ? reject(err) : resolve())));
    return retry(
      async (): Promise<void | 'rebalanced'> => {
        if (this.generation !== generation) return 'rebalanced';
        const shown = await new Promise<RdTopicPartition[]>((resolve, reject) => this.client.committed(toppars(), COMMIT_READ_MS, (err, tps) => (err ? reject(err) : resolve(tps))));
        const pending = list.filter((o) => {
          if ((this.commitSeq.get(key(o.topic, o.partition)) ?? 0) > seq) return false;
          return shown.find((t) => t.topic === o.topic && t.partition === o.partition)?.offset !== o.offset;
        });
        if (pending.length > 0) {
          const what = pending.map((o) => `${o.topic}/${o.partition}@${o.offset}`).join(', ');
          throw new RlstreamError('LOG_UNAVAILABLE', `commit of group ${this.options.groupId}: the coordinator does not show ${what} yet`, { retriable: true });
        }
      },
      { forMs: COMMIT_CONFIRM_MS, initialDelayMs: 2, maxDelayMs: 200, retriable: (err) => !isRdRebalance(err) },
    );
  }

  async seek(topic: string, partition: number, offset: number): Promise<void> {
    this.check();
    const k = this.positions.seekTo(topic, partition, offset, this.options.groupId);
    this.queues.drop(k);
    await this.exclusive([k], () => new Promise<void>((resolve, reject) => this.client.seek({ topic, partition, offset }, 5000, (err) => (err ? reject(fromRdKafka(err, `seek ${topic}/${partition} to ${offset}`)) : resolve()))));
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
    this.wakePump();
    await this.pumping;
    // Left after 10 s: a client stuck in librdkafka must not keep a stopping role alive.
    await withDeadline('disconnect a consumer', 10_000, rdCall('disconnect', (cb) => this.client.disconnect(cb))).catch((err: unknown) => this.host.logger.debug('consumer disconnect failed', { error: String(err) }));
  }
}
