// One catalogue of error codes. `retriable` says whether the same call may succeed if tried again; retries are made
// by core/retry.ts alone (isRetriable), everything else just throws.

export type ErrorCode =
  | 'CONFIG_INVALID'
  | 'SERDE_MAGIC_BYTE'
  | 'SERDE_TRUNCATED'
  | 'SERDE_UNKNOWN_SCHEMA'
  | 'SERDE_SCHEMA_MISMATCH'
  | 'SERDE_DECODE'
  | 'REGISTRY_INCOMPATIBLE'
  | 'REGISTRY_UNAVAILABLE'
  | 'LOG_TOPIC_EXISTS'
  | 'LOG_UNKNOWN_TOPIC'
  | 'LOG_UNKNOWN_PARTITION'
  | 'LOG_CORRUPT'
  | 'LOG_LOCKED'
  | 'LOG_READ_ONLY'
  | 'LOG_CLOSED'
  | 'LOG_RECORD_TOO_LARGE'
  | 'LOG_TRANSACTION_STATE'
  | 'LOG_FENCED'
  | 'LOG_UNAVAILABLE'
  | 'NATIVE_INVALID_ARGUMENT'
  | 'NATIVE_NON_FINITE'
  | 'WEIGHTS_CHECKSUM'
  | 'WEIGHTS_FORMAT'
  | 'TOKENIZER'
  | 'TOOL_INVALID_ARGS'
  | 'TOOL_TIMEOUT'
  | 'TOOL_UNKNOWN'
  | 'BACKEND_BAD_REQUEST'
  | 'BACKEND_UNAVAILABLE'
  | 'REWARD_FAILED'
  | 'REWARD_NON_FINITE'
  | 'INPUT_INVALID'
  | 'TRACE_STORE'
  | 'INTERNAL';

const RETRIABLE: ReadonlySet<ErrorCode> = new Set<ErrorCode>(['REGISTRY_UNAVAILABLE', 'LOG_UNAVAILABLE', 'BACKEND_UNAVAILABLE']);

export class RlstreamError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;

  constructor(code: ErrorCode, message: string, options: { cause?: unknown; retriable?: boolean } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'RlstreamError';
    this.code = code;
    this.retriable = options.retriable ?? RETRIABLE.has(code);
  }
}

export function isRlstreamError(err: unknown, code?: ErrorCode): err is RlstreamError {
  return err instanceof RlstreamError && (code === undefined || err.code === code);
}

/** A short, log-safe description of any thrown value. */
export function describeError(err: unknown): string {
  if (err instanceof RlstreamError) return `${err.code}: ${err.message}`;
  if (err instanceof Error) return `${err.name}: ${err.message}`;
  return String(err);
}
