// Prometheus exposition of the process's prom-client registry (roles' metrics and the admin server's own).
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';

const metrics: FastifyPluginAsync = async (app) => {
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['metrics'],
        summary: 'Prometheus metrics (text exposition format)',
        // Per status: the metrics are text, an error (401, 429) is the JSON error body like everywhere else.
        response: {
          200: { description: 'Prometheus text format 0.0.4', content: { 'text/plain': { schema: Type.String() } } },
          '4xx': { description: 'Error', content: { 'application/json': { schema: Type.Ref('AdminError') } } },
        },
      },
    },
    async (_req, reply) => {
      const registry = app.admin.ctx.metrics;
      void reply.header('content-type', registry.contentType);
      return registry.metrics();
    },
  );
};

export default metrics;
