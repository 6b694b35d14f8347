// One trajectory by id, as the trajectory viewer draws it: turns with tokens, loss masks and log-probs, and the
// tool calls with their results.
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import { AdminError } from '../errors.ts';
import { Nullable, responses } from '../schemas.ts';

const Turn = Type.Object({
  index: Type.Integer(),
  role: Type.String(),
  text: Type.String(),
  tokenIds: Type.Array(Type.Integer()),
  tokenTexts: Nullable(Type.Array(Type.String())),
  responseMask: Type.Array(Type.Integer()),
  logprobs: Type.Array(Nullable(Type.Number())),
  policyVersion: Type.Integer(),
  toolCalls: Type.Array(Type.Object({ id: Type.String(), name: Type.String(), argumentsJson: Type.String() })),
});
const ToolCall = Type.Object({
  callId: Type.String(),
  turnIndex: Type.Integer(),
  toolName: Type.String(),
  argumentsJson: Type.String(),
  status: Type.String(),
  resultText: Type.String(),
  latencyMs: Type.Number(),
  reward: Type.Number(),
});
const Trajectory = Type.Object(
  {
    trajectoryId: Type.String(),
    runId: Type.String(),
    groupId: Type.String(),
    agentName: Type.String(),
    dataSource: Type.String(),
    termination: Nullable(Type.String()),
    reward: Nullable(Type.Number()),
    correct: Nullable(Type.Boolean()),
    split: Nullable(Type.String({ description: "The dataset split of its row ('train', 'heldout', …)." })),
    training: Nullable(
      Type.Object(
        { outcome: Type.Union([Type.Literal('trained'), Type.Literal('dropped')]), step: Type.Integer() },
        { description: 'The train step that trained it, or dropped it as too stale; null when no step names it (held out, or not consumed yet).' },
      ),
    ),
    promptText: Type.String(),
    promptTokenIds: Type.Array(Type.Integer()),
    turns: Type.Array(Turn),
    toolCalls: Type.Array(ToolCall),
  },
  { $id: 'Trajectory', title: 'Trajectory' },
);

const trajectories: FastifyPluginAsync = async (app) => {
  app.addSchema(Trajectory);
  app.get<{ Params: { trajectoryId: string } }>(
    '/trajectories/:trajectoryId',
    {
      schema: {
        tags: ['traces'],
        summary: 'A trajectory: turns, tool calls, tokens with loss masks',
        params: Type.Object({ trajectoryId: Type.String({ minLength: 1, maxLength: 200, pattern: '^[A-Za-z0-9._:-]+$' }) }),
        response: responses(Type.Ref('Trajectory')),
      },
    },
    async (req) => {
      const traces = app.admin.ctx.traces;
      if (!traces) throw new AdminError('ADM_ERR_UNAVAILABLE', { what: 'the trace store' });
      const t = await traces.trajectory(req.params.trajectoryId);
      if (!t) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `trajectory ${req.params.trajectoryId}` });
      return { ...t, turns: t.turns.map((turn) => ({ ...turn, logprobs: turn.logprobs.map((x) => (Number.isFinite(x) ? x : null)) })) };
    },
  );
};

export default trajectories;
