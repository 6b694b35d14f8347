// The OpenAI-compatible HTTP endpoint (Fastify): /v1/chat/completions (tools, streaming and not), /v1/completions,
// /v1/models, POST /v1/trajectories/{id}/complete, the OpenAPI document at /openapi.json. Every route but
// /openapi.json needs a bearer token (admin/auth.ts's TokenStore: sha256 digests, constant-time compare, failed
// attempts limited per client before any hashing); bodies are size-limited; errors have OpenAI's shape.
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import swagger from '@fastify/swagger';
import { describeError } from '../../core/errors.ts';
import { newId } from '../../core/ids.ts';
import type { Logger } from '../../core/telemetry.ts';
import { AuthFailureLimiter, bearerToken, type TokenStore } from '../../admin/auth.ts';
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
} from './openai.ts';
import type { ChoiceResult, ServeService, SessionNaming } from './service.ts';

/** One sampled token's log-prob in OpenAI's chat shape (no alternatives: top_logprobs stays empty). */
interface TokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: never[];
}

export interface ServeServerOptions {
  service: ServeService;
  tokenizer: ChatTokenizer;
  tokens: TokenStore;
  /** The model id served (what /v1/models lists; requests naming another are refused). */
  model: string;
  logger: Logger;
  /** Largest request body in bytes (default 4 MiB: a long agent conversation is sent whole on every call). */
  bodyLimitBytes?: number;
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
  const fe = err as Partial<FastifyError> & { validation?: unknown };
  if (fe.validation) return new ServeError('SRV_ERR_VALIDATION', { detail: fe.message ?? 'schema validation failed' }, { cause: err });
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
    policy_version: r.served?.turn.gen.policyVersions[0] ?? -1,
    completed: r.completed,
  };
}

function usage(results: ChoiceResult[]): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  const prompt = results[0]?.promptTokens ?? 0;
  const completion = results.reduce((a, r) => a + (r.served?.turn.gen.tokenIds.length ?? 0), 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

export async function buildServeServer(o: ServeServerOptions): Promise<FastifyInstance> {
  const { service, tokenizer, tokens, logger } = o;
  const app = Fastify({ logger: false, bodyLimit: o.bodyLimitBytes ?? 4 * 1024 * 1024, requestTimeout: 0, genReqId: (() => {
    let n = 0;
    return () => `req-${(++n).toString(36)}`;
  })() });
  const authFailures = new AuthFailureLimiter(o.authFailuresPerMinute ?? 30, 60_000);

  const logprobsOf = (ids: readonly number[], lps: readonly number[]): { content: TokenLogprob[] } => ({
    content: ids.map((id, i) => {
      const token = tokenizer.decode([id]);
      return { token, logprob: lps[i] ?? 0, bytes: [...Buffer.from(token, 'utf8')], top_logprobs: [] };
    }),
  });
  const checkModel = (model: string) => {
    if (model !== o.model) throw new ServeError('SRV_ERR_MODEL', { model: JSON.stringify(model), served: o.model });
  };

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
    if (token === null || tokens.verify(token) === null) {
      authFailures.fail(request.ip);
      throw new ServeError('SRV_ERR_UNAUTHENTICATED');
    }
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

  const errors = { 400: ErrorResponse, 401: ErrorResponse, 404: ErrorResponse, 409: ErrorResponse, 413: ErrorResponse, 429: ErrorResponse, 503: ErrorResponse };

  app.get('/v1/models', { schema: { summary: 'The served model', response: { 200: ModelList, 401: ErrorResponse } } }, async () => ({
    object: 'list' as const,
    data: [{ id: o.model, object: 'model' as const, created: 0, owned_by: 'rlstream' }],
  }));

  app.post('/v1/chat/completions', { schema: { summary: 'Chat completion, recorded as a turn of a trajectory', body: ChatCompletionRequest, response: { 200: ChatCompletionResponse, ...errors } } }, async (request, reply) => {
    const body = request.body as ChatCompletionRequest;
    checkModel(body.model);
    if (body.stop !== undefined && body.stop !== null && (typeof body.stop === 'string' ? body.stop !== '' : body.stop.length > 0)) {
      throw new ServeError('SRV_ERR_VALIDATION', { detail: "stop sequences are not supported: a turn ends at the model's end-of-turn token" });
    }
    const tc = body.tool_choice;
    if (tc !== undefined && tc !== null && tc !== 'auto' && !(tc === 'none' && (body.tools ?? []).length === 0)) {
      throw new ServeError('SRV_ERR_VALIDATION', { detail: "tool_choice: only 'auto' is supported (the policy decides, as in training)" });
    }
    const messages = body.messages.map(clientMessage);
    const results = await service.chat({ messages, tools: chatTools(body.tools), sampling: service.sampling(body), n: body.n ?? 1, naming: naming(request, body.metadata) });
    const id = `chatcmpl-${newId()}`;
    const created = Math.floor(Date.now() / 1000);
    void reply.header(NAMING_HEADERS.trajectoryId, results[0]!.session.id).header(NAMING_HEADERS.groupId, results[0]!.session.meta.groupId);
    const choices = results.map((r, index) => {
      const gen = r.served?.turn.gen;
      return {
        index,
        message: r.served ? assistantWire(r.served.message) : { role: 'assistant', content: '' },
        logprobs: body.logprobs && gen ? logprobsOf(gen.tokenIds, gen.logprobs) : null,
        finish_reason: finishReason(r),
        rlstream: extension(r),
      };
    });
    if (!body.stream) return { id, object: 'chat.completion' as const, created, model: o.model, choices, usage: usage(results) };

    // Server-sent events in OpenAI's chunk shape. The backend returns a turn whole, so each choice is sent as one
    // chunk with its role, content and tool calls, then one with its finish reason; the stream ends with [DONE].
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive', [NAMING_HEADERS.trajectoryId]: results[0]!.session.id, [NAMING_HEADERS.groupId]: results[0]!.session.meta.groupId });
    const send = (chunk: unknown) => reply.raw.write(`data: ${JSON.stringify(chunk)}\n\n`);
    const base = { id, object: 'chat.completion.chunk', created, model: o.model };
    for (const c of choices) {
      const m = c.message as Record<string, unknown>;
      const delta: Record<string, unknown> = { role: 'assistant', content: m['content'] ?? null };
      const calls = m['tool_calls'] as { id: string; type: string; function: { name: string; arguments: string } }[] | undefined;
      if (calls) delta['tool_calls'] = calls.map((call, i) => ({ index: i, ...call }));
      send({ ...base, choices: [{ index: c.index, delta, logprobs: c.logprobs, finish_reason: null }] });
      send({ ...base, choices: [{ index: c.index, delta: {}, logprobs: null, finish_reason: c.finish_reason, rlstream: c.rlstream }] });
    }
    send({ ...base, choices: [], usage: usage(results) });
    reply.raw.end('data: [DONE]\n\n');
    return reply;
  });

  app.post('/v1/completions', { schema: { summary: 'Text completion (no chat template), recorded as a one-turn trajectory unless named', body: CompletionRequest, response: { 200: CompletionResponse, ...errors } } }, async (request) => {
    const body = request.body as CompletionRequest;
    checkModel(body.model);
    if (body.stream) throw new ServeError('SRV_ERR_VALIDATION', { detail: 'stream is supported on /v1/chat/completions only' });
    if (body.stop !== undefined && body.stop !== null && (typeof body.stop === 'string' ? body.stop !== '' : body.stop.length > 0)) {
      throw new ServeError('SRV_ERR_VALIDATION', { detail: "stop sequences are not supported: generation ends at the model's end-of-sequence token" });
    }
    const prompt = typeof body.prompt === 'string' ? body.prompt : body.prompt[0]!;
    const results = await service.text({ prompt, sampling: service.sampling(body), n: body.n ?? 1, naming: naming(request, body.metadata) });
    return {
      id: `cmpl-${newId()}`,
      object: 'text_completion' as const,
      created: Math.floor(Date.now() / 1000),
      model: o.model,
      choices: results.map((r, index) => {
        const gen = r.served?.turn.gen;
        return {
          index,
          text: r.served?.turn.text ?? '',
          logprobs: body.logprobs === 0 && gen ? { tokens: gen.tokenIds.map((t) => tokenizer.decode([t])), token_logprobs: gen.logprobs, top_logprobs: null, text_offset: null } : null,
          finish_reason: r.served?.turn.gen.finishReason === 'length' || !r.served ? 'length' : 'stop',
          rlstream: extension(r),
        };
      }),
      usage: usage(results),
    };
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
