// Translates kafkajs errors into RlstreamError codes, so callers handle one error catalogue whatever the log.
// Fencing (a newer producer took over the transactional id) is LOG_FENCED and must end the producer; losing
// the brokers is LOG_UNAVAILABLE and retriable. kafkajs wraps causes (retries exceeded, aggregate errors), so
// the whole chain is searched.
import { RlstreamError, type ErrorCode } from '../../errors.ts';

interface KafkaJsLike {
  name?: string;
  type?: string;
  code?: number;
  message?: string;
  retriable?: boolean;
  cause?: unknown;
  originalError?: unknown;
  errors?: unknown[];
}

// Kafka's PRODUCER_FENCED (code 90) postdates kafkajs, which reports it as "Unknown error code 90".
const FENCED_TYPES = new Set(['INVALID_PRODUCER_EPOCH', 'PRODUCER_FENCED', 'INVALID_PRODUCER_ID_MAPPING']);
const FENCED_CODES = new Set([47, 49, 90]);
const UNKNOWN_FENCED = /^Unknown error code (47|49|90)$/;
const UNAVAILABLE_NAMES = new Set([
  'KafkaJSConnectionError',
  'KafkaJSConnectionClosedError',
  'KafkaJSRequestTimeoutError',
  'KafkaJSBrokerNotFound',
  'KafkaJSNoBrokerAvailableError',
  'KafkaJSGroupCoordinatorNotFound',
  'KafkaJSLockTimeout',
  'KafkaJSTimeout',
]);
const BY_TYPE: Record<string, ErrorCode> = {
  UNKNOWN_TOPIC_OR_PARTITION: 'LOG_UNKNOWN_TOPIC',
  TOPIC_ALREADY_EXISTS: 'LOG_TOPIC_EXISTS',
  MESSAGE_TOO_LARGE: 'LOG_RECORD_TOO_LARGE',
  RECORD_LIST_TOO_LARGE: 'LOG_RECORD_TOO_LARGE',
  INVALID_TXN_STATE: 'LOG_TRANSACTION_STATE',
  CORRUPT_MESSAGE: 'LOG_CORRUPT',
  INVALID_PARTITIONS: 'INPUT_INVALID',
  INVALID_TOPIC_EXCEPTION: 'INPUT_INVALID',
  INVALID_REPLICATION_FACTOR: 'INPUT_INVALID',
};

function chain(err: unknown): KafkaJsLike[] {
  const out: KafkaJsLike[] = [];
  const todo: unknown[] = [err];
  while (todo.length > 0 && out.length < 16) {
    const e = todo.shift();
    if (typeof e !== 'object' || e === null) continue;
    const k = e as KafkaJsLike;
    out.push(k);
    if (k.cause !== undefined) todo.push(k.cause);
    if (k.originalError !== undefined) todo.push(k.originalError);
    if (Array.isArray(k.errors)) todo.push(...k.errors);
  }
  return out;
}

/**
 * Transaction-coordinator answers that turn a request away without acting on it, and that Kafka's own clients
 * retry after a pause: CONCURRENT_TRANSACTIONS (the previous transaction of this id is still being completed,
 * e.g. back-to-back transactions, or right after a restart fenced an open one), a coordinator loading its log
 * or moved to another broker (kafkajs still uses the old GROUP_* names for codes 14 to 16).
 */
const COORDINATOR_BUSY = new Set([
  'CONCURRENT_TRANSACTIONS',
  'COORDINATOR_LOAD_IN_PROGRESS',
  'COORDINATOR_NOT_AVAILABLE',
  'NOT_COORDINATOR',
  'GROUP_LOAD_IN_PROGRESS',
  'GROUP_COORDINATOR_NOT_AVAILABLE',
  'NOT_COORDINATOR_FOR_GROUP',
]);

/** Whether a coordinator turned the request away unprocessed (see COORDINATOR_BUSY): retrying it is safe. */
export function isCoordinatorBusy(err: unknown): boolean {
  return chain(err).some((e) => e.type !== undefined && COORDINATOR_BUSY.has(e.type));
}

export function isFenced(err: unknown): boolean {
  return chain(err).some(
    (e) => (e.type !== undefined && FENCED_TYPES.has(e.type)) || (e.name === 'KafkaJSProtocolError' && e.code !== undefined && FENCED_CODES.has(e.code)) ||
      UNKNOWN_FENCED.test(e.message ?? '') ||
      /fenced/i.test(e.message ?? ''),
  );
}

/** An RlstreamError for anything kafkajs threw; `what` says what was being done ("send to topic x"). */
export function fromKafka(err: unknown, what: string): RlstreamError {
  if (err instanceof RlstreamError) return err;
  const links = chain(err);
  const detail = links.map((e) => e.type ?? e.message).find((m) => m) ?? String(err);
  if (isFenced(err)) return new RlstreamError('LOG_FENCED', `${what}: the producer was fenced by a newer one with the same transactionalId (${detail})`, { cause: err });
  for (const e of links) {
    const code = e.type !== undefined ? BY_TYPE[e.type] : undefined;
    if (code) return new RlstreamError(code, `${what}: ${e.message ?? e.type}`, { cause: err });
  }
  if (links.some((e) => e.name !== undefined && UNAVAILABLE_NAMES.has(e.name))) {
    return new RlstreamError('LOG_UNAVAILABLE', `${what}: Kafka is unreachable (${detail})`, { cause: err, retriable: true });
  }
  // kafkajs wraps the last error of its own retries (KafkaJSNumberOfRetriesExceeded, not retriable itself); the
  // condition underneath, e.g. CONCURRENT_TRANSACTIONS, is still a transient one.
  const retriable = links.some((e) => e.retriable === true);
  return new RlstreamError(retriable ? 'LOG_UNAVAILABLE' : 'INTERNAL', `${what}: ${detail}`, { cause: err, retriable });
}
