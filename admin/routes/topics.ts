// The log as an operator sees it: topics, their partitions' offsets, consumer groups and their lag.
// The EventLog contract has no "list groups" call, so the groups shown are the ones runs declare, plus those
// a log implementation can list (an optional listGroups()).
import { Type, type Static } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { EventLog } from '../../core/log/types.ts';
import { AdminError } from '../errors.ts';
import { listRuns } from '../live/runs.ts';
import { responses } from '../schemas.ts';

const TopicName = Type.String({ minLength: 1, maxLength: 249, pattern: '^[A-Za-z0-9._-]+$' });
const GroupId = Type.String({ minLength: 1, maxLength: 255, pattern: '^[A-Za-z0-9._:-]+$' });

const Partition = Type.Object({ partition: Type.Integer(), low: Type.Integer(), high: Type.Integer(), records: Type.Integer() });
const Topic = Type.Object({ name: Type.String(), partitions: Type.Integer(), offsets: Type.Array(Partition), records: Type.Integer() });
const LagRow = Type.Object({ topic: Type.String(), partition: Type.Integer(), committed: Type.Integer(), high: Type.Integer(), lag: Type.Integer() });
const Group = Type.Object({ groupId: Type.String(), role: Type.Union([Type.String(), Type.Null()]), runId: Type.Union([Type.String(), Type.Null()]), topics: Type.Array(Type.String()) });

type ListGroups = { listGroups?: () => Promise<string[]> };

async function topicInfo(log: EventLog, name: string, partitions: number) {
  const offsets = (await log.offsets(name)).map((p) => ({ ...p, records: p.high - p.low }));
  return { name, partitions, offsets, records: offsets.reduce((a, p) => a + p.records, 0) };
}

const topics: FastifyPluginAsync = async (app) => {
  const log = () => app.admin.ctx.log;

  async function knownTopic(name: string) {
    const spec = (await log().listTopics()).find((t) => t.name === name);
    if (!spec) throw new AdminError('ADM_ERR_NOT_FOUND', { what: `topic ${name}` });
    return spec;
  }

  app.get('/topics', { schema: { tags: ['log'], summary: 'Topics with per-partition offsets', response: responses(Type.Object({ topics: Type.Array(Topic) })) } }, async () => {
    const specs = (await log().listTopics()).sort((a, b) => a.name.localeCompare(b.name));
    return { topics: await Promise.all(specs.map((s) => topicInfo(log(), s.name, s.partitions))) };
  });

  app.get<{ Params: { topic: string } }>(
    '/topics/:topic',
    { schema: { tags: ['log'], summary: 'One topic’s partitions and offsets', params: Type.Object({ topic: TopicName }), response: responses(Topic) } },
    async (req) => {
      const spec = await knownTopic(req.params.topic);
      return topicInfo(log(), spec.name, spec.partitions);
    },
  );

  app.get('/consumer-groups', { schema: { tags: ['log'], summary: 'Consumer groups of the runs (and of the log, where it can list them)', response: responses(Type.Object({ groups: Type.Array(Group) })) } }, async () => {
    const groups = new Map<string, Static<typeof Group>>();
    for (const run of listRuns(app.admin)) {
      for (const [role, g] of Object.entries(run.consumerGroups)) groups.set(g.groupId, { groupId: g.groupId, role, runId: run.id, topics: g.topics });
    }
    const lister = log() as EventLog & ListGroups;
    if (typeof lister.listGroups === 'function') {
      for (const id of await lister.listGroups()) if (!groups.has(id) && !id.startsWith('rlstream-admin-tail-')) groups.set(id, { groupId: id, role: null, runId: null, topics: [] });
    }
    return { groups: [...groups.values()].sort((a, b) => a.groupId.localeCompare(b.groupId)) };
  });

  const LagQuery = Type.Object({ topic: Type.Optional(TopicName) });
  app.get<{ Params: { groupId: string }; Querystring: Static<typeof LagQuery> }>(
    '/consumer-groups/:groupId/lag',
    {
      schema: {
        tags: ['log'],
        summary: 'Per-partition lag of a consumer group (committed offset against the high watermark)',
        params: Type.Object({ groupId: GroupId }),
        querystring: LagQuery,
        response: responses(Type.Object({ groupId: Type.String(), partitions: Type.Array(LagRow), total: Type.Integer() })),
      },
    },
    async (req) => {
      const { groupId } = req.params;
      let names: string[];
      if (req.query.topic) {
        await knownTopic(req.query.topic);
        names = [req.query.topic];
      } else {
        const declared = listRuns(app.admin).flatMap((r) => Object.values(r.consumerGroups)).find((g) => g.groupId === groupId);
        if (!declared) throw new AdminError('ADM_ERR_VALIDATION', { detail: `group ${groupId} is not declared by a run: name its topic with ?topic=` });
        names = declared.topics;
      }
      const partitions = (await Promise.all(names.map((t) => log().lag(groupId, t)))).flat();
      return { groupId, partitions, total: partitions.reduce((a, p) => a + p.lag, 0) };
    },
  );
};

export default topics;
