// Options of the Kafka event log, each with its default, compiled once into a frozen, fully specified object.
// Validation names the exact field that is wrong (`log.ssl.ca must be ...`), so a bad config file fails at
// start-up with a message a user can act on, not later inside kafkajs.
import { RlstreamError } from '../../errors.ts';

export type SaslMechanism = 'plain' | 'scram-sha-256' | 'scram-sha-512';
export type Compression = 'none' | 'gzip';
/** The client library: kafkajs (pure JavaScript) or librdkafka (@confluentinc/kafka-javascript, built by infra/setup.sh). */
export type KafkaClient = 'kafkajs' | 'librdkafka';
export const KAFKA_CLIENTS: readonly KafkaClient[] = ['kafkajs', 'librdkafka'];
/** The client when the configuration names none: the faster one on this project's benchmarks (docs/kafka.md). */
export const DEFAULT_KAFKA_CLIENT: KafkaClient = 'librdkafka';
/** How much of the client library's own log reaches ours. */
export const KAFKA_CLIENT_LOG_LEVELS = ['error', 'warn', 'info', 'debug', 'nothing'] as const;
export type KafkaClientLogLevel = (typeof KAFKA_CLIENT_LOG_LEVELS)[number];

export interface KafkaSslOptions {
  /** Verify the broker's certificate (default true). */
  rejectUnauthorized?: boolean;
  /** PEM text of the CA certificates to trust, client certificate and key (all optional). */
  ca?: string | string[];
  cert?: string;
  key?: string;
  /** Expected server name when it differs from the broker host. */
  servername?: string;
}

export interface KafkaSaslOptions {
  mechanism: SaslMechanism;
  username: string;
  password: string;
}

export interface KafkaLogOptions {
  /** host:port of one or more bootstrap brokers (required). */
  brokers: string[];
  /** Client library (default DEFAULT_KAFKA_CLIENT). */
  client?: KafkaClient;
  /** Client id sent to the brokers (default 'rlstream'). */
  clientId?: string;
  /** TLS: true for system CAs, or options (default off). */
  ssl?: boolean | KafkaSslOptions;
  sasl?: KafkaSaslOptions;
  /** Time to open a connection, ms (default 3000). */
  connectionTimeoutMs?: number;
  /** Time for a request to be answered, ms (default 30000). */
  requestTimeoutMs?: number;
  /** Producer compression unless a producer asks otherwise (default 'none'). snappy/lz4/zstd need codecs kafkajs does not bundle. */
  compression?: Compression;
  /** Consumer group session timeout, ms (default 10000): how long a silent member keeps its partitions. */
  sessionTimeoutMs?: number;
  /** Consumer heartbeat interval, ms (default 1000). */
  heartbeatIntervalMs?: number;
  /** A consumer pauses a partition once this many of its records wait in memory unpolled (default 5000). */
  maxBufferedRecords?: number;
  /** Longest time a fetch waits on the broker for new data, ms (default 100): bounds poll's reaction time. */
  maxWaitTimeMs?: number;
  /** A transaction that stays open longer is aborted by the broker, ms (default 60000). */
  transactionTimeoutMs?: number;
  /** Bytes per produce request, split across requests when a send is larger (default 1 MiB). */
  maxRequestBytes?: number;
  /** The client library's own log lines at this level and above, routed into our Logger (default 'warn'). */
  clientLogLevel?: KafkaClientLogLevel;
  /**
   * librdkafka only: its debug contexts (its `debug` setting, e.g. 'eos,broker,cgrp'), logged at debug level
   * through our Logger; clientLogLevel becomes 'debug'. Default none.
   */
  clientDebug?: string;
}

export interface CompiledKafkaLogOptions {
  readonly brokers: readonly string[];
  readonly client: KafkaClient;
  readonly clientId: string;
  readonly ssl: false | true | Readonly<KafkaSslOptions>;
  readonly sasl: Readonly<KafkaSaslOptions> | null;
  readonly connectionTimeoutMs: number;
  readonly requestTimeoutMs: number;
  readonly compression: Compression;
  readonly sessionTimeoutMs: number;
  readonly heartbeatIntervalMs: number;
  readonly maxBufferedRecords: number;
  readonly maxWaitTimeMs: number;
  readonly transactionTimeoutMs: number;
  readonly maxRequestBytes: number;
  readonly clientLogLevel: KafkaClientLogLevel;
  /** librdkafka's debug contexts, comma-separated; null: none. */
  readonly clientDebug: string | null;
}

const KNOWN = new Set([
  'kind',
  'brokers',
  'client',
  'clientId',
  'ssl',
  'sasl',
  'connectionTimeoutMs',
  'requestTimeoutMs',
  'compression',
  'sessionTimeoutMs',
  'heartbeatIntervalMs',
  'maxBufferedRecords',
  'maxWaitTimeMs',
  'transactionTimeoutMs',
  'maxRequestBytes',
  'clientLogLevel',
  'clientDebug',
]);

/**
 * librdkafka's debug contexts that may be asked for. 'conf' and 'all' are left out: they log the client's whole
 * configuration at start-up, and a secret must never reach a log.
 */
export const RDKAFKA_DEBUG_CONTEXTS = ['generic', 'broker', 'topic', 'metadata', 'feature', 'queue', 'msg', 'protocol', 'cgrp', 'security', 'fetch', 'interceptor', 'plugin', 'consumer', 'admin', 'eos', 'assignor', 'telemetry'] as const;

/**
 * librdkafka's debug setting from a comma-separated list: the contexts normalised (null for none), or what is wrong
 * with it (said after the field's name, which the caller spells as its input does).
 */
export function parseClientDebug(v: unknown, client: KafkaClient): { contexts: string | null } | { problem: string } {
  if (v === undefined || v === null || v === '') return { contexts: null };
  if (typeof v !== 'string') return { problem: `must be a comma-separated list of librdkafka debug contexts, got ${describe(v)}` };
  if (client !== 'librdkafka') return { problem: `is librdkafka's debug setting and log.client is ${client}: remove it, or set log.client: librdkafka` };
  const contexts = v.split(',').map((c) => c.trim());
  const bad = contexts.filter((c) => !(RDKAFKA_DEBUG_CONTEXTS as readonly string[]).includes(c));
  if (bad.length > 0) return { problem: `names ${bad.map((c) => JSON.stringify(c)).join(', ')}: use librdkafka debug contexts from ${RDKAFKA_DEBUG_CONTEXTS.join(', ')} ('conf' and 'all' would log secrets)` };
  return { contexts: contexts.join(',') };
}
const BROKER = /^[A-Za-z0-9._-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$/;

function invalid(field: string, message: string): RlstreamError {
  return new RlstreamError('CONFIG_INVALID', `log.${field} ${message}`);
}

function describe(v: unknown): string {
  return v === undefined ? 'undefined' : JSON.stringify(v) ?? String(v);
}

function int(o: Record<string, unknown>, field: string, fallback: number, min: number): number {
  const v = o[field] ?? fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw invalid(field, `must be an integer >= ${min}, got ${describe(o[field])}`);
  return v;
}

function oneOf<T extends string>(o: Record<string, unknown>, field: string, allowed: readonly T[], fallback: T, prefix = ''): T {
  const v = o[field] ?? fallback;
  if (typeof v !== 'string' || !allowed.includes(v as T)) throw invalid(prefix + field, `must be one of ${allowed.join(', ')}, got ${describe(o[field])}`);
  return v as T;
}

function pem(value: unknown, field: string): void {
  if (value === undefined) return;
  const list = Array.isArray(value) ? value : [value];
  list.forEach((v, i) => {
    const at = Array.isArray(value) ? `${field}[${i}]` : field;
    if (typeof v !== 'string' || !v.includes('-----BEGIN ')) throw invalid(at, 'must be PEM text (-----BEGIN ...)');
  });
}

function compileSsl(v: unknown): CompiledKafkaLogOptions['ssl'] {
  if (v === undefined || v === false) return false;
  if (v === true) return true;
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw invalid('ssl', `must be true, false or an object, got ${describe(v)}`);
  const s = v as Record<string, unknown>;
  for (const k of Object.keys(s)) if (!['rejectUnauthorized', 'ca', 'cert', 'key', 'servername'].includes(k)) throw invalid(`ssl.${k}`, 'is not a known option');
  if (s['rejectUnauthorized'] !== undefined && typeof s['rejectUnauthorized'] !== 'boolean') throw invalid('ssl.rejectUnauthorized', 'must be a boolean');
  pem(s['ca'], 'ssl.ca');
  pem(s['cert'], 'ssl.cert');
  pem(s['key'], 'ssl.key');
  if ((s['cert'] === undefined) !== (s['key'] === undefined)) throw invalid(s['cert'] === undefined ? 'ssl.cert' : 'ssl.key', 'is required when the other half of the client certificate is given');
  if (s['servername'] !== undefined && (typeof s['servername'] !== 'string' || s['servername'] === '')) throw invalid('ssl.servername', 'must be a non-empty string');
  return Object.freeze({ ...(s as KafkaSslOptions) });
}

function compileSasl(v: unknown): Readonly<KafkaSaslOptions> | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== 'object' || Array.isArray(v)) throw invalid('sasl', `must be an object, got ${describe(v)}`);
  const s = v as Record<string, unknown>;
  const mechanism = oneOf(s, 'mechanism', ['plain', 'scram-sha-256', 'scram-sha-512'] as const, undefined as never, 'sasl.');
  for (const f of ['username', 'password'] as const) {
    if (typeof s[f] !== 'string' || s[f] === '') throw invalid(`sasl.${f}`, 'must be a non-empty string');
  }
  return Object.freeze({ mechanism, username: s['username'] as string, password: s['password'] as string });
}

export function compileKafkaLogOptions(input: unknown): CompiledKafkaLogOptions {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) throw new RlstreamError('CONFIG_INVALID', 'log options must be an object');
  const o = input as Record<string, unknown>;
  for (const k of Object.keys(o)) if (!KNOWN.has(k)) throw invalid(k, 'is not a known Kafka log option');
  const brokers = o['brokers'];
  if (!Array.isArray(brokers) || brokers.length === 0) throw invalid('brokers', `must be a non-empty list of host:port, got ${describe(brokers)}`);
  brokers.forEach((b, i) => {
    if (typeof b !== 'string' || !BROKER.test(b)) throw invalid(`brokers[${i}]`, `must be host:port, got ${describe(b)}`);
  });
  const clientId = o['clientId'] ?? 'rlstream';
  if (typeof clientId !== 'string' || clientId === '') throw invalid('clientId', 'must be a non-empty string');
  const sasl = compileSasl(o['sasl']);
  const heartbeatIntervalMs = int(o, 'heartbeatIntervalMs', 1000, 100);
  const sessionTimeoutMs = int(o, 'sessionTimeoutMs', 10_000, 1000);
  if (heartbeatIntervalMs * 3 > sessionTimeoutMs) throw invalid('heartbeatIntervalMs', `(${heartbeatIntervalMs}) must be at most a third of sessionTimeoutMs (${sessionTimeoutMs})`);
  const client = oneOf(o, 'client', KAFKA_CLIENTS, DEFAULT_KAFKA_CLIENT);
  const debug = parseClientDebug(o['clientDebug'], client);
  if ('problem' in debug) throw invalid('clientDebug', debug.problem);
  const clientDebug = debug.contexts;
  return Object.freeze({
    brokers: Object.freeze([...(brokers as string[])]),
    client,
    clientId,
    ssl: compileSsl(o['ssl']),
    sasl,
    connectionTimeoutMs: int(o, 'connectionTimeoutMs', 3000, 1),
    requestTimeoutMs: int(o, 'requestTimeoutMs', 30_000, 1),
    compression: oneOf(o, 'compression', ['none', 'gzip'] as const, 'none'),
    sessionTimeoutMs,
    heartbeatIntervalMs,
    maxBufferedRecords: int(o, 'maxBufferedRecords', 5000, 1),
    maxWaitTimeMs: int(o, 'maxWaitTimeMs', 100, 0),
    transactionTimeoutMs: int(o, 'transactionTimeoutMs', 60_000, 1000),
    maxRequestBytes: int(o, 'maxRequestBytes', 1024 * 1024, 1024),
    clientLogLevel: clientDebug !== null ? 'debug' : oneOf(o, 'clientLogLevel', KAFKA_CLIENT_LOG_LEVELS, 'warn'),
    clientDebug,
  });
}
