// Run control: pause, resume, change the staleness bound, stop. Each is published as a Control event on the
// control topic, which the rollout workers and the trainer follow (commands from before a process started are
// not replayed); every route here needs the control role.
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import type { ControlRequest } from '../context.ts';
import { AdminError } from '../errors.ts';
import { runView } from '../live/runs.ts';
import { responses, RunIdParams } from '../schemas.ts';

const Reason = Type.Optional(Type.String({ maxLength: 500 }));
const Body = Type.Object({ reason: Reason }, { additionalProperties: false });
const StalenessBody = Type.Object(
  { bound: Type.Integer({ minimum: 0, maximum: 1_000_000, description: "The run's staleness bound (trainer.staleness_bound): the largest policy-version lag of a sample's oldest token when it is trained." }), reason: Reason },
  { additionalProperties: false },
);
const Published = Type.Object({ command: Type.String(), runId: Type.String(), eventId: Type.String(), partition: Type.Integer(), offset: Type.Integer() });

const control: FastifyPluginAsync = async (app) => {
  async function publish(req: FastifyRequest<{ Params: Static<typeof RunIdParams> }>, command: ControlRequest['command'], reason: string | undefined, bound: number | null) {
    const run = runView(app.admin, req.params.runId);
    if (!run) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `run ${req.params.runId}` });
    if (run.status === 'stopped' || run.status === 'completed' || run.status === 'failed') {
      throw new AdminError('ADM_ERR_CONFLICT', { detail: `run ${run.id} is ${run.status}` });
    }
    const published = await app.admin.ctx.publishControl({
      run_id: run.id,
      command,
      staleness_bound: bound,
      reason: reason ?? null,
      // The principal's name, never the token.
      issued_by: req.principal ? `admin:${req.principal.name}` : 'admin',
    });
    app.admin.ctx.logger.info('control published', { runId: run.id, command, bound, by: req.principal?.name });
    return { command, runId: run.id, ...published };
  }

  const simple = (command: 'pause' | 'resume' | 'stop', summary: string) =>
    app.post<{ Params: Static<typeof RunIdParams>; Body: Static<typeof Body> }>(
      `/runs/:runId/control/${command}`,
      { config: { access: 'control' }, schema: { tags: ['control'], summary, params: RunIdParams, body: Body, response: responses(Published, 202) } },
      async (req, reply) => reply.code(202).send(await publish(req, command, req.body?.reason, null)),
    );
  simple('pause', 'Pause rollouts: rollout workers start no new groups (trajectories under way finish); the trainer trains on what arrives');
  simple('resume', 'Resume rollouts paused by pause');
  simple('stop', 'Stop the run: rollout workers start no new groups and finish those under way; the trainer stops after the step under way; the main job then evaluates and exits');

  app.post<{ Params: Static<typeof RunIdParams>; Body: Static<typeof StalenessBody> }>(
    '/runs/:runId/control/staleness',
    { config: { access: 'control' }, schema: { tags: ['control'], summary: 'Change the staleness bound at both ends: rollout workers start no group that would exceed it, the trainer drops (and counts) samples older than it', params: RunIdParams, body: StalenessBody, response: responses(Published, 202) } },
    async (req, reply) => reply.code(202).send(await publish(req, 'set_staleness', req.body.reason, req.body.bound)),
  );
};

export default control;
