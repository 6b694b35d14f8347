// The data path of the Kafka log on librdkafka (`log.client: librdkafka`): producers (idempotent,
// transactional) and consumers through @confluentinc/kafka-javascript, loaded only when chosen (./binding.ts).
// Topics, offsets and committed offsets stay with the log's admin client (../index.ts): they are a few calls
// per run, not the hot path.
import { RlstreamError } from '../../../errors.ts';
import type { Logger } from '../../../telemetry.ts';
import type { Consumer, ConsumerOptions, Producer, ProducerOptions, TopicPartitionOffset } from '../../types.ts';
import type { CompiledKafkaLogOptions } from '../options.ts';
import { loadRdKafka, type RdConfig, type RdKafka, type RdKafkaConsumer as RdClient } from './binding.ts';
import { RdKafkaConsumer } from './consumer.ts';
import { rdCall, withDeadline } from './errors.ts';
import { routeRdLogs } from './log-events.ts';
import { RdKafkaProducer } from './producer.ts';

/** What the librdkafka clients need from the log that owns them. */
export interface RdLogHost {
  partitionCount(topic: string): Promise<number>;
  startOffsets(groupId: string, topic: string, partitions: number[], fromBeginning: boolean): Promise<Map<number, number>>;
  offsetsForTimestamp(topic: string, timestampMs: number): Promise<TopicPartitionOffset[]>;
  readonly options: CompiledKafkaLogOptions;
  readonly logger: Logger;
}

const SASL_MECHANISMS = { plain: 'PLAIN', 'scram-sha-256': 'SCRAM-SHA-256', 'scram-sha-512': 'SCRAM-SHA-512' } as const;
const LOG_LEVELS = { nothing: 0, error: 3, warn: 4, info: 6, debug: 7 } as const;

/** librdkafka's settings for the log's options: brokers, TLS, SASL, timeouts (docs/kafka.md maps them). */
export function rdBaseConfig(o: CompiledKafkaLogOptions): RdConfig {
  const c: RdConfig = {
    'bootstrap.servers': o.brokers.join(','),
    'client.id': o.clientId,
    'socket.connection.setup.timeout.ms': Math.max(1000, o.connectionTimeoutMs),
    'socket.timeout.ms': Math.max(10, o.requestTimeoutMs),
    log_level: LOG_LEVELS[o.clientLogLevel],
  };
  if (o.clientDebug !== null) c['debug'] = o.clientDebug;
  const ssl = o.ssl !== false;
  if (o.ssl !== false && o.ssl !== true) {
    if (o.ssl.ca !== undefined) c['ssl.ca.pem'] = Array.isArray(o.ssl.ca) ? o.ssl.ca.join('\n') : (o.ssl.ca as string);
    if (o.ssl.cert !== undefined) c['ssl.certificate.pem'] = o.ssl.cert;
    if (o.ssl.key !== undefined) c['ssl.key.pem'] = o.ssl.key;
    if (o.ssl.rejectUnauthorized === false) {
      c['enable.ssl.certificate.verification'] = false;
      c['ssl.endpoint.identification.algorithm'] = 'none';
    }
    if (o.ssl.servername !== undefined) {
      throw new RlstreamError('CONFIG_INVALID', 'log.ssl.servername is not supported by log.client librdkafka (it checks the broker host name): remove it or use log.client: kafkajs');
    }
  }
  if (o.sasl) {
    c['security.protocol'] = ssl ? 'sasl_ssl' : 'sasl_plaintext';
    c['sasl.mechanisms'] = SASL_MECHANISMS[o.sasl.mechanism];
    c['sasl.username'] = o.sasl.username;
    c['sasl.password'] = o.sasl.password;
  } else if (ssl) c['security.protocol'] = 'ssl';
  return c;
}

export class RdKafkaClients {
  private readonly rd: RdKafka;
  private readonly base: RdConfig;
  /** Live consumers by group: a transaction's offsets go with the group metadata of one of them. */
  private readonly byGroup = new Map<string, Set<RdKafkaConsumer>>();
  /** Connected, never-subscribed consumers for groups without a live member here (see groupConsumer). */
  private readonly idle = new Map<string, Promise<RdClient>>();

  constructor(private readonly host: RdLogHost) {
    this.rd = loadRdKafka();
    this.base = rdBaseConfig(host.options);
  }

  get version(): string {
    return this.rd.librdkafkaVersion;
  }

  async producer(options: ProducerOptions, compression: string): Promise<Producer> {
    const h = this.host;
    return RdKafkaProducer.open(
      {
        partitionCount: (t) => h.partitionCount(t),
        baseConfig: () => this.base,
        transactionTimeoutMs: h.options.transactionTimeoutMs,
        maxRequestBytes: h.options.maxRequestBytes,
        groupConsumer: (g) => this.groupConsumer(g),
        logger: h.logger,
      },
      this.rd,
      options,
      compression,
    );
  }

  async consumer(options: ConsumerOptions): Promise<Consumer> {
    const h = this.host;
    const c = await RdKafkaConsumer.open(
      {
        partitionCount: (t) => h.partitionCount(t),
        startOffsets: (g, t, p, b) => h.startOffsets(g, t, p, b),
        offsetsForTimestamp: (t, ts) => h.offsetsForTimestamp(t, ts),
        baseConfig: () => this.base,
        options: h.options,
        logger: h.logger,
      },
      this.rd,
      options,
    );
    const members = this.byGroup.get(options.groupId) ?? new Set();
    members.add(c);
    this.byGroup.set(options.groupId, members);
    const close = c.close.bind(c);
    c.close = async () => {
      members.delete(c);
      await close();
    };
    return c;
  }

  /**
   * The consumer whose group metadata librdkafka sends with a transaction's offsets. A live member of the
   * group in this process gives its generation and member id, so the broker refuses the offsets of a member
   * that lost its partitions (KIP-447). Without one, a connected consumer of the group that never joins it:
   * its metadata names only the group, as kafkajs's sendOffsets does.
   */
  async groupConsumer(groupId: string): Promise<RdClient> {
    for (const c of this.byGroup.get(groupId) ?? []) return c.client;
    let p = this.idle.get(groupId);
    if (!p) {
      p = (async () => {
        const c = new this.rd.KafkaConsumer({ ...this.base, 'group.id': groupId, 'enable.auto.commit': false });
        routeRdLogs(c, this.host.logger, `offsets of group ${groupId}`);
        await rdCall(`connect a consumer of group ${groupId}`, (cb) => c.connect(null, cb));
        return c;
      })();
      this.idle.set(groupId, p);
      p.catch(() => this.idle.delete(groupId));
    }
    return p;
  }

  async close(): Promise<void> {
    const idle = [...this.idle.values()];
    this.idle.clear();
    await Promise.all(
      idle.map(async (p) => {
        const c = await p.catch(() => null);
        if (c) await withDeadline('disconnect a consumer', 10_000, rdCall('disconnect', (cb) => c.disconnect(cb))).catch(() => {});
      }),
    );
  }
}
