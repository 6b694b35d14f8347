// Trace queries: the trace store's named queries by name with parameters, read-only SQL with row, byte, time,
// memory and rows-read limits (the store's queryReadonly: checked on the engine's own parse, then run in the
// SQL sandbox process under readonly=1 with the limits as settings: core/traces/sandbox/), and the tool-call
// table the dashboard shows. User queries run in the server's bounded pool (admin/query-pool.ts).
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { AdminTraceStore, QueryLimits } from '../context.ts';
import { AdminError } from '../errors.ts';
import { classifyQueryError } from '../sql-errors.ts';
import { AnyObject, responses } from '../schemas.ts';

const QueryResultSchema = Type.Object(
  {
    columns: Type.Array(Type.Object({ name: Type.String(), type: Type.String() })),
    rows: Type.Array(AnyObject),
    limits: Type.Object({ maxRows: Type.Integer(), maxBytes: Type.Integer(), timeoutMs: Type.Integer() }),
    stats: Type.Optional(Type.Object({ rowsRead: Type.Optional(Type.Number()), bytesRead: Type.Optional(Type.Number()), elapsedMs: Type.Optional(Type.Number()) })),
  },
  { $id: 'QueryResult', title: 'QueryResult' },
);

const NamedQuery = Type.Object({
  name: Type.String(),
  description: Type.String(),
  params: Type.Array(Type.Object({ name: Type.String(), type: Type.String(), required: Type.Boolean(), description: Type.String() })),
});

const ToolCall = Type.Object({
  time: Type.Number(),
  runId: Type.String(),
  trajectoryId: Type.String(),
  turnIndex: Type.Integer(),
  toolName: Type.String(),
  status: Type.String(),
  latencyMs: Type.Number(),
  argumentsJson: Type.String(),
  resultText: Type.String(),
});

const traces: FastifyPluginAsync = async (app) => {
  app.addSchema(QueryResultSchema);
  const max = app.admin.maxLimits;
  const LimitFields = {
    maxRows: Type.Optional(Type.Integer({ minimum: 1, maximum: max.maxRows, description: `At most ${max.maxRows}.` })),
    maxBytes: Type.Optional(Type.Integer({ minimum: 1024, maximum: max.maxBytes, description: `At most ${max.maxBytes}.` })),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: max.timeoutMs, description: `At most ${max.timeoutMs}.` })),
  };
  const SqlBody = Type.Object({ sql: Type.String({ minLength: 1, maxLength: 20_000 }), ...LimitFields }, { additionalProperties: false });
  const NamedBody = Type.Object(
    { params: Type.Optional(Type.Record(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$' }), Type.Union([Type.String({ maxLength: 1000 }), Type.Number(), Type.Boolean()]), { default: {} })), ...LimitFields },
    { additionalProperties: false },
  );

  function store(): AdminTraceStore {
    const s = app.admin.ctx.traces;
    if (!s) throw new AdminError('ADM_ERR_UNAVAILABLE', { what: 'the trace store' });
    return s;
  }
  function limits(body: { maxRows?: number; maxBytes?: number; timeoutMs?: number }): QueryLimits {
    return { maxRows: body.maxRows ?? max.maxRows, maxBytes: body.maxBytes ?? max.maxBytes, timeoutMs: body.timeoutMs ?? max.timeoutMs };
  }
  /** ClickHouse's verdicts on a user's query are the caller's fault (4xx); anything else propagates. */
  async function userQuery<T>(f: () => Promise<T>): Promise<T> {
    try {
      return await app.admin.queries.run(f);
    } catch (err) {
      if (err instanceof AdminError) throw err;
      throw classifyQueryError(err) ?? err;
    }
  }

  app.get('/traces/queries', { schema: { tags: ['traces'], summary: 'Named trace queries and their parameters', response: responses(Type.Object({ queries: Type.Array(NamedQuery) })) } }, async () => ({
    queries: store().namedQueries(),
  }));

  app.post<{ Params: { name: string }; Body: Static<typeof NamedBody> }>(
    '/traces/queries/:name',
    {
      schema: {
        tags: ['traces'],
        summary: 'Run a named trace query',
        params: Type.Object({ name: Type.String({ pattern: '^[A-Za-z0-9_]{1,100}$' }) }),
        body: NamedBody,
        response: responses(Type.Ref('QueryResult')),
      },
    },
    async (req) => {
      const s = store();
      const q = s.namedQueries().find((n) => n.name === req.params.name);
      if (!q) throw new AdminError('ADM_ERR_QUERY_UNKNOWN', { name: req.params.name });
      const params = req.body.params ?? {};
      const unknown = Object.keys(params).filter((k) => !q.params.some((p) => p.name === k));
      if (unknown.length) throw new AdminError('ADM_ERR_QUERY_PARAMS', { name: q.name, detail: `unknown parameter(s) ${unknown.join(', ')}` });
      const missing = q.params.filter((p) => p.required && !(p.name in params)).map((p) => p.name);
      if (missing.length) throw new AdminError('ADM_ERR_QUERY_PARAMS', { name: q.name, detail: `missing parameter(s) ${missing.join(', ')}` });
      const lim = limits(req.body);
      const result = await userQuery(() => s.runNamed(q.name, params, lim));
      return { ...result, limits: lim };
    },
  );

  app.post<{ Body: Static<typeof SqlBody> }>(
    '/traces/sql',
    {
      schema: {
        tags: ['traces'],
        summary: 'Run read-only SQL on the trace tables',
        description:
          'One SELECT, WITH, EXPLAIN, DESCRIBE, EXISTS TABLE or SHOW TABLES|COLUMNS|CREATE TABLE statement over the trace tables. The ' +
          "engine parses it first and the parsed tree is checked against allow-lists: functions from a reviewed list (by canonical name), " +
          'the trace database and a few system tables (one, numbers, zeros, functions, table_functions, data_type_families, formats, ' +
          'time_zones), numbers()/zeros() as the only table functions. Everything else is refused with ADM_ERR_SQL_REFUSED (403) naming ' +
          'what was refused: writes, DDL, SET/SETTINGS, INTO OUTFILE, several statements, KILL, file(), url(), getSetting() … ' +
          'It then runs in a sandbox process with readonly=1 and the limits as settings (rows and bytes of the result, time, 256 MiB of ' +
          'memory, 100 million rows read). A FORMAT clause is ADM_ERR_SQL_INVALID (400): results are always JSON. 64-bit integers are ' +
          'JSON numbers, exact up to 2^53; select toString(x) where more digits matter.',
        body: SqlBody,
        response: responses(Type.Ref('QueryResult')),
      },
    },
    async (req) => {
      const lim = limits(req.body);
      const result = await userQuery(() => store().queryReadonly(req.body.sql, lim));
      return { ...result, limits: lim };
    },
  );

  const ToolCallQuery = Type.Object({
    runId: Type.Optional(Type.String({ minLength: 1, maxLength: 200, pattern: '^[A-Za-z0-9._:-]+$' })),
    status: Type.Optional(Type.Union(['ok', 'error', 'timeout', 'invalid_args', 'unknown_tool'].map((s) => Type.Literal(s)))),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  });
  app.get<{ Querystring: Static<typeof ToolCallQuery> }>(
    '/tool-calls',
    { schema: { tags: ['traces'], summary: 'Recent tool calls, newest first', querystring: ToolCallQuery, response: responses(Type.Object({ toolCalls: Type.Array(ToolCall) })) } },
    async (req) => ({ toolCalls: await store().toolCalls({ runId: req.query.runId, status: req.query.status, limit: req.query.limit ?? 100 }) }),
  );
};

export default traces;
