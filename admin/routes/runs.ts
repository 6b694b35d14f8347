// Runs and their configuration (secrets were redacted by whoever registered the run).
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import { AdminError } from '../errors.ts';
import { listRuns, runView } from '../live/runs.ts';
import { AnyObject, responses, RunIdParams } from '../schemas.ts';


const runs: FastifyPluginAsync = async (app) => {
  app.get('/runs', { schema: { tags: ['runs'], summary: 'Runs known to this process or seen in the log', response: responses(Type.Object({ runs: Type.Array(Type.Ref('Run')) })) } }, async () => ({
    runs: listRuns(app.admin),
  }));

  app.get<{ Params: Static<typeof RunIdParams> }>(
    '/runs/:runId',
    { schema: { tags: ['runs'], summary: 'One run', params: RunIdParams, response: responses(Type.Ref('Run')) } },
    async (req) => {
      const run = runView(app.admin, req.params.runId);
      if (!run) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `run ${req.params.runId}` });
      return run;
    },
  );

  app.get<{ Params: Static<typeof RunIdParams> }>(
    '/runs/:runId/config',
    {
      schema: {
        tags: ['runs'],
        summary: 'A run’s configuration, secrets redacted',
        params: RunIdParams,
        response: responses(Type.Object({ runId: Type.String(), config: AnyObject })),
      },
    },
    async (req) => {
      const run = runView(app.admin, req.params.runId);
      if (!run) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `run ${req.params.runId}` });
      return { runId: run.id, config: run.config };
    },
  );
};

export default runs;
