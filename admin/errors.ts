// The admin API's one catalogue of error codes: each code has an HTTP status and a message template with
// {placeholders} (core/catalogue-error.ts). Codes are stable (clients and tests match on them); messages may improve.
import { CatalogueError, type CatalogueParams } from '../core/catalogue-error.ts';

const ADMIN_ERRORS = {
  ADM_ERR_UNAUTHENTICATED: { status: 401, message: 'a valid bearer token is required' },
  ADM_ERR_FORBIDDEN: { status: 403, message: 'this route needs the {role} role' },
  ADM_ERR_NOT_FOUND: { status: 404, message: '{what} not found' },
  ADM_ERR_ROUTE_NOT_FOUND: { status: 404, message: 'no route {method} {url}' },
  ADM_ERR_METHOD_NOT_ALLOWED: { status: 405, message: '{method} is not allowed on {url} (allowed: {allow})' },
  ADM_ERR_URI_TOO_LONG: { status: 414, message: 'a path parameter is longer than {limit} characters' },
  ADM_ERR_VALIDATION: { status: 400, message: 'invalid request: {detail}' },
  ADM_ERR_BAD_JSON: { status: 400, message: 'request body is not valid JSON' },
  ADM_ERR_UNSUPPORTED_MEDIA_TYPE: { status: 415, message: 'unsupported content type {type}' },
  ADM_ERR_BODY_TOO_LARGE: { status: 413, message: 'request body is larger than {limit} bytes' },
  ADM_ERR_RATE_LIMITED: { status: 429, message: 'rate limit exceeded, retry in {after}' },
  ADM_ERR_BUSY: { status: 429, message: '{what} is busy ({detail}); retry later' },
  ADM_ERR_SQL_REFUSED: { status: 403, message: 'the SQL route is read-only: {detail}' },
  ADM_ERR_SQL_INVALID: { status: 400, message: 'query failed: {detail}' },
  ADM_ERR_SQL_LIMIT: { status: 422, message: 'query exceeded a limit: {detail}' },
  ADM_ERR_QUERY_UNKNOWN: { status: 404, message: 'no named query {name}' },
  ADM_ERR_QUERY_PARAMS: { status: 400, message: 'bad parameters for {name}: {detail}' },
  ADM_ERR_UNAVAILABLE: { status: 503, message: '{what} is not available in this process' },
  ADM_ERR_NOT_READY: { status: 503, message: 'not ready: {detail}' },
  ADM_ERR_CONFLICT: { status: 409, message: '{detail}' },
  ADM_ERR_INTERNAL: { status: 500, message: 'internal error (see the server log, request {requestId})' },
} as const satisfies Record<string, { status: number; message: string }>;

export type AdminErrorCode = keyof typeof ADMIN_ERRORS;

/** An error with a catalogue code; the server's error handler turns it into `{ code, message, statusCode }`. */
export class AdminError extends CatalogueError<AdminErrorCode> {
  constructor(code: AdminErrorCode, params: CatalogueParams = {}, options: { cause?: unknown } = {}) {
    super(ADMIN_ERRORS, code, params, options);
    this.name = 'AdminError';
  }
}

export function isAdminError(err: unknown): err is AdminError {
  return err instanceof AdminError;
}
