// Liveness and readiness: the only API routes reachable without a token (orchestrators probe them).
// Readiness asks the log and the trace store for a trivial answer each.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import { describeError } from '../../core/errors.ts';
import { AdminError } from '../errors.ts';
import { responses } from '../schemas.ts';

const Health = Type.Object({ status: Type.Literal('ok') });
const Ready = Type.Object({
  status: Type.Literal('ready'),
  log: Type.String({ description: 'embedded or kafka' }),
  traces: Type.Union([Type.String(), Type.Null()], { description: 'trace store kind, null when there is none' }),
});

const health: FastifyPluginAsync = async (app) => {
  const publicRoute = { access: 'public' as const, rateLimit: false as const };

  app.get('/healthz', { config: publicRoute, schema: { tags: ['health'], summary: 'Liveness: the process answers', response: responses(Health) } }, async () => ({
    status: 'ok' as const,
  }));

  app.get('/readyz', { config: publicRoute, schema: { tags: ['health'], summary: 'Readiness: the log and the trace store answer', response: responses(Ready) } }, async () => {
    const { ctx } = app.admin;
    try {
      await ctx.log.listTopics();
    } catch (err) {
      throw new AdminError('ADM_ERR_NOT_READY', { detail: `event log: ${describeError(err)}` });
    }
    if (ctx.traces) {
      try {
        await ctx.traces.ping();
      } catch (err) {
        throw new AdminError('ADM_ERR_NOT_READY', { detail: `trace store: ${describeError(err)}` });
      }
    }
    return { status: 'ready' as const, log: ctx.log.kind, traces: ctx.traces?.kind ?? null };
  });
};

export default health;
