// Translates librdkafka's errors (a numeric code, negative for the client's own conditions, plus its
// fatal / retriable / transaction-requires-abort flags) into the RlstreamError catalogue, as ../errors.ts does
// for kafkajs: fencing is LOG_FENCED, losing the brokers LOG_UNAVAILABLE and retriable.
import { RlstreamError, type ErrorCode } from '../../../errors.ts';
import { markStuck } from '../../../stuck-calls.ts';
import type { RdError } from './binding.ts';

/** librdkafka's codes used here (rdkafka.h, rd_kafka_resp_err_t). */
export const RD = {
  BAD_MSG: -199,
  DESTROY: -197,
  TRANSPORT: -195,
  MSG_TIMED_OUT: -192,
  UNKNOWN_PARTITION: -190,
  ALL_BROKERS_DOWN: -187,
  TIMED_OUT: -185,
  QUEUE_FULL: -184,
  STATE: -172,
  REVOKE_PARTITIONS: -174,
  ASSIGN_PARTITIONS: -175,
  UNKNOWN_TOPIC_LOCAL: -188,
  FENCED: -144,
  TIMED_OUT_QUEUE: -166,
  UNKNOWN_TOPIC_OR_PART: 3,
  MSG_SIZE_TOO_LARGE: 10,
  COORDINATOR_LOAD_IN_PROGRESS: 14,
  COORDINATOR_NOT_AVAILABLE: 15,
  NOT_COORDINATOR: 16,
  RECORD_LIST_TOO_LARGE: 18,
  ILLEGAL_GENERATION: 22,
  UNKNOWN_MEMBER_ID: 25,
  REBALANCE_IN_PROGRESS: 27,
  TOPIC_ALREADY_EXISTS: 36,
  INVALID_PARTITIONS: 37,
  INVALID_REPLICATION_FACTOR: 38,
  INVALID_PRODUCER_EPOCH: 47,
  INVALID_TXN_STATE: 48,
  INVALID_PRODUCER_ID_MAPPING: 49,
  CONCURRENT_TRANSACTIONS: 51,
  PRODUCER_FENCED: 90,
} as const;

const FENCED = new Set<number>([RD.FENCED, RD.PRODUCER_FENCED, RD.INVALID_PRODUCER_EPOCH, RD.INVALID_PRODUCER_ID_MAPPING]);
const UNAVAILABLE = new Set<number>([RD.TRANSPORT, RD.ALL_BROKERS_DOWN, RD.TIMED_OUT, RD.MSG_TIMED_OUT, RD.TIMED_OUT_QUEUE, RD.COORDINATOR_LOAD_IN_PROGRESS, RD.COORDINATOR_NOT_AVAILABLE, RD.NOT_COORDINATOR, RD.CONCURRENT_TRANSACTIONS]);
const REBALANCE = new Set<number>([RD.REBALANCE_IN_PROGRESS, RD.ILLEGAL_GENERATION, RD.UNKNOWN_MEMBER_ID]);
const BY_CODE: Record<number, ErrorCode> = {
  [RD.UNKNOWN_TOPIC_OR_PART]: 'LOG_UNKNOWN_TOPIC',
  [RD.UNKNOWN_TOPIC_LOCAL]: 'LOG_UNKNOWN_TOPIC',
  [RD.UNKNOWN_PARTITION]: 'LOG_UNKNOWN_PARTITION',
  [RD.TOPIC_ALREADY_EXISTS]: 'LOG_TOPIC_EXISTS',
  [RD.MSG_SIZE_TOO_LARGE]: 'LOG_RECORD_TOO_LARGE',
  [RD.RECORD_LIST_TOO_LARGE]: 'LOG_RECORD_TOO_LARGE',
  [RD.INVALID_TXN_STATE]: 'LOG_TRANSACTION_STATE',
  [RD.BAD_MSG]: 'LOG_CORRUPT',
  [RD.INVALID_PARTITIONS]: 'INPUT_INVALID',
  [RD.INVALID_REPLICATION_FACTOR]: 'INPUT_INVALID',
};

function codeOf(err: unknown): number | undefined {
  const c = (err as { code?: unknown } | null)?.code;
  return typeof c === 'number' ? c : undefined;
}

export function isRdFenced(err: unknown): boolean {
  const c = codeOf(err);
  return (c !== undefined && FENCED.has(c)) || /fenced/i.test((err as { message?: string } | null)?.message ?? '');
}

export function isRdRebalance(err: unknown): boolean {
  const c = codeOf(err);
  return c !== undefined && REBALANCE.has(c);
}

/** Whether a transactional call was turned away unprocessed by a busy coordinator (see ../errors.ts). */
export function isRdCoordinatorBusy(err: unknown): boolean {
  const c = codeOf(err);
  return c === RD.CONCURRENT_TRANSACTIONS || c === RD.COORDINATOR_LOAD_IN_PROGRESS || c === RD.COORDINATOR_NOT_AVAILABLE || c === RD.NOT_COORDINATOR;
}

/** An RlstreamError for anything the binding reported; `what` says what was being done. */
export function fromRdKafka(err: unknown, what: string): RlstreamError {
  if (err instanceof RlstreamError) return err;
  const e = (err ?? {}) as Partial<RdError>;
  const detail = `${e.message ?? String(err)}${e.code !== undefined ? ` (librdkafka ${e.code})` : ''}`;
  if (isRdFenced(err)) return new RlstreamError('LOG_FENCED', `${what}: the producer was fenced by a newer one with the same transactionalId (${detail})`, { cause: err });
  const c = codeOf(err);
  const mapped = c !== undefined ? BY_CODE[c] : undefined;
  if (mapped) return new RlstreamError(mapped, `${what}: ${detail}`, { cause: err });
  if ((c !== undefined && (UNAVAILABLE.has(c) || REBALANCE.has(c))) || (e.isRetriable === true && e.isFatal !== true)) {
    return new RlstreamError('LOG_UNAVAILABLE', `${what}: Kafka is unreachable or busy (${detail})`, { cause: err, retriable: true });
  }
  return new RlstreamError('INTERNAL', `${what}: ${detail}`, { cause: err, retriable: false });
}

/** A callback-style binding call as a promise, its failure translated. */
export function rdCall<T = void>(what: string, call: (cb: (err: RdError | null | undefined, value?: T) => void) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    try {
      call((err, value) => (err ? reject(fromRdKafka(err, what)) : resolve(value as T)));
    } catch (err) {
      reject(fromRdKafka(err, what));
    }
  });
}

/**
 * `call`, or a failure once `ms` pass without an answer. librdkafka's transactional calls take their own time
 * limit, yet one was seen never to call back across a broker restart (a trainer waited in sendOffsetsToTransaction
 * for minutes and could not stop): the deadline turns that into an error a role stops on (not retriable: the
 * producer's state is unknown), so that a restart resumes from the log.
 */
export function withDeadline<T>(what: string, ms: number, call: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  let release: (() => void) | null = null;
  const settled = () => release?.();
  void call.then(settled, settled);
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      // The call still holds a thread of libuv's pool: the process must not wait for it at exit (core/stuck-calls.ts).
      // A call that settled first has cleared this timer (race -> finally) before any timer could run.
      release = markStuck(`librdkafka ${what}`);
      reject(new RlstreamError('LOG_UNAVAILABLE', `${what}: librdkafka did not answer within ${ms >= 1000 ? `${Math.round(ms / 1000)} s` : `${ms} ms`}; its state is unknown, so this client stops`, { retriable: false }));
    }, ms);
  });
  return Promise.race([call, expired]).finally(() => clearTimeout(timer));
}
