// Bytes a run's trajectories put in the log, measured on a finished run's embedded log (opened read-only): per
// topic and event type the records, their value bytes (Confluent-framed Avro, what a Kafka record's value holds)
// and key bytes; per trajectory of the run (TrajectoryCompleted counted) the bytes of every record that carries it
// (its rollout events, its rewarded and advantaged records) and its tokens (prompt + response). docs/scaling.md
// takes its log-traffic arithmetic from these figures.
// Usage: npm run bench -- log-bytes --log <run dir | log dir>
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { openEmbeddedLog } from '../core/log/embedded/index.ts';
import { EmbeddedRegistry } from '../core/serde/embedded-registry.ts';
import { EventSerde } from '../core/serde/events.ts';
import { FlagError, parseFlags, path } from './flags.ts';

const FLAGS = { log: path };

interface Tally {
  records: number;
  valueBytes: number;
  keyBytes: number;
}

export async function main(args: string[]): Promise<unknown> {
  const { values: f } = parseFlags(args, FLAGS);
  if (!f.log) throw new FlagError('--log <run dir | log dir> is needed');
  const dir = existsSync(join(f.log, 'log', 'topics')) ? join(f.log, 'log') : f.log;
  const log = openEmbeddedLog({ dir, readOnly: true });
  try {
    const serde = await new EventSerde(await EmbeddedRegistry.open(log)).init();
    const byType = new Map<string, Tally>();
    let trajectories = 0;
    let tokens = 0;
    let responseTokens = 0;
    const topics = (await log.listTopics()).map((t) => t.name).filter((n) => !n.startsWith('_'));
    for (const topic of topics) {
      const c = await log.consumer({ groupId: `log-bytes-${process.pid}-${topic}`, topics: [topic], fromBeginning: true, readCommitted: true });
      const ends = await log.offsets(topic);
      const left = new Map(ends.map((p) => [p.partition, p.high]));
      let idle = 0;
      while ([...left.values()].some((h) => h > 0) && idle < 20) {
        const rs = await c.poll({ maxRecords: 500, timeoutMs: 200 });
        idle = rs.length === 0 ? idle + 1 : 0;
        for (const r of rs) {
          if (r.offset + 1 >= (left.get(r.partition) ?? 0)) left.set(r.partition, 0);
          const d = await serde.decode(r.value).catch(() => null);
          const name = `${topic}/${d?.name ?? 'undecodable'}`;
          const t = byType.get(name) ?? { records: 0, valueBytes: 0, keyBytes: 0 };
          t.records++;
          t.valueBytes += r.value.length;
          t.keyBytes += r.key?.length ?? 0;
          byType.set(name, t);
          if (d?.name === 'TrajectoryCompleted' && topic === 'rollout.events') {
            trajectories++;
            tokens += d.value.trajectory.prompt_ids.length + d.value.trajectory.response_ids.length;
            responseTokens += d.value.trajectory.response_ids.length;
          }
        }
      }
      await c.close();
    }
    const perTrajectoryTopics = ['rollout.events', 'rewarded', 'advantaged'];
    const trajectoryBytes = [...byType].filter(([k]) => perTrajectoryTopics.includes(k.split('/')[0]!)).reduce((n, [, t]) => n + t.valueBytes + t.keyBytes, 0);
    const report = {
      log: dir,
      trajectories,
      tokens_per_trajectory: trajectories ? tokens / trajectories : null,
      response_tokens_per_trajectory: trajectories ? responseTokens / trajectories : null,
      // every record of rollout.events, rewarded and advantaged (values + keys), over the trajectories completed
      bytes_per_trajectory: trajectories ? trajectoryBytes / trajectories : null,
      bytes_per_token: tokens ? trajectoryBytes / tokens : null,
      by_type: Object.fromEntries([...byType].sort().map(([k, t]) => [k, { ...t, mean_value_bytes: t.valueBytes / t.records }])),
    };
    console.log(JSON.stringify(report, null, 1));
    return report;
  } finally {
    await log.close();
  }
}
