// The EventLog on Apache Kafka: topics and offsets through kafkajs's admin client; producers (idempotent,
// transactional) and pull consumers through the client `log.client` names: kafkajs (./producer.ts,
// ./consumer.ts) or librdkafka (./librdkafka/, loaded only when chosen). Opened by core/log/open.ts when the
// configuration says `kind: kafka`.
import './crc32c.ts'; // first: swaps kafkajs's byte-at-a-time CRC-32C for a faster one before kafkajs loads
import { CompressionTypes, Kafka, Partitioners, type Admin, type KafkaConfig, type SASLOptions } from 'kafkajs';
import { RlstreamError } from '../../errors.ts';
import { retry } from '../../retry.ts';
import type { Logger } from '../../telemetry.ts';
import { silentLogger } from '../../telemetry.ts';
import type { Consumer, ConsumerOptions, EventLog, GroupLag, PartitionOffsets, Producer, ProducerOptions, TopicPartitionOffset, TopicSpec } from '../types.ts';
import { checkTopicSpec } from '../topic-spec.ts';
import { KafkaConsumer, type ConsumerHost } from './consumer.ts';
import { fromKafka, isCoordinatorBusy } from './errors.ts';
import { KAFKAJS_LEVEL, kafkajsLogCreator } from './logging.ts';
import { compileKafkaLogOptions, type CompiledKafkaLogOptions, type KafkaLogOptions } from './options.ts';
import { KafkaProducer, type ProducerHost } from './producer.ts';
import type { RdKafkaClients } from './librdkafka/index.ts';

export type { KafkaLogOptions, CompiledKafkaLogOptions } from './options.ts';
export { compileKafkaLogOptions } from './options.ts';


function kafkaConfig(o: CompiledKafkaLogOptions, logger: Logger): KafkaConfig {
  const config: KafkaConfig = {
    clientId: o.clientId,
    brokers: [...o.brokers],
    connectionTimeout: o.connectionTimeoutMs,
    requestTimeout: o.requestTimeoutMs,
    logLevel: KAFKAJS_LEVEL[o.clientLogLevel],
    logCreator: kafkajsLogCreator(logger.child({ component: 'kafkajs' })),
    // Bounded retries for admin and consumer calls: an unreachable cluster becomes LOG_UNAVAILABLE in
    // seconds rather than minutes (the idempotent producer retries on its own, without a bound).
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  };
  if (o.ssl !== false) config.ssl = o.ssl === true ? true : { ...o.ssl };
  if (o.sasl) config.sasl = { mechanism: o.sasl.mechanism, username: o.sasl.username, password: o.sasl.password } as SASLOptions;
  return config;
}

const CODECS: Record<string, CompressionTypes> = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP };
/** Codecs the librdkafka build of infra/setup.sh has (zstd needs libzstd at build time, which it does not ask for). */
const RD_CODECS = new Set(['none', 'gzip', 'snappy', 'lz4']);

export class KafkaEventLog implements EventLog, ProducerHost, ConsumerHost {
  readonly kind = 'kafka' as const;
  private readonly kafka: Kafka;
  private admin: Admin | null = null;
  private adminReady: Promise<Admin> | null = null;
  private readonly partitionCounts = new Map<string, number>();
  private readonly open = new Set<{ close(): Promise<void> }>();
  private closed = false;
  /** The librdkafka producers and consumers, when `client` is librdkafka (set by connect()). */
  private rd: RdKafkaClients | null = null;

  constructor(
    readonly options: CompiledKafkaLogOptions,
    readonly logger: Logger,
  ) {
    this.kafka = new Kafka(kafkaConfig(options, logger));
  }

  get maxRequestBytes(): number {
    return this.options.maxRequestBytes;
  }

  private checkOpen(): void {
    if (this.closed) throw new RlstreamError('LOG_CLOSED', `Kafka log ${this.options.brokers.join(',')} is closed`);
  }

  /** The admin client, connected once and shared. */
  private async adm(): Promise<Admin> {
    this.checkOpen();
    if (this.admin) return this.admin;
    this.adminReady ??= (async () => {
      const a = this.kafka.admin();
      try {
        await a.connect();
      } catch (err) {
        this.adminReady = null;
        throw fromKafka(err, `connect to Kafka at ${this.options.brokers.join(',')}`);
      }
      this.admin = a;
      return a;
    })();
    return this.adminReady;
  }

  /**
   * Loads the chosen client and checks the connection now, so a missing build or a wrong address fails at
   * open rather than at first use.
   */
  async connect(): Promise<this> {
    if (this.options.client === 'librdkafka' && !this.rd) {
      const { RdKafkaClients } = await import('./librdkafka/index.ts');
      this.rd = new RdKafkaClients(this);
    }
    await this.adm();
    return this;
  }

  /** The client library in use, with librdkafka's version when it is that one. */
  get client(): string {
    return this.rd ? `librdkafka ${this.rd.version}` : 'kafkajs';
  }

  async partitionCount(topic: string): Promise<number> {
    const cached = this.partitionCounts.get(topic);
    if (cached !== undefined) return cached;
    const spec = (await this.listTopics()).find((t) => t.name === topic);
    if (!spec) throw new RlstreamError('LOG_UNKNOWN_TOPIC', `topic ${topic} does not exist`);
    return spec.partitions;
  }

  async createTopic(spec: TopicSpec): Promise<void> {
    checkTopicSpec(spec);
    const admin = await this.adm();
    const configEntries: { name: string; value: string }[] = [];
    // null: no limit, which Kafka spells -1; absent: the broker's default.
    if (spec.retention?.maxAgeMs !== undefined) configEntries.push({ name: 'retention.ms', value: String(spec.retention.maxAgeMs ?? -1) });
    if (spec.retention?.maxBytes !== undefined) configEntries.push({ name: 'retention.bytes', value: String(spec.retention.maxBytes ?? -1) });
    let created: boolean;
    try {
      // The broker's own wait for the controller: kafkajs's default of 5 s, which a loaded broker exceeds, ends in
      // REQUEST_TIMED_OUT with no retry; this one ends before the client's request timeout does.
      const timeout = Math.max(1000, this.options.requestTimeoutMs - 5000);
      created = await admin.createTopics({ topics: [{ topic: spec.name, numPartitions: spec.partitions, replicationFactor: -1, configEntries }], waitForLeaders: false, timeout });
    } catch (err) {
      throw fromKafka(err, `create topic ${spec.name}`);
    }
    if (!created) {
      // Another client created it a moment ago (roles start together): the controller says it exists, but the
      // metadata this client reads may not list it yet. Wait for it rather than fail LOG_UNKNOWN_TOPIC.
      const existing = await this.visiblePartitionCount(spec.name);
      if (existing !== spec.partitions) throw new RlstreamError('LOG_TOPIC_EXISTS', `topic ${spec.name} exists with ${existing} partitions, not ${spec.partitions}`);
    } else {
      this.partitionCounts.set(spec.name, spec.partitions);
    }
    // The winner and the losers alike: the topic being listed does not mean its leaders serve yet (a loser's
    // first offsets() was answered NOT_LEADER_FOR_PARTITION in CI).
    await this.untilLeadersServe(admin, spec.name);
  }

  /** The count of a topic another client just created, once this client's metadata lists it. */
  private visiblePartitionCount(topic: string): Promise<number> {
    return retryForAWhile(
      () => {
        this.partitionCounts.delete(topic);
        return this.partitionCount(topic);
      },
      (err) => err instanceof RlstreamError && err.code === 'LOG_UNKNOWN_TOPIC',
      (err) => err,
    );
  }

  /**
   * Waits until the new topic's leaders answer. kafkajs's own waitForLeaders is not used: it retries only
   * LEADER_NOT_AVAILABLE, yet a broker whose metadata has not caught up with the controller answers
   * UNKNOWN_TOPIC_OR_PARTITION for a moment (seen failing CI), and NOT_LEADER_FOR_PARTITION after that.
   * Waiting here keeps all of these out of the first offsets() or send().
   */
  private async untilLeadersServe(admin: Admin, topic: string): Promise<void> {
    await retryForAWhile(
      () => admin.fetchTopicOffsets(topic),
      () => true,
      (err) => fromKafka(err, `topic ${topic} has no serving leaders`),
    );
  }

  async listTopics(): Promise<TopicSpec[]> {
    const admin = await this.adm();
    try {
      const { topics } = await admin.fetchTopicMetadata();
      const out: TopicSpec[] = [];
      for (const t of topics) {
        if (t.name.startsWith('__')) continue; // Kafka's internal topics (offsets, transactions)
        this.partitionCounts.set(t.name, t.partitions.length);
        out.push({ name: t.name, partitions: t.partitions.length });
      }
      return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    } catch (err) {
      throw fromKafka(err, 'list topics');
    }
  }

  async offsets(topic: string): Promise<PartitionOffsets[]> {
    await this.partitionCount(topic); // unknown topic → LOG_UNKNOWN_TOPIC instead of kafkajs's retries
    const admin = await this.adm();
    try {
      const rows = await admin.fetchTopicOffsets(topic);
      return rows.map((r) => ({ partition: r.partition, low: Number(r.low), high: Number(r.high) })).sort((a, b) => a.partition - b.partition);
    } catch (err) {
      throw fromKafka(err, `offsets of ${topic}`);
    }
  }

  async offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]> {
    if (!Number.isFinite(timestampMs)) throw new RlstreamError('INPUT_INVALID', `timestamp must be a finite number of ms, got ${timestampMs}`);
    await this.partitionCount(topic);
    const admin = await this.adm();
    try {
      const rows = await admin.fetchTopicOffsetsByTimestamp(topic, timestampMs);
      return rows.map((r) => ({ topic, partition: r.partition, offset: Number(r.offset) })).sort((a, b) => a.partition - b.partition);
    } catch (err) {
      throw fromKafka(err, `offsets of ${topic} at ${timestampMs}`);
    }
  }

  /**
   * Committed offsets by partition (partitions without one are absent). A group coordinator that is loading its
   * partition of __consumer_offsets or has just moved turns the fetch away unanswered: asked again, for a while.
   */
  private async committedMap(groupId: string, topic: string): Promise<Map<number, number>> {
    await this.partitionCount(topic);
    const admin = await this.adm();
    const [res] = await retryForAWhile(() => admin.fetchOffsets({ groupId, topics: [topic] }), isCoordinatorBusy, (err) => fromKafka(err, `committed offsets of group ${groupId} on ${topic}`));
    const out = new Map<number, number>();
    for (const p of res?.partitions ?? []) if (Number(p.offset) >= 0) out.set(p.partition, Number(p.offset));
    return out;
  }

  async committed(groupId: string, topic: string): Promise<TopicPartitionOffset[]> {
    const m = await this.committedMap(groupId, topic);
    return [...m].sort((a, b) => a[0] - b[0]).map(([partition, offset]) => ({ topic, partition, offset }));
  }

  /** Lag per partition; a partition without a committed offset reports committed -1 and all it holds as lag. */
  async lag(groupId: string, topic: string): Promise<GroupLag[]> {
    const [committed, offsets] = await Promise.all([this.committedMap(groupId, topic), this.offsets(topic)]);
    return offsets.map((p) => {
      const c = committed.get(p.partition);
      return { topic, partition: p.partition, committed: c ?? -1, high: p.high, lag: c === undefined ? p.high - p.low : Math.max(0, p.high - c) };
    });
  }

  async startOffsets(groupId: string, topic: string, partitions: number[], fromBeginning: boolean): Promise<Map<number, number>> {
    const committed = await this.committedMap(groupId, topic);
    if (partitions.every((p) => committed.has(p))) return committed;
    const offsets = await this.offsets(topic);
    const out = new Map<number, number>();
    for (const p of partitions) {
      const o = offsets.find((x) => x.partition === p);
      out.set(p, committed.get(p) ?? (fromBeginning ? (o?.low ?? 0) : (o?.high ?? 0)));
    }
    return out;
  }

  async producer(options: ProducerOptions = {}): Promise<Producer> {
    this.checkOpen();
    const compressionName = options.compression ?? this.options.compression;
    const transactional = options.transactionalId !== undefined;
    if (transactional && (typeof options.transactionalId !== 'string' || options.transactionalId === '')) {
      throw new RlstreamError('INPUT_INVALID', 'producer transactionalId must be a non-empty string');
    }
    if (options.idempotent === false && transactional) throw new RlstreamError('INPUT_INVALID', 'a transactional producer is always idempotent: drop idempotent: false');
    if (this.rd) {
      if (!RD_CODECS.has(compressionName)) throw new RlstreamError('CONFIG_INVALID', `producer compression ${compressionName} is not built into this librdkafka; use none, gzip, snappy or lz4`);
      return this.track(await this.rd.producer(options, compressionName));
    }
    const compression = CODECS[compressionName];
    if (compression === undefined) {
      throw new RlstreamError('CONFIG_INVALID', `producer compression ${compressionName} needs a codec kafkajs does not bundle; use none or gzip`);
    }
    const client = this.kafka.producer({
      idempotent: options.idempotent !== false,
      transactionalId: options.transactionalId,
      transactionTimeout: this.options.transactionTimeoutMs,
      maxInFlightRequests: options.idempotent === false ? undefined : 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner, // unused (partitions are explicit); silences kafkajs's v2 notice
    });
    try {
      await client.connect();
    } catch (err) {
      throw fromKafka(err, `connect a producer to ${this.options.brokers.join(',')}`);
    }
    const producer = new KafkaProducer(this, client, options, compression);
    if (transactional) {
      try {
        await producer.initTransactions();
      } catch (err) {
        await producer.close();
        throw err;
      }
    }
    return this.track(producer);
  }

  async consumer(options: ConsumerOptions): Promise<Consumer> {
    this.checkOpen();
    if (this.rd) return this.track(await this.rd.consumer(options));
    return this.track(await KafkaConsumer.open(this, this.kafka, options));
  }

  /** Remembers a client so close() can end it; the client's own close forgets it. */
  private track<T extends { close(): Promise<void> }>(client: T): T {
    const close = client.close.bind(client);
    this.open.add(client);
    client.close = async () => {
      this.open.delete(client);
      await close();
    };
    return client;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([...this.open].map((c) => c.close().catch(() => {})));
    await this.rd?.close();
    await this.admin?.disconnect().catch(() => {});
    this.admin = null;
  }
}

/** Opens the Kafka log (core/log/open.ts calls this for `kind: kafka`) and checks that a broker answers. */
export async function openKafkaLog(config: KafkaLogOptions | (KafkaLogOptions & { kind: 'kafka' }), logger: Logger = silentLogger): Promise<EventLog> {
  const log = new KafkaEventLog(compileKafkaLogOptions(config), logger);
  try {
    return await log.connect();
  } catch (err) {
    await log.close();
    throw err;
  }
}

/**
 * Run `attempt` until it succeeds, retrying the errors `retriable` accepts every 100 ms for up to 10 s (what a
 * just-created topic takes to show up everywhere on one broker); then the last error, through `fail`.
 */
async function retryForAWhile<T>(attempt: () => Promise<T>, retriable: (err: unknown) => boolean, fail: (err: unknown) => unknown): Promise<T> {
  try {
    return await retry(attempt, { retriable, forMs: 10_000, initialDelayMs: 100, maxDelayMs: 100 });
  } catch (err) {
    throw fail(err);
  }
}
