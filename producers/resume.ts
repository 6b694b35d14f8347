// Resuming a rollout worker after a crash: the trajectories of this run whose TrajectoryCompleted is already
// in the log. Trajectory ids are derived from (run, row position, epoch, sample index), so a restarted worker
// that walks the same rows skips these and re-runs only the ones that never completed: each trajectory
// reaches the reward consumer once, and a group cut short by the crash is completed under its own ids.
import { newId } from '../core/ids.ts';
import type { EventLog } from '../core/log/types.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { TOPICS } from '../core/topics.ts';
import { EVENT_NAMES } from '../schemas/index.ts';

export async function completedTrajectories(log: EventLog, serde: EventSerde, runId: string): Promise<Set<string>> {
  const done = new Set<string>();
  const ends = await log.offsets(TOPICS.rolloutEvents).catch(() => []);
  const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
  if (target.size === 0) return done;
  // Turns and tool calls are most of the topic: skip them by schema id without decoding.
  const skip = new Set(EVENT_NAMES.filter((n) => n !== 'TrajectoryCompleted').map((n) => serde.schemaId(n)));
  const consumer = await log.consumer({ groupId: `rollout-resume-${runId}-${newId()}`, topics: [TOPICS.rolloutEvents], fromBeginning: true });
  try {
    const seen = new Map<number, number>();
    let idle = 0;
    while ([...target].some(([p, h]) => (seen.get(p) ?? 0) < h) && idle < 25) {
      const records = await consumer.poll({ maxRecords: 2000, timeoutMs: 200 });
      idle = records.length === 0 ? idle + 1 : 0;
      for (const r of records) {
        seen.set(r.partition, r.offset + 1);
        if (r.value.length >= 5 && r.value[0] === 0 && skip.has(r.value.readUInt32BE(1))) continue;
        let ev;
        try {
          ev = serde.tryDecodeSync(r.value) ?? (await serde.decode(r.value));
        } catch {
          continue; // poison is the reward consumer's to dead-letter
        }
        if (ev.name === 'TrajectoryCompleted' && ev.value.trajectory.run_id === runId) done.add(ev.value.trajectory.trajectory_id);
      }
    }
  } finally {
    await consumer.close().catch(() => {});
  }
  return done;
}
