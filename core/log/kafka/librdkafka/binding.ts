// The part of @confluentinc/kafka-javascript (librdkafka's Node binding) this client uses, declared here, and
// its loader. The package is not an npm dependency: its install builds librdkafka from source (its prebuilt
// binaries come from a host many machines cannot reach), which would make every `npm ci` take minutes or fail.
// `bash infra/setup.sh --kafka-native` builds it once into .infra/kafka-javascript/<version>/; it is loaded
// only when `log.client: librdkafka` is chosen. A copy installed into node_modules by a user is used first.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RlstreamError } from '../../../errors.ts';

/** The version infra/setup.sh builds (keep in step with KAFKA_JAVASCRIPT_VERSION in infra/env.sh). */
export const KAFKA_JAVASCRIPT_VERSION = '1.10.1';
const PACKAGE = '@confluentinc/kafka-javascript';

export interface RdError extends Error {
  code: number;
  errno?: number;
  origin?: string;
  isFatal?: boolean;
  isRetriable?: boolean;
  isTxnRequiresAbort?: boolean;
}

export type RdCallback<T = void> = (err: RdError | null | undefined, value: T) => void;

export interface RdTopicPartition {
  topic: string;
  partition: number;
  offset?: number;
  error?: RdError;
}

export interface RdMessage {
  topic: string;
  partition: number;
  offset: number;
  value: Buffer | null;
  key?: Buffer | null;
  timestamp?: number;
  headers?: { [name: string]: Buffer }[];
  size: number;
}

/** What consumeBatch hands over: the topics its messages name, then per message 40 bytes of metadata and its bytes. */
export interface RdBatch {
  topics: string[];
  meta: Buffer;
  data: Buffer;
}

export interface RdDeliveryReport {
  topic: string;
  partition: number;
  offset: number;
  opaque?: unknown;
}

type Config = Record<string, string | number | boolean | ((...args: never[]) => void)>;

/** One of librdkafka's log lines: syslog severity (0-7), facility, text, and the client's librdkafka name. */
export interface RdLogEvent {
  severity: number;
  fac: string;
  message: string;
  name: string;
}

interface RdClient {
  connect(options: null | { timeout?: number }, cb: (err: RdError | null | undefined) => void): void;
  isConnected(): boolean;
  on(event: 'event.error', listener: (err: RdError) => void): void;
  on(event: 'event.log', listener: (e: RdLogEvent) => void): void;
}

export interface RdKafkaConsumer extends RdClient {
  /** Leaves the group (librdkafka's consumer close) and destroys the client. */
  disconnect(cb: (err: RdError | null | undefined) => void): void;
  subscribe(topics: string[]): void;
  assign(assignments: RdTopicPartition[]): void;
  unassign(): void;
  assignments(): RdTopicPartition[];
  consume(n: number, cb: RdCallback<RdMessage[]>): void;
  /** Up to n messages as one packed batch (records.ts); only in a build with infra/kafka-native/binding-consume-batch.patch. */
  consumeBatch?(n: number, cb: RdCallback<RdBatch>): void;
  setDefaultConsumeTimeout(ms: number): void;
  setDefaultIsTimeoutOnlyForFirstMessage(only: boolean): void;
  position(toppars?: RdTopicPartition[]): RdTopicPartition[];
  committed(toppars: RdTopicPartition[], timeout: number, cb: RdCallback<RdTopicPartition[]>): void;
  commitCb(toppars: RdTopicPartition[], cb: (err: RdError | null) => void): void;
  seek(toppar: RdTopicPartition & { offset: number }, timeout: number, cb: (err: RdError | null) => void): void;
  queryWatermarkOffsets(topic: string, partition: number, timeout: number, cb: RdCallback<{ lowOffset: number; highOffset: number }>): void;
  rebalanceProtocol(): string;
}

export interface RdProducer extends RdClient {
  /** Flushes for up to `timeout` ms, then destroys the client. */
  disconnect(timeout: number, cb: (err: RdError | null | undefined) => void): void;
  produce(topic: string, partition: number, value: Buffer, key: Buffer | string | null, timestamp: number | null, opaque: unknown, headers: { [name: string]: Buffer }[] | undefined): void;
  on(event: 'event.error', listener: (err: RdError) => void): void;
  on(event: 'event.log', listener: (e: RdLogEvent) => void): void;
  on(event: 'delivery-report', listener: (err: RdError | null, report: RdDeliveryReport) => void): void;
  setPollInBackground(on: boolean): void;
  setPollInterval(ms: number): void;
  flush(timeout: number, cb: (err: RdError | null) => void): void;
  initTransactions(timeout: number, cb: (err: RdError | null) => void): void;
  beginTransaction(cb: (err: RdError | null) => void): void;
  commitTransaction(timeout: number, cb: (err: RdError | null) => void): void;
  abortTransaction(timeout: number, cb: (err: RdError | null) => void): void;
  sendOffsetsToTransaction(offsets: RdTopicPartition[], consumer: RdKafkaConsumer, timeout: number, cb: (err: RdError | null) => void): void;
}

export interface RdKafka {
  KafkaConsumer: new (conf: Config, topicConf?: Config) => RdKafkaConsumer;
  Producer: new (conf: Config, topicConf?: Config) => RdProducer;
  librdkafkaVersion: string;
  features: string[];
}

export type { Config as RdConfig };

/** Where infra/setup.sh puts the built package. */
export function builtPackageDir(): string {
  const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');
  const infra = process.env['RLSTREAM_INFRA_DIR'] ?? join(repo, '.infra');
  return join(infra, 'kafka-javascript', KAFKA_JAVASCRIPT_VERSION, 'node_modules', PACKAGE);
}

let loaded: RdKafka | null = null;

/** The binding, from node_modules or from infra/setup.sh's build; CONFIG_INVALID naming the fix when neither has it. */
export function loadRdKafka(): RdKafka {
  if (loaded) return loaded;
  const require = createRequire(import.meta.url);
  const built = builtPackageDir();
  const candidates = [PACKAGE, ...(existsSync(join(built, 'package.json')) ? [built] : [])];
  const failures: string[] = [];
  for (const c of candidates) {
    try {
      const m = require(c) as RdKafka;
      if (typeof m.KafkaConsumer === 'function' && typeof m.Producer === 'function') return (loaded = m);
      failures.push(`${c}: not the librdkafka binding`);
    } catch (err) {
      const e = err as { code?: string; message?: string };
      if (e.code === 'MODULE_NOT_FOUND' && c === PACKAGE) continue;
      failures.push(`${c}: ${e.message ?? String(err)}`);
    }
  }
  throw new RlstreamError(
    'CONFIG_INVALID',
    `log.client is librdkafka, but ${PACKAGE} ${KAFKA_JAVASCRIPT_VERSION} is not built: run \`bash infra/setup.sh --kafka-native\` ` +
      `(builds librdkafka from source into ${dirname(dirname(built))}, a few minutes), or choose log.client: kafkajs` +
      (failures.length > 0 ? ` (${failures.join('; ')})` : ''),
  );
}

/** Whether the binding loads here (benchmarks and tests pick their Kafka clients by it). */
export function rdKafkaAvailable(): boolean {
  try {
    loadRdKafka();
    return true;
  } catch {
    return false;
  }
}
