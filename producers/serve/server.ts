// The OpenAI-compatible HTTP endpoint (Fastify): /v1/chat/completions (tools, streaming and not), /v1/completions
// (streaming and not, one prompt or a list), /v1/models and /v1/models/{model}, POST /v1/trajectories/{id}/complete,
// the OpenAPI document at /openapi.json. Every route but /openapi.json needs a bearer token (core/auth/tokens.ts's
// TokenStore: sha256 digests, constant-time compare, failed attempts limited per client before any hashing);
// bodies are size-limited and must arrive within the read time-out; bodies are validated as sent (validation.ts);
// errors have OpenAI's shape, with `param` naming the field.
import type { ErrorObject } from 'ajv';
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import swagger from '@fastify/swagger';
import { describeError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import type { Logger } from '../../core/telemetry.ts';
import { AuthFailureLimiter, bearerToken, type TokenStore } from '../../core/auth/tokens.ts';
import type { GenerateResult } from '../backends/types.ts';
import type { ChatTokenizer } from '../tokenizer/chat-tokenizer.ts';
import { ServeError } from './errors.ts';
import {
  assistantWire,
  ChatCompletionRequest,
  ChatCompletionResponse,
  chatTools,
  clientMessage,
  CompleteRequest,
  CompleteResponse,
  CompletionRequest,
  CompletionResponse,
  ErrorResponse,
  ModelList,
  ModelObject,
} from './openai.ts';
import { ANONYMOUS, type ChoiceResult, type ServeService, type SessionNaming, type TurnOptions } from './service.ts';
import { serveValidatorCompiler, validationError } from './validation.ts';

/** One alternative of a token in OpenAI's chat shape. */
interface TokenAlternativeWire {
  token: string;
  logprob: number;
  bytes: number[];
}

/** One sampled token's log-prob in OpenAI's chat shape, with its alternatives when top_logprobs asks for them. */
interface TokenLogprob extends TokenAlternativeWire {
  top_logprobs: TokenAlternativeWire[];
}

/** Defaults of the limits (serve.* in the run config; docs/serve.md#limits). */
export const SERVE_DEFAULTS = { bodyLimitBytes: 4 * 1024 * 1024, requestReadTimeoutMs: 30_000 } as const;

export interface ServeServerOptions {
  service: ServeService;
  tokenizer: ChatTokenizer;
  tokens: TokenStore;
  /** The model id served (what /v1/models lists; requests naming another are refused). */
  model: string;
  logger: Logger;
  /** Largest request body in bytes (default 4 MiB: a long agent conversation is sent whole on every call). */
  bodyLimitBytes?: number;
  /** A request (headers and body) not received within this is answered 408 and its connection closed (default 30 s). */
  requestReadTimeoutMs?: number;
  /** Failed authentications per minute per client before 429 (default 30). */
  authFailuresPerMinute?: number;
}

/** Headers naming a call's trajectory (see docs/serve.md); each also has a `metadata` key. */
const NAMING_HEADERS = {
  trajectoryId: 'x-rlstream-trajectory',
  groupId: 'x-rlstream-group',
  groupSize: 'x-rlstream-group-size',
  sampleIndex: 'x-rlstream-sample-index',
} as const;

const ID_PATTERN = /^[A-Za-z0-9._:-]{1,200}$/;

function header(request: FastifyRequest, name: string): string | undefined {
  const v = request.headers[name];
  return typeof v === 'string' && v !== '' ? v : undefined;
}

function namedId(value: string | undefined, what: string): string | undefined {
  if (value === undefined) return undefined;
  if (!ID_PATTERN.test(value)) throw new ServeError('SRV_ERR_VALIDATION', { detail: `${what} must be 1-200 characters of A-Z a-z 0-9 . _ : -` });
  return value;
}

function namedInt(value: string | undefined, what: string, min: number): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > 65_536) throw new ServeError('SRV_ERR_VALIDATION', { detail: `${what} must be an integer ≥ ${min}, got ${JSON.stringify(value)}` });
  return n;
}

function naming(request: FastifyRequest, metadata: Record<string, string> | null | undefined): SessionNaming {
  const md = metadata ?? {};
  const out: SessionNaming = {};
  const trajectoryId = namedId(header(request, NAMING_HEADERS.trajectoryId) ?? md['trajectory_id'], 'the trajectory id');
  const groupId = namedId(header(request, NAMING_HEADERS.groupId) ?? md['group_id'], 'the group id');
  const groupSize = namedInt(header(request, NAMING_HEADERS.groupSize) ?? md['group_size'], 'group_size', 1);
  const sampleIndex = namedInt(header(request, NAMING_HEADERS.sampleIndex) ?? md['sample_index'], 'sample_index', 0);
  if (trajectoryId !== undefined) out.trajectoryId = trajectoryId;
  if (groupId !== undefined) out.groupId = groupId;
  if (groupSize !== undefined) out.groupSize = groupSize;
  if (sampleIndex !== undefined) out.sampleIndex = sampleIndex;
  if ((groupSize !== undefined || sampleIndex !== undefined) && groupId === undefined) throw new ServeError('SRV_ERR_GROUP', { detail: 'group_size and sample_index need a group id' });
  if (md['data_source'] !== undefined) out.dataSource = md['data_source'];
  if (md['ground_truth'] !== undefined) out.groundTruth = md['ground_truth'];
  if (md['agent_name'] !== undefined) out.agentName = md['agent_name'];
  return out;
}

function toServeError(err: unknown, request: FastifyRequest): ServeError {
  if (err instanceof ServeError) return err;
  const fe = err as Partial<FastifyError> & { validation?: ErrorObject[] };
  if (fe.validation) return validationError(fe.validation, err);
  if (fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE') return new ServeError('SRV_ERR_BODY_TOO_LARGE', { limit: request.routeOptions.bodyLimit ?? 0 }, { cause: err });
  if (fe.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || (err instanceof SyntaxError && fe.statusCode === 400)) return new ServeError('SRV_ERR_BAD_JSON', {}, { cause: err });
  if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) return new ServeError('SRV_ERR_VALIDATION', { detail: fe.message ?? 'bad request' }, { cause: err });
  return new ServeError('SRV_ERR_INTERNAL', { requestId: request.id }, { cause: err });
}

function finishReason(r: ChoiceResult): string {
  if (!r.served) return 'length';
  if (r.served.calls.length > 0) return 'tool_calls';
  return r.served.turn.gen.finishReason === 'length' ? 'length' : 'stop';
}

function extension(r: ChoiceResult): Record<string, unknown> {
  return {
    trajectory_id: r.session.id,
    group_id: r.session.meta.groupId,
    turn_index: r.served?.turn.turnIndex ?? -1,
    token_ids: r.served?.turn.gen.tokenIds ?? [],
    forced_tokens: r.served?.turn.gen.forced ?? 0,
    policy_version: r.served?.turn.gen.policyVersions.find((v) => v >= 0) ?? -1,
    completed: r.completed,
  };
}

function usage(results: ChoiceResult[]): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  const prompt = results[0]?.promptTokens ?? 0;
  const completion = results.reduce((a, r) => a + (r.served?.turn.gen.tokenIds.length ?? 0), 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

/** Stop strings as a list (OpenAI takes one string or a list). */
function stopList(stop: string | string[] | null | undefined): string[] {
  if (stop === undefined || stop === null) return [];
  return typeof stop === 'string' ? [stop] : stop;
}

export async function buildServeServer(o: ServeServerOptions): Promise<FastifyInstance> {
  const { service, tokenizer, tokens, logger } = o;
  const readTimeoutMs = o.requestReadTimeoutMs ?? SERVE_DEFAULTS.requestReadTimeoutMs;
  const app = Fastify({
    logger: false,
    bodyLimit: o.bodyLimitBytes ?? SERVE_DEFAULTS.bodyLimitBytes,
    // A client that trickles its headers or body is answered 408 and closed once this passes (Node's
    // requestTimeout covers receiving the request only, not generating the answer).
    requestTimeout: readTimeoutMs,
    // Node checks the time-outs of open requests every connectionsCheckingInterval (30 s by default, longer than the
    // time-out itself): a quarter of the time-out here, so a trickled request is closed soon after it.
    http: { headersTimeout: readTimeoutMs, connectionsCheckingInterval: Math.max(50, Math.min(30_000, Math.floor(readTimeoutMs / 4))) },
    // Errors before a request reaches a route (the read time-out, a malformed request) in OpenAI's shape too.
    clientErrorHandler: (err: Error & { code?: string }, socket) => {
      if (err.code === 'ECONNRESET' || socket.destroyed) return;
      const [status, e] =
        err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? (['408 Request Timeout', new ServeError('SRV_ERR_READ_TIMEOUT', { limit: readTimeoutMs })] as const)
          : err.code === 'HPE_HEADER_OVERFLOW'
            ? (['431 Request Header Fields Too Large', new ServeError('SRV_ERR_VALIDATION', { detail: 'the request headers are too large' })] as const)
            : (['400 Bad Request', new ServeError('SRV_ERR_VALIDATION', { detail: 'the request is not valid HTTP' })] as const);
      const body = JSON.stringify(e.body());
      if (socket.writable) socket.write(`HTTP/1.1 ${status}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      socket.destroy();
    },
    genReqId: (() => {
      let n = 0;
      return () => `req-${(++n).toString(36)}`;
    })(),
  });
  app.setValidatorCompiler(serveValidatorCompiler());
  const authFailures = new AuthFailureLimiter(o.authFailuresPerMinute ?? 30, 60_000);
  const holders = new WeakMap<FastifyRequest, string>();
  const holderOf = (request: FastifyRequest) => holders.get(request) ?? ANONYMOUS;

  const wireToken = (id: number, logprob: number): TokenAlternativeWire => {
    const token = tokenizer.decode([id]);
    return { token, logprob, bytes: [...Buffer.from(token, 'utf8')] };
  };
  /** The sampled tokens' log-probs (tokens the endpoint forced were not sampled and have none: left out). */
  const logprobsOf = (gen: GenerateResult): { content: TokenLogprob[] } => {
    const from = gen.forced ?? 0;
    return {
      content: gen.tokenIds.slice(from).map((id, j) => ({
        ...wireToken(id, gen.logprobs[from + j] ?? 0),
        top_logprobs: (gen.topLogprobs?.[from + j] ?? []).map((a) => wireToken(a.token, a.logprob)),
      })),
    };
  };
  const checkModel = (model: string) => {
    if (model !== o.model) throw new ServeError('SRV_ERR_MODEL', { model: JSON.stringify(model), served: o.model }, { param: 'model' });
  };
  /** What both completion routes check the same way before a trajectory opens. */
  const common = (body: { stream?: boolean | null; stream_options?: unknown; n?: number | null }) => {
    if (body.stream_options !== undefined && body.stream_options !== null && body.stream !== true) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'stream_options: only with stream: true' }, { param: 'stream_options' });
  };
  const includeUsage = (body: { stream_options?: { include_usage?: boolean | null } | null }) => body.stream_options?.include_usage === true;

  app.setErrorHandler((err: unknown, request: FastifyRequest, reply: FastifyReply) => {
    const e = toServeError(err, request);
    if (e.statusCode >= 500) logger.error('serve request failed', { requestId: request.id, route: request.routeOptions.url, error: describeError(err) });
    if (reply.raw.headersSent) {
      // A stream already under way: the error goes out as its last event.
      reply.raw.end(`data: ${JSON.stringify(e.body())}\n\ndata: [DONE]\n\n`);
      return;
    }
    void reply.code(e.statusCode).send(e.body());
  });
  app.setNotFoundHandler((request, reply) => {
    const e = new ServeError('SRV_ERR_ROUTE_NOT_FOUND', { method: request.method, url: request.url.split('?')[0] ?? '' });
    void reply.code(e.statusCode).send(e.body());
  });
  // Authentication before the body is read: an unauthenticated caller costs a header check.
  app.addHook('onRequest', async (request) => {
    if (request.routeOptions.url === '/openapi.json') return;
    const wait = authFailures.retryAfterMs(request.ip);
    if (wait > 0) throw new ServeError('SRV_ERR_AUTH_LIMITED', { after: Math.ceil(wait / 1000) });
    const token = bearerToken(request.headers.authorization);
    const principal = token === null ? null : tokens.verify(token);
    if (principal === null) {
      authFailures.fail(request.ip);
      throw new ServeError('SRV_ERR_UNAUTHENTICATED');
    }
    holders.set(request, principal.name);
  });

  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'rlstream serve', version: '1', description: 'OpenAI-compatible endpoint that records every call as trajectory events (docs/serve.md).' },
      components: { securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearerAuth: [] }],
    },
  });
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());

  const errors = { 400: ErrorResponse, 401: ErrorResponse, 404: ErrorResponse, 408: ErrorResponse, 409: ErrorResponse, 413: ErrorResponse, 429: ErrorResponse, 503: ErrorResponse };
  const modelObject = () => ({ id: o.model, object: 'model' as const, created: 0, owned_by: 'rlstream' });

  app.get('/v1/models', { schema: { summary: 'The served model', response: { 200: ModelList, 401: ErrorResponse } } }, async () => ({ object: 'list' as const, data: [modelObject()] }));
  app.get(
    '/v1/models/:model',
    { schema: { summary: 'The served model by id (models.retrieve)', params: { type: 'object', properties: { model: { type: 'string', maxLength: 256 } }, required: ['model'] }, response: { 200: ModelObject, 401: ErrorResponse, 404: ErrorResponse } } },
    async (request) => {
      checkModel((request.params as { model: string }).model);
      return modelObject();
    },
  );

  app.post('/v1/chat/completions', { schema: { summary: 'Chat completion, recorded as a turn of a trajectory', body: ChatCompletionRequest, response: { 200: ChatCompletionResponse, ...errors } } }, async (request, reply) => {
    const body = request.body as ChatCompletionRequest;
    checkModel(body.model);
    common(body);
    const tc = body.tool_choice ?? 'auto';
    const top = body.top_logprobs ?? 0;
    if (top > 0 && body.logprobs !== true) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'top_logprobs: needs logprobs: true' }, { param: 'top_logprobs' });
    const turn: TurnOptions = {
      stop: stopList(body.stop),
      toolChoice: typeof tc === 'object' ? { name: tc.function.name } : tc,
      ...(body.parallel_tool_calls === false ? { maxCalls: 1 } : {}),
      ...(top > 0 ? { topLogprobs: top } : {}),
    };
    const messages = body.messages.map(clientMessage);
    const results = await service.chat({ messages, tools: chatTools(body.tools), sampling: service.sampling(body), n: body.n ?? 1, naming: naming(request, body.metadata), holder: holderOf(request), turn });
    const id = `chatcmpl-${newId()}`;
    const created = Math.floor(Date.now() / 1000);
    void reply.header(NAMING_HEADERS.trajectoryId, results[0]!.session.id).header(NAMING_HEADERS.groupId, results[0]!.session.meta.groupId);
    const choices = results.map((r, index) => {
      const gen = r.served?.turn.gen;
      return {
        index,
        message: r.served ? assistantWire(r.served.message) : { role: 'assistant', content: '' },
        logprobs: body.logprobs && gen ? logprobsOf(gen) : null,
        finish_reason: finishReason(r),
        rlstream: extension(r),
      };
    });
    if (!body.stream) return { id, object: 'chat.completion' as const, created, model: o.model, choices, usage: usage(results) };

    // Server-sent events in OpenAI's chunk shape. The backend returns a turn whole, so each choice is sent as one
    // chunk with its role, content and tool calls, then one with its finish reason; with
    // stream_options.include_usage a last chunk has the usage and no choices (every other chunk `usage: null`, as
    // OpenAI sends them); the stream ends with [DONE].
    const withUsage = includeUsage(body);
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive', [NAMING_HEADERS.trajectoryId]: results[0]!.session.id, [NAMING_HEADERS.groupId]: results[0]!.session.meta.groupId });
    const send = (chunk: unknown) => reply.raw.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const base = { id, object: 'chat.completion.chunk', created, model: o.model, ...(withUsage ? { usage: null } : {}) };
    for (const c of choices) {
      const m = c.message as Record<string, unknown>;
      const delta: Record<string, unknown> = { role: 'assistant', content: m['content'] ?? null };
      const calls = m['tool_calls'] as { id: string; type: string; function: { name: string; arguments: string } }[] | undefined;
      if (calls) delta['tool_calls'] = calls.map((call, i) => ({ index: i, ...call }));
      send({ ...base, choices: [{ index: c.index, delta, logprobs: c.logprobs, finish_reason: null }] });
      send({ ...base, choices: [{ index: c.index, delta: {}, logprobs: null, finish_reason: c.finish_reason, rlstream: c.rlstream }] });
    }
    if (withUsage) send({ ...base, choices: [], usage: usage(results) });
    reply.raw.end('data: [DONE]\n\n');
    return reply;
  });

  app.post('/v1/completions', { schema: { summary: 'Text completion (no chat template), each prompt recorded as a group of one-turn trajectories', body: CompletionRequest, response: { 200: CompletionResponse, ...errors } } }, async (request, reply) => {
    const body = request.body as CompletionRequest;
    checkModel(body.model);
    common(body);
    const prompts = typeof body.prompt === 'string' ? [body.prompt] : body.prompt;
    if (prompts.some((p) => typeof p !== 'string')) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'prompt: token-id prompts are not accepted; send text' }, { param: 'prompt' });
    const top = body.logprobs ?? 0;
    const results = await service.text({ prompts: prompts as string[], sampling: service.sampling(body), n: body.n ?? 1, naming: naming(request, body.metadata), holder: holderOf(request), turn: { stop: stopList(body.stop), ...(top > 0 ? { topLogprobs: top } : {}) } });
    const id = `cmpl-${newId()}`;
    const created = Math.floor(Date.now() / 1000);
    const choices = results.map((r, index) => {
      const gen = r.served?.turn.gen;
      const text = r.served?.message.content ?? '';
      let logprobs: Record<string, unknown> | null = null;
      if (body.logprobs !== undefined && body.logprobs !== null && gen) {
        const tokensText = gen.tokenIds.map((t) => tokenizer.decode([t]));
        const offsets: number[] = [];
        let at = 0;
        for (const t of tokensText) {
          offsets.push(at);
          at += t.length;
        }
        // Tokens past the returned text (a stop string's) are in the record, not in the answer.
        const keep = offsets.filter((x) => x < text.length || x === 0).length;
        // Alternatives as the legacy API writes them: per token, their texts to their log-probs.
        const alternatives = top > 0 ? (gen.topLogprobs ?? []).slice(0, keep).map((alts) => Object.fromEntries(alts.map((a) => [tokenizer.decode([a.token]), a.logprob]))) : null;
        logprobs = { tokens: tokensText.slice(0, keep), token_logprobs: gen.logprobs.slice(0, keep), top_logprobs: alternatives, text_offset: offsets.slice(0, keep) };
      }
      return { index, text, logprobs, finish_reason: gen?.finishReason === 'length' || !r.served ? 'length' : 'stop', rlstream: extension(r) };
    });
    if (!body.stream) return { id, object: 'text_completion' as const, created, model: o.model, choices, usage: usage(results) };
    const withUsage = includeUsage(body);
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
    const send = (chunk: unknown) => reply.raw.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const base = { id, object: 'text_completion', created, model: o.model, ...(withUsage ? { usage: null } : {}) };
    for (const c of choices) {
      send({ ...base, choices: [{ index: c.index, text: c.text, logprobs: c.logprobs, finish_reason: null }] });
      send({ ...base, choices: [{ index: c.index, text: '', logprobs: null, finish_reason: c.finish_reason, rlstream: c.rlstream }] });
    }
    if (withUsage) send({ ...base, choices: [], usage: usage(results) });
    reply.raw.end('data: [DONE]\n\n');
    return reply;
  });

  app.post(
    '/v1/trajectories/:id/complete',
    { schema: { summary: 'End a trajectory, with its reward or for the reward consumer to score', params: { type: 'object', properties: { id: { type: 'string', maxLength: 200 } }, required: ['id'] }, body: CompleteRequest, response: { 200: CompleteResponse, ...errors } } },
    async (request) => {
      const { id } = request.params as { id: string };
      const body = (request.body ?? {}) as CompleteRequest;
      const s = await service.complete(id, { ...(body.reward !== undefined ? { reward: body.reward } : {}), ...(body.ground_truth !== undefined ? { groundTruth: body.ground_truth } : {}), ...(body.termination ? { termination: body.termination } : {}) });
      return { trajectory_id: s.id, group_id: s.meta.groupId, termination: s.completed ?? 'stop', num_turns: s.recorder.turnCount, response_tokens: s.recorder.responseLength, tokenization_mismatches: s.recorder.tokenizationMismatches };
    },
  );

  // A POST with no body (the complete route's fields are all optional) is an empty object.
  app.addHook('preValidation', async (request) => {
    if (request.body === undefined && request.routeOptions.schema?.body) request.body = {};
  });
  return app;
}
