// The admin server: Fastify with one plugin per route group, bearer-token roles, rate and body limits,
// CORS only when configured, the OpenAPI document at /openapi.json (UI at /docs) and the dashboard at /.
// buildAdminServer() makes an instance for inject() tests; startAdminServer() also listens and tails the log.
// Under abuse: failed authentications are limited per client before any token is hashed, user queries share a
// small bounded pool, a request must arrive whole within a time limit, and every answer, framework errors
// included, is a catalogue error in the documented shape.
import { Ajv } from 'ajv';
import Fastify, { type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifySchemaCompiler, type FastifyServerOptions } from 'fastify';
import cors from '@fastify/cors';
import rateLimit from '@fastify/rate-limit';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { isRlstreamError, describeError } from '../core/errors.ts';
import { allows, AuthFailureLimiter, bearerToken, envTokens, TokenStore, type Access, type Principal, type TokenSpec } from '../core/auth/tokens.ts';
import type { AdminContext, QueryLimits } from './context.ts';
import { AdminError, isAdminError } from './errors.ts';
import { LiveTail, type LiveTailOptions } from './live/tail.ts';
import { ErrorBody, Run } from './schemas.ts';
import { classifyQueryError } from './sql-errors.ts';
import { httpMetrics } from './metrics.ts';
import { QueryPool, type QueryPoolOptions } from './query-pool.ts';
import healthRoutes from './routes/health.ts';
import runRoutes from './routes/runs.ts';
import topicRoutes from './routes/topics.ts';
import trainingRoutes from './routes/training.ts';
import controlRoutes from './routes/control.ts';
import traceRoutes from './routes/traces.ts';
import trajectoryRoutes from './routes/trajectories.ts';
import replayRoutes from './routes/replay.ts';
import metricsRoutes from './routes/metrics.ts';
import dashboardRoutes from './routes/dashboard.ts';

export interface AdminServerOptions {
  /** Tokens in addition to those of RLSTREAM_ADMIN_TOKENS (see core/auth/tokens.ts parseTokenList). */
  tokens?: TokenSpec[];
  /** Environment to read RLSTREAM_ADMIN_TOKENS from (default process.env, from which it is then removed). */
  env?: Record<string, string | undefined>;
  /** Largest accepted request body in bytes (default 64 KiB). */
  bodyLimitBytes?: number;
  /** Requests per window per client address; false disables (default 600 per minute). */
  rateLimit?: { max: number; timeWindowMs: number } | false;
  /** Origins allowed by CORS; CORS is off (no headers at all) unless some are given. */
  corsOrigins?: string[];
  /** Upper bounds on what a SQL or named query may ask for (defaults 10 000 rows, 16 MiB, 10 s). */
  queryLimits?: Partial<QueryLimits>;
  /** Options of the log tail behind the live routes; false to not tail (routes then show nothing live). */
  tail?: LiveTailOptions | false;
  /** Failed authentications per window per client address before 429; false disables (default 30 per minute). */
  authFailureLimit?: { max: number; timeWindowMs: number } | false;
  /** User queries (SQL route, named queries) running at once and waiting (default 2 and 8); more are 429. */
  queryPool?: QueryPoolOptions;
  /** Replay jobs pending or running at once (default 2); another start is 429. */
  maxReplayJobs?: number;
  /** Time a client has to send a whole request, headers and body, in ms (default 30 s). */
  requestTimeoutMs?: number;
}

export interface AdminState {
  ctx: AdminContext;
  tail: LiveTail | null;
  maxLimits: QueryLimits;
  queries: QueryPool;
  maxReplayJobs: number;
  /** Every route registered, with who may call it (tests check each is documented and guarded). */
  routes: { method: string; url: string; access: Access }[];
}

declare module 'fastify' {
  interface FastifyInstance {
    admin: AdminState;
  }
  interface FastifyRequest {
    principal: Principal | null;
  }
  interface FastifyContextConfig {
    /** Who may call the route; routes without it need the read role. */
    access?: Access;
  }
}

type ValidatorFactory = NonNullable<NonNullable<NonNullable<FastifyServerOptions['schemaController']>['compilersFactory']>['buildValidator']>;

/** On every answer: browsers and proxies must not guess another type for it, nor frame the dashboard. */
const SECURITY_HEADERS = { 'x-content-type-options': 'nosniff', 'x-frame-options': 'DENY' };

/** Longest path parameter; the longest any route declares is 200 (run ids). */
const MAX_PARAM_LENGTH = 256;

/** The routes registered for a concrete path under any method (patterns with :params and a trailing *). */
function routesFor(routes: AdminState['routes'], path: string): AdminState['routes'] {
  return routes.filter((r) => {
    const pattern = r.url.split('/').map((seg) => (seg.startsWith(':') ? '[^/]+' : seg === '*' ? '.*' : seg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))).join('/');
    return new RegExp(`^${pattern}$`).test(path);
  });
}

function methodsFor(routes: AdminState['routes'], path: string): string[] {
  const methods = new Set(routesFor(routes, path).map((r) => r.method));
  if (methods.has('GET')) methods.add('HEAD');
  return [...methods].sort();
}

/**
 * Validators for every plugin context (with the shared schemas each has added): bodies are JSON and checked as
 * they are (a boolean is not a string); path and query values arrive as text and are coerced into their
 * declared types. Nothing is removed silently, so bad input is a 4xx.
 */
function buildValidator(externalSchemas: unknown): FastifySchemaCompiler<object> {
  const options = { removeAdditional: false, allErrors: false, strict: false, useDefaults: true } as const;
  const body = new Ajv({ ...options, coerceTypes: false });
  const text = new Ajv({ ...options, coerceTypes: 'array' });
  for (const schema of Object.values((externalSchemas ?? {}) as Record<string, object>)) {
    body.addSchema(schema);
    text.addSchema(schema);
  }
  return ({ schema, httpPart }) => (httpPart === 'body' ? body : text).compile(schema);
}

const DEFAULT_QUERY_LIMITS: QueryLimits = { maxRows: 10_000, maxBytes: 16 * 1024 * 1024, timeoutMs: 10_000 };

function tokenStore(options: AdminServerOptions): TokenStore {
  return new TokenStore([...(options.tokens ?? []), ...envTokens(options.env)]);
}

/** Maps anything thrown in a route to a catalogue error; client mistakes are always 4xx. */
function toAdminError(err: unknown, request: FastifyRequest): AdminError {
  if (isAdminError(err)) return err;
  const fe = err as Partial<FastifyError> & { validation?: unknown };
  if (fe.validation) return new AdminError('ADM_ERR_VALIDATION', { detail: fe.message ?? 'schema validation failed' }, { cause: err });
  switch (fe.code) {
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return new AdminError('ADM_ERR_URI_TOO_LONG', { limit: MAX_PARAM_LENGTH }, { cause: err });
    case 'FST_ERR_BAD_URL':
      return new AdminError('ADM_ERR_VALIDATION', { detail: 'the path is not a valid URL component' }, { cause: err });
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new AdminError('ADM_ERR_BODY_TOO_LARGE', { limit: request.routeOptions.bodyLimit ?? 0 }, { cause: err });
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new AdminError('ADM_ERR_UNSUPPORTED_MEDIA_TYPE', { type: String(request.headers['content-type'] ?? 'none') }, { cause: err });
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return new AdminError('ADM_ERR_BAD_JSON', {}, { cause: err });
    default:
      break;
  }
  if (err instanceof SyntaxError && fe.statusCode === 400) return new AdminError('ADM_ERR_BAD_JSON', {}, { cause: err });
  if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
    if (fe.statusCode === 429) return new AdminError('ADM_ERR_RATE_LIMITED', { after: 'a moment' }, { cause: err });
    return new AdminError('ADM_ERR_VALIDATION', { detail: fe.message ?? 'bad request' }, { cause: err });
  }
  if (isRlstreamError(err)) {
    if (err.code === 'INPUT_INVALID') return new AdminError('ADM_ERR_VALIDATION', { detail: err.message }, { cause: err });
    if (err.code === 'LOG_UNKNOWN_TOPIC' || err.code === 'LOG_UNKNOWN_PARTITION') return new AdminError('ADM_ERR_NOT_FOUND', { what: err.message }, { cause: err });
    if (err.code === 'TRACE_STORE') {
      const classified = classifyQueryError(err);
      if (classified) return classified;
    }
  }
  return new AdminError('ADM_ERR_INTERNAL', { requestId: request.id }, { cause: err });
}

export async function buildAdminServer(ctx: AdminContext, options: AdminServerOptions = {}): Promise<FastifyInstance> {
  const tokens = tokenStore(options);
  const logger = ctx.logger.child({ component: 'admin' });
  if (tokens.size === 0) logger.warn('admin server has no tokens: every route but health, readiness and static pages will answer 401');

  const requestTimeout = options.requestTimeoutMs ?? 30_000;
  const app = Fastify({
    // Fastify's own logger is off: requests are logged below through core/telemetry, without headers, so a
    // token can never reach a log line.
    logger: false,
    bodyLimit: options.bodyLimitBytes ?? 64 * 1024,
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    // A request (headers and body) must arrive whole in this time: a trickled body would otherwise hold a
    // socket for Node's default of five minutes. Node checks its timers every connectionsCheckingInterval.
    requestTimeout,
    http: { connectionsCheckingInterval: Math.min(1000, requestTimeout) },
    schemaController: { compilersFactory: { buildValidator: buildValidator as unknown as ValidatorFactory } },
    genReqId: (() => {
      let n = 0;
      return () => `req-${(++n).toString(36)}`;
    })(),
    // Errors the router raises before any route runs (a path parameter over maxParamLength, a malformed URL)
    // get the catalogue shape too.
    frameworkErrors: (err, request, reply) => {
      const e = toAdminError(err, request);
      void (reply as FastifyReply).code(e.statusCode).headers(SECURITY_HEADERS).send({ statusCode: e.statusCode, code: e.code, message: e.message });
    },
  });
  // No timer of Node's may be longer than the request's: headers too must arrive within it.
  if (app.server.headersTimeout > requestTimeout) app.server.headersTimeout = requestTimeout;
  // An empty JSON body is no body at all (the control commands take no arguments); anything else is parsed
  // by Fastify's own parser, with its protection against __proto__ keys.
  const jsonParser = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    const text = body.toString();
    if (text.trim() === '') done(null, undefined);
    else jsonParser(request, text, done);
  });

  const maxLimits: QueryLimits = { ...DEFAULT_QUERY_LIMITS, ...options.queryLimits };
  const tail = options.tail === false ? null : new LiveTail(ctx.log, ctx.serde, logger, options.tail);
  const routes: AdminState['routes'] = [];
  const queries = new QueryPool(options.queryPool ?? { running: 2, queued: 8 });
  app.decorate('admin', { ctx, tail, maxLimits, queries, maxReplayJobs: options.maxReplayJobs ?? 2, routes });
  app.addHook('onRoute', (r) => {
    // The docs UI's own pages (static Swagger UI files) describe the API and hold no run data.
    if (r.url === '/docs' || r.url.startsWith('/docs/')) r.config = { ...(r.config ?? {}), access: 'public' } as typeof r.config;
    const access = (r.config as { access?: Access } | undefined)?.access ?? 'read';
    for (const method of [r.method].flat()) if (method !== 'HEAD') routes.push({ method, url: r.url, access });
  });
  app.decorateRequest('principal', null);
  app.addSchema(ErrorBody);
  app.addSchema(Run);

  const http = httpMetrics(ctx.metrics);

  /** 405 with Allow where the path has routes under other methods, else 404. */
  const noRoute = (request: FastifyRequest, reply: FastifyReply): AdminError => {
    const url = request.url.split('?')[0] ?? '';
    const allow = methodsFor(routes, url);
    if (allow.length === 0) return new AdminError('ADM_ERR_ROUTE_NOT_FOUND', { method: request.method, url });
    void reply.header('allow', allow.join(', '));
    return new AdminError('ADM_ERR_METHOD_NOT_ALLOWED', { method: request.method, url, allow: allow.join(', ') });
  };

  app.setErrorHandler((err: unknown, request: FastifyRequest, reply: FastifyReply) => {
    // Without a route, only authentication may fail first; a body the route-less request could not parse
    // (a QUERY without a content type) is still answered as no route.
    const e = request.is404 && !isAdminError(err) ? noRoute(request, reply) : toAdminError(err, request);
    if (e.statusCode >= 500) logger.error('admin request failed', { requestId: request.id, method: request.method, route: request.routeOptions.url, error: describeError(err) });
    void reply.code(e.statusCode).send({ statusCode: e.statusCode, code: e.code, message: e.message });
  });
  app.setNotFoundHandler((request, reply) => {
    const e = noRoute(request, reply);
    void reply.code(e.statusCode).send({ statusCode: e.statusCode, code: e.code, message: e.message });
  });
  app.addHook('onSend', async (_request, reply) => {
    void reply.headers(SECURITY_HEADERS);
  });
  // A body-less POST (no body, or an empty JSON one) is an empty object: routes whose fields are all optional
  // accept it, the others name their first missing field.
  app.addHook('preValidation', async (request) => {
    if (request.body === undefined && request.routeOptions.schema?.body) request.body = {};
  });

  const corsOn = (options.corsOrigins?.length ?? 0) > 0;
  const authFailures = options.authFailureLimit === false ? null : new AuthFailureLimiter(options.authFailureLimit?.max ?? 30, options.authFailureLimit?.timeWindowMs ?? 60_000);
  // Authentication first, before rate limiting and body parsing: an unauthenticated caller costs nothing.
  app.addHook('onRequest', async (request) => {
    const access: Access = request.routeOptions.config.access ?? 'read';
    if (access === 'public') return;
    // Another method on a public path (TRACE /healthz) is a 405 for anyone, as the path's own routes need no token.
    if (request.is404) {
      const known = routesFor(routes, request.url.split('?')[0] ?? '');
      if (known.length > 0 && known.every((r) => r.access === 'public')) return;
    }
    // CORS preflights carry no credentials by design; @fastify/cors answers them without running a handler.
    if (corsOn && request.method === 'OPTIONS') return;
    const wait = authFailures?.retryAfterMs(request.ip) ?? 0;
    if (wait > 0) throw new AdminError('ADM_ERR_RATE_LIMITED', { after: `${Math.ceil(wait / 1000)} s (too many failed authentications)` });
    const token = bearerToken(request.headers.authorization);
    const principal = token === null ? null : tokens.verify(token);
    if (!principal) {
      authFailures?.fail(request.ip);
      throw new AdminError('ADM_ERR_UNAUTHENTICATED');
    }
    if (!allows(principal, access)) throw new AdminError('ADM_ERR_FORBIDDEN', { role: access });
    request.principal = principal;
  });
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    http.observe(request.method, route, reply.statusCode, reply.elapsedTime / 1000);
    // Path only: query strings can carry user text; headers (the token) are never logged.
    logger.debug('admin request', { requestId: request.id, method: request.method, route, status: reply.statusCode, ms: Math.round(reply.elapsedTime) });
  });

  if (options.rateLimit !== false) {
    const rl = options.rateLimit ?? { max: 600, timeWindowMs: 60_000 };
    await app.register(rateLimit, {
      global: true,
      max: rl.max,
      timeWindow: rl.timeWindowMs,
      errorResponseBuilder: (_req, c) => new AdminError('ADM_ERR_RATE_LIMITED', { after: c.after }),
    });
  }
  if (options.corsOrigins && options.corsOrigins.length > 0) {
    await app.register(cors, { origin: options.corsOrigins, methods: ['GET', 'POST', 'DELETE'], allowedHeaders: ['Authorization', 'Content-Type'] });
  }

  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'rlstream admin API', version: '1', description: 'Control room of an rlstream run: runs, log, training, control, traces, replay.' },
      components: { securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer' } } },
    },
    transform: ({ schema, url, route }) => {
      const access = (route.config as { access?: Access } | undefined)?.access ?? 'read';
      const s = { ...(schema ?? {}) } as Record<string, unknown>;
      if (access !== 'public') {
        s['security'] = [{ bearerAuth: [] }];
        s['description'] = `${(s['description'] as string | undefined) ?? ''}${s['description'] ? ' ' : ''}Requires the ${access} role.`;
      }
      return { schema: s as typeof schema, url };
    },
    // A body whose fields are all optional may be left out (the preValidation hook above reads it as {}).
    transformObject: (doc) => {
      const paths = ('openapiObject' in doc ? doc.openapiObject.paths : undefined) ?? {};
      for (const ops of Object.values(paths)) {
        for (const op of Object.values(ops ?? {}) as { requestBody?: { required?: boolean; content?: Record<string, { schema?: { required?: string[] } }> } }[]) {
          const body = op?.requestBody;
          if (body && !(body.content?.['application/json']?.schema?.required?.length ?? 0)) body.required = false;
        }
      }
      return 'openapiObject' in doc ? doc.openapiObject : doc.swaggerObject;
    },
  });
  await app.register(swaggerUi, { routePrefix: '/docs', uiConfig: { docExpansion: 'list' }, staticCSP: true });

  app.get('/openapi.json', { config: { access: 'public' }, schema: { hide: true } }, async () => app.swagger());

  await app.register(healthRoutes);
  await app.register(runRoutes, { prefix: '/api' });
  await app.register(topicRoutes, { prefix: '/api' });
  await app.register(trainingRoutes, { prefix: '/api' });
  await app.register(controlRoutes, { prefix: '/api' });
  await app.register(traceRoutes, { prefix: '/api' });
  await app.register(trajectoryRoutes, { prefix: '/api' });
  await app.register(replayRoutes, { prefix: '/api' });
  await app.register(metricsRoutes);
  await app.register(dashboardRoutes);

  // The tail starts with the server (also under inject(), which readies it) and stops with it.
  app.addHook('onReady', async () => {
    await tail?.start();
  });
  app.addHook('onClose', async () => {
    await tail?.close();
  });
  return app;
}

export interface StartedAdminServer {
  app: FastifyInstance;
  url: string;
  close(): Promise<void>;
}

/** Builds the server, starts the log tail and listens (default 127.0.0.1, port 0 = any free port). */
export async function startAdminServer(
  ctx: AdminContext,
  options: AdminServerOptions & { host?: string; port?: number } = {},
): Promise<StartedAdminServer> {
  const app = await buildAdminServer(ctx, options);
  let address: string;
  try {
    address = await app.listen({ host: options.host ?? '127.0.0.1', port: options.port ?? 0 });
  } catch (err) {
    // listen readies the app (starting the log tail) before it binds: a busy port must stop the tail too, or
    // it keeps polling the log the caller closes next, and the process never exits.
    await app.close().catch(() => undefined);
    throw err;
  }
  ctx.logger.info('admin server listening', { url: address });
  return { app, url: address, close: () => app.close() };
}
