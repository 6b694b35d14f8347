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
        produces: ['text/plain'],
        response: { 200: Type.String({ description: 'Prometheus text format 0.0.4' }), '4xx': Type.Ref('AdminError') },
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
