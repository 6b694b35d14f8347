// Replay jobs: recompute a derived stream (rewards, advantages, traces…) from the log. Starting and
// cancelling need the control role; progress is readable with the read role.
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { ReplayManager } from '../context.ts';
import { AdminError } from '../errors.ts';
import { Nullable, responses } from '../schemas.ts';

const Spec = Type.Object(
  {
    target: Type.String({ pattern: '^[a-z][a-z0-9_-]{0,63}$', description: 'What to recompute, e.g. reward, advantage, traces.' }),
    runId: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 200, pattern: '^[A-Za-z0-9._:-]+$' }))),
    fromMs: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
    toMs: Type.Optional(Nullable(Type.Integer({ minimum: 0 }))),
    options: Type.Optional(Type.Record(Type.String({ pattern: '^[A-Za-z0-9_.-]{1,64}$' }), Type.String({ maxLength: 1000 }))),
  },
  { additionalProperties: false },
);
const Job = Type.Object(
  {
    id: Type.String(),
    spec: Type.Object({ target: Type.String(), runId: Nullable(Type.String()), fromMs: Nullable(Type.Number()), toMs: Nullable(Type.Number()), options: Type.Record(Type.String(), Type.String()) }),
    state: Type.Union(['pending', 'running', 'completed', 'cancelled', 'failed'].map((s) => Type.Literal(s))),
    startedMs: Type.Number(),
    finishedMs: Nullable(Type.Number()),
    processed: Type.Integer(),
    total: Nullable(Type.Integer()),
    error: Nullable(Type.String()),
  },
  { $id: 'ReplayJob', title: 'ReplayJob' },
);
const JobParams = Type.Object({ jobId: Type.String({ minLength: 1, maxLength: 100, pattern: '^[A-Za-z0-9._:-]+$' }) });

const replay: FastifyPluginAsync = async (app) => {
  app.addSchema(Job);
  function manager(): ReplayManager {
    const m = app.admin.ctx.replay;
    if (!m) throw new AdminError('ADM_ERR_UNAVAILABLE', { what: 'replay' });
    return m;
  }

  app.post<{ Body: Static<typeof Spec> }>(
    '/replay-jobs',
    { config: { access: 'control' }, schema: { tags: ['replay'], summary: 'Start a replay job', body: Spec, response: responses(Type.Ref('ReplayJob'), 202) } },
    async (req, reply) => {
      const b = req.body;
      if (b.fromMs != null && b.toMs != null && b.toMs < b.fromMs) throw new AdminError('ADM_ERR_VALIDATION', { detail: 'toMs is before fromMs' });
      // Each job reads the log and holds its own consumers and buffers: a bound keeps the process's memory bounded.
      const busy = manager().list().filter((j) => j.state === 'pending' || j.state === 'running').length;
      if (busy >= app.admin.maxReplayJobs) throw new AdminError('ADM_ERR_BUSY', { what: 'replay', detail: `${busy} jobs pending or running, at most ${app.admin.maxReplayJobs}` });
      const job = await manager().start({ target: b.target, runId: b.runId ?? null, fromMs: b.fromMs ?? null, toMs: b.toMs ?? null, options: b.options ?? {} });
      app.admin.ctx.logger.info('replay job started', { jobId: job.id, target: b.target, by: req.principal?.name });
      return reply.code(202).send(job);
    },
  );

  app.get('/replay-jobs', { schema: { tags: ['replay'], summary: 'Replay jobs of this process', response: responses(Type.Object({ jobs: Type.Array(Type.Ref('ReplayJob')) })) } }, async () => ({
    jobs: manager().list(),
  }));

  app.get<{ Params: Static<typeof JobParams> }>(
    '/replay-jobs/:jobId',
    { schema: { tags: ['replay'], summary: 'A replay job’s progress', params: JobParams, response: responses(Type.Ref('ReplayJob')) } },
    async (req) => {
      const job = manager().get(req.params.jobId);
      if (!job) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `replay job ${req.params.jobId}` });
      return job;
    },
  );

  app.post<{ Params: Static<typeof JobParams> }>(
    '/replay-jobs/:jobId/cancel',
    { config: { access: 'control' }, schema: { tags: ['replay'], summary: 'Cancel a replay job', params: JobParams, response: responses(Type.Ref('ReplayJob')) } },
    async (req) => {
      const job = await manager().cancel(req.params.jobId);
      if (!job) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `replay job ${req.params.jobId}` });
      return job;
    },
  );
};

export default replay;
