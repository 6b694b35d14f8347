// Training progress from the log tail: train steps, policy versions, and one "live" call that gives the
// dashboard everything new since the step it last saw (plus rollout lag per partition) in a single poll.
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import { TOPICS } from '../../core/topics.ts';
import type { PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { AdminError } from '../errors.ts';
import { runView } from '../live/runs.ts';
import type { RunHistory } from '../live/tail.ts';
import { Nullable, responses, RunIdParams } from '../schemas.ts';

const Num = Nullable(Type.Number());
const NUMERIC_STEP_FIELDS = [
  'loss', 'pg_loss', 'kl', 'entropy', 'clip_fraction', 'approx_kl', 'grad_norm', 'learning_rate', 'reward_mean',
  'staleness_mean', 'iw_mean', 'iw_max', 'iw_truncated_fraction', 'wait_ms', 'compute_ms',
] as const;

const Step = Type.Object(
  {
    step: Type.Integer(),
    time_ms: Type.Number(),
    policy_version: Type.Integer(),
    produced_version: Nullable(Type.Integer()),
    trajectories: Type.Integer(),
    tokens: Type.Integer(),
    staleness_max: Type.Integer(),
    dropped_stale: Type.Integer(),
    ...Object.fromEntries(NUMERIC_STEP_FIELDS.map((f) => [f, Num])),
    tokens_per_s: Num,
    heldout_accuracy: Type.Optional(Num),
    metrics: Type.Record(Type.String(), Num),
  },
  { $id: 'TrainStep', title: 'TrainStep' },
);
const Version = Type.Object(
  {
    version: Type.Integer(),
    parent: Nullable(Type.Integer()),
    step: Type.Integer(),
    time_ms: Type.Number(),
    weights_uri: Type.String(),
    checksum: Type.String(),
    format: Type.String(),
    metrics: Type.Record(Type.String(), Num),
  },
  { $id: 'PolicyVersion', title: 'PolicyVersion' },
);

const finite = (x: number) => (Number.isFinite(x) ? x : null);
/** Held-out accuracy is reported by evaluators as a metric; these are the names it is recognised under. */
const HELDOUT = /^(heldout|held_out|eval|val)[/_.]?acc(uracy)?$/i;

function metricRecord(list: { name: string; value: number }[]): Record<string, number | null> {
  return Object.fromEntries(list.map((m) => [m.name, finite(m.value)]));
}

function stepView(s: TrainStep, prev: TrainStep | undefined) {
  const metrics = metricRecord(s.metrics);
  const elapsed = prev ? s.time_ms - prev.time_ms : s.wait_ms + s.compute_ms;
  const heldout = Object.entries(metrics).find(([k]) => HELDOUT.test(k));
  return {
    step: s.step,
    time_ms: s.time_ms,
    policy_version: s.policy_version,
    produced_version: s.produced_version,
    trajectories: s.trajectories,
    tokens: s.tokens,
    staleness_max: s.staleness_max,
    dropped_stale: s.dropped_stale,
    ...Object.fromEntries(NUMERIC_STEP_FIELDS.map((f) => [f, finite(s[f])])),
    tokens_per_s: elapsed > 0 ? finite((s.tokens * 1000) / elapsed) : null,
    ...(heldout ? { heldout_accuracy: heldout[1] } : {}),
    metrics,
  };
}

function versionView(v: PolicyVersion) {
  return { version: v.version, parent: v.parent, step: v.step, time_ms: v.time_ms, weights_uri: v.weights_uri, checksum: v.checksum, format: v.format, metrics: metricRecord(v.metrics) };
}

function stepsAfter(h: RunHistory | undefined, after: number | undefined, limit: number) {
  const steps = h?.steps ?? [];
  const out = [];
  for (let i = 0; i < steps.length; i++) {
    const s = steps[i]!;
    if (after !== undefined && s.step <= after) continue;
    out.push(stepView(s, steps[i - 1]));
  }
  // The newest `limit` steps: a dashboard opened late wants the recent curve, not the first steps.
  return out.slice(-limit);
}

const Paging = Type.Object({
  after: Type.Optional(Type.Integer({ minimum: -1, description: 'Only items with step (or version) greater than this.' })),
  limit: Type.Integer({ minimum: 1, maximum: 5000, default: 1000 }),
});

const PartitionLag = Type.Object({ groupId: Nullable(Type.String()), partition: Type.Integer(), high: Type.Integer(), committed: Nullable(Type.Integer()), lag: Nullable(Type.Integer()) });

const training: FastifyPluginAsync = async (app) => {
  app.addSchema(Step);
  app.addSchema(Version);

  function history(runId: string) {
    if (!runView(app.admin, runId)) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `run ${runId}` });
    return app.admin.tail?.get(runId);
  }

  app.get<{ Params: Static<typeof RunIdParams>; Querystring: Static<typeof Paging> }>(
    '/runs/:runId/train-steps',
    { schema: { tags: ['training'], summary: 'Train steps (newest `limit` after `after`)', params: RunIdParams, querystring: Paging, response: responses(Type.Object({ steps: Type.Array(Type.Ref('TrainStep')) })) } },
    async (req) => ({ steps: stepsAfter(history(req.params.runId), req.query.after, req.query.limit) }),
  );

  app.get<{ Params: Static<typeof RunIdParams>; Querystring: Static<typeof Paging> }>(
    '/runs/:runId/policy-versions',
    { schema: { tags: ['training'], summary: 'Policy versions published by the trainer', params: RunIdParams, querystring: Paging, response: responses(Type.Object({ versions: Type.Array(Type.Ref('PolicyVersion')) })) } },
    async (req) => {
      const versions = (history(req.params.runId)?.versions ?? []).filter((v) => req.query.after === undefined || v.version > req.query.after);
      return { versions: versions.slice(-req.query.limit).map(versionView) };
    },
  );

  app.get<{ Params: Static<typeof RunIdParams>; Querystring: Static<typeof Paging> }>(
    '/runs/:runId/live',
    {
      schema: {
        tags: ['training'],
        summary: 'Everything the dashboard polls: run status, new steps and versions, rollout lag per partition',
        params: RunIdParams,
        querystring: Paging,
        response: responses(
          Type.Object({
            run: Type.Ref('Run'),
            steps: Type.Array(Type.Ref('TrainStep')),
            versions: Type.Array(Type.Ref('PolicyVersion')),
            rolloutLag: Type.Array(PartitionLag),
            serverTimeMs: Type.Number(),
          }),
        ),
      },
    },
    async (req) => {
      const run = runView(app.admin, req.params.runId);
      if (!run) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `run ${req.params.runId}` });
      const h = app.admin.tail?.get(run.id);
      const log = app.admin.ctx.log;
      const topics = await log.listTopics();
      const rolloutLag: Static<typeof PartitionLag>[] = [];
      if (topics.some((t) => t.name === TOPICS.rolloutEvents)) {
        const groups = Object.values(run.consumerGroups).filter((g) => g.topics.includes(TOPICS.rolloutEvents));
        if (groups.length === 0) {
          // No declared reader: show how much each partition holds, so the chart still shows where rollouts go.
          for (const p of await log.offsets(TOPICS.rolloutEvents)) rolloutLag.push({ groupId: null, partition: p.partition, high: p.high, committed: null, lag: null });
        }
        for (const g of groups) {
          for (const l of await log.lag(g.groupId, TOPICS.rolloutEvents)) rolloutLag.push({ groupId: g.groupId, partition: l.partition, high: l.high, committed: l.committed, lag: l.lag });
        }
      }
      const after = req.query.after;
      return {
        run,
        steps: stepsAfter(h, after, req.query.limit),
        versions: (h?.versions ?? []).filter((v) => after === undefined || v.step > after).slice(-req.query.limit).map(versionView),
        rolloutLag,
        serverTimeMs: Date.now(),
      };
    },
  );
};

export default training;
