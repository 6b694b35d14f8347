// The serving endpoint's one catalogue of error codes: each has an HTTP status, an OpenAI error `type` (what the
// OpenAI SDKs map to their exception classes) and a message template. Answers have OpenAI's shape,
// `{ error: { message, type, code, param } }`, so an agent's own error handling works unchanged.
import { CatalogueError, type CatalogueParams } from '../../core/catalogue-error.ts';

const SERVE_ERRORS = {
  SRV_ERR_UNAUTHENTICATED: { status: 401, type: 'authentication_error', message: 'a valid bearer token is required (Authorization: Bearer <token>)' },
  SRV_ERR_AUTH_LIMITED: { status: 429, type: 'rate_limit_error', message: 'too many failed authentications; retry in {after} s' },
  SRV_ERR_VALIDATION: { status: 400, type: 'invalid_request_error', message: 'invalid request: {detail}' },
  SRV_ERR_PROMPT_TOO_LONG: { status: 400, type: 'invalid_request_error', message: 'the prompt is {tokens} tokens; this endpoint takes at most {limit} (serve.max_prompt_tokens){detail}' },
  SRV_ERR_READ_TIMEOUT: { status: 408, type: 'invalid_request_error', message: 'the request was not received within {limit} ms (serve.request_read_timeout_ms)' },
  SRV_ERR_FAIR_SHARE: { status: 429, type: 'rate_limit_error', message: 'this token holds {held} of its share of {share} {what}; complete some or retry later' },
  SRV_ERR_BAD_JSON: { status: 400, type: 'invalid_request_error', message: 'request body is not valid JSON' },
  SRV_ERR_BODY_TOO_LARGE: { status: 413, type: 'invalid_request_error', message: 'request body is larger than {limit} bytes' },
  SRV_ERR_MODEL: { status: 404, type: 'invalid_request_error', message: 'model {model} is not served here (served: {served})' },
  SRV_ERR_HISTORY: { status: 409, type: 'invalid_request_error', message: 'the conversation does not continue its trajectory: {detail}' },
  SRV_ERR_TOOL_CALL: { status: 400, type: 'invalid_request_error', message: 'tool result refused: {detail}' },
  SRV_ERR_TOOLS_CHANGED: { status: 400, type: 'invalid_request_error', message: 'the tools differ from those the trajectory started with ({detail}); the prompt was rendered with those' },
  SRV_ERR_TRAJECTORY_UNKNOWN: { status: 404, type: 'invalid_request_error', message: 'no open trajectory {id}' },
  SRV_ERR_TRAJECTORY_DONE: { status: 409, type: 'invalid_request_error', message: 'trajectory {id} is already completed ({termination})' },
  SRV_ERR_TRAJECTORY_BUSY: { status: 409, type: 'invalid_request_error', message: 'trajectory {id} has a call in flight; calls of one trajectory must not overlap' },
  SRV_ERR_SESSIONS_FULL: { status: 429, type: 'rate_limit_error', message: '{limit} trajectories are open; complete one or retry later' },
  SRV_ERR_GROUP: { status: 400, type: 'invalid_request_error', message: 'bad group: {detail}' },
  SRV_ERR_ROUTE_NOT_FOUND: { status: 404, type: 'invalid_request_error', message: 'no route {method} {url}' },
  SRV_ERR_BACKEND: { status: 503, type: 'server_error', message: 'the backend did not answer: {detail}' },
  SRV_ERR_MODEL_OUTPUT: { status: 500, type: 'model_error', message: 'The model produced invalid content: {detail}. Consider modifying your prompt if you are seeing this error persistently.' },
  SRV_ERR_INTERNAL: { status: 500, type: 'server_error', message: 'internal error (see the server log, request {requestId})' },
} as const satisfies Record<string, { status: number; type: string; message: string }>;

export type ServeErrorCode = keyof typeof SERVE_ERRORS;

export class ServeError extends CatalogueError<ServeErrorCode> {
  readonly type: string;
  /** The request field the error is about (OpenAI's `param`), e.g. `messages[2].content` or `top_k`. */
  readonly param: string | null;

  constructor(code: ServeErrorCode, params: CatalogueParams = {}, options: { cause?: unknown; param?: string | null } = {}) {
    super(SERVE_ERRORS, code, params, options);
    this.name = 'ServeError';
    this.type = SERVE_ERRORS[code].type;
    this.param = options.param ?? null;
  }

  body(): { error: { message: string; type: string; code: string; param: string | null } } {
    return { error: { message: this.message, type: this.type, code: this.code, param: this.param } };
  }
}
