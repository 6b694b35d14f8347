// Resuming a rollout worker after a crash (or after its log was repaired): what the earlier lives of this run
// completed, read back from the log. A sample (group id, sample index; group ids are derived from the run, the
// row position and the epoch, so a restarted worker walking the same rows meets the same groups) counts as
// completed when its TrajectoryCompleted is on rollout.events, or when its trajectory reached rewarded or
// advantaged: a damaged rollout.events can lose a completion the reward consumer had already taken, and running
// that sample again would train it twice. Completed samples are skipped; the others run again.
//
// A sample that runs again gets a new trajectory id (sampleTrajectoryId with this life's tag): its earlier
// attempt may have published turns before the crash, and re-using the id would put two different histories
// under one (trajectory, turn_index) and one event id. The abandoned attempt stays in the log as a trajectory
// that started and never completed, which no reader trains on.
import { deriveId, newId } from '../core/ids.ts';
import type { EventLog, LogRecord } from '../core/log/types.ts';
import { readToEnd } from '../core/log/read-to-end.ts';
import type { EventSerde } from '../core/serde/events.ts';
import { TOPICS } from '../core/topics.ts';
import type { Trajectory } from '../schemas/generated/types.ts';
import { EVENT_NAMES, type EventName } from '../schemas/index.ts';

export interface ResumePoint {
  /** Samples an earlier life completed, as sampleKey(group_id, sample_index). */
  readonly completed: ReadonlySet<string>;
  /**
   * This life's tag in the ids of the trajectories it starts: null in a run's first life (ids are then
   * deterministic), a fresh id in every later one, so no id of an earlier attempt is used again.
   */
  readonly life: string | null;
}

export const sampleKey = (groupId: string, sampleIndex: number): string => `${groupId}/${sampleIndex}`;

/** The trajectory id of sample `sampleIndex` of a group in a life (see ResumePoint.life). */
export function sampleTrajectoryId(groupId: string, sampleIndex: number, life: string | null): string {
  return life === null ? deriveId(groupId, 'trajectory', sampleIndex) : deriveId(groupId, 'trajectory', sampleIndex, life);
}

/**
 * Read the run's completed samples back from the log. `resumed`: the caller knows this is a later life (the main
 * job resuming its run directory), so it is tagged even when damage left no record of the earlier ones.
 */
export async function readResumePoint(log: EventLog, serde: EventSerde, runId: string, options: { resumed?: boolean } = {}): Promise<ResumePoint> {
  const completed = new Set<string>();
  let earlier = options.resumed === true;
  const take = (t: Trajectory) => {
    if (t.run_id !== runId) return;
    earlier = true;
    if (t.dataset.split === 'train') completed.add(sampleKey(t.group_id, t.sample_index));
  };
  // The three topics at once: on Kafka each read starts with a group join, and a restart waits for the slowest.
  await Promise.all([
    // Turns and tool calls are most of rollout.events: skipped by schema id without decoding.
    scan(log, serde, runId, TOPICS.rolloutEvents, ['TrajectoryStarted', 'TrajectoryCompleted'], false, (name, value) => {
      if (name === 'TrajectoryCompleted') take((value as { trajectory: Trajectory }).trajectory);
      else if ((value as { run_id: string }).run_id === runId) earlier = true;
    }),
    ...[TOPICS.rewarded, TOPICS.advantaged].map((topic) => scan(log, serde, runId, topic, ['RewardedTrajectory', 'AdvantagedTrajectory'], true, (_, value) => take((value as { trajectory: Trajectory }).trajectory))),
  ]);
  return { completed, life: earlier ? newId() : null };
}

/** Every record of `topic` to its end at the time of the call, decoding only the events named in `want`. */
async function scan(log: EventLog, serde: EventSerde, runId: string, topic: string, want: EventName[], readCommitted: boolean, each: (name: EventName, value: unknown) => void): Promise<void> {
  const ends = await log.offsets(topic).catch(() => []);
  const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
  if (target.size === 0) return;
  const skip = new Set(EVENT_NAMES.filter((n) => !want.includes(n)).map((n) => serde.schemaId(n)));
  const consumer = await log.consumer({ groupId: `rollout-resume-${runId}-${newId()}`, topics: [topic], fromBeginning: true, readCommitted });
  try {
    await readToEnd(consumer, topic, target, async (records: LogRecord[]) => {
      for (const r of records) {
        if (r.value.length >= 5 && r.value[0] === 0 && skip.has(r.value.readUInt32BE(1))) continue;
        let ev;
        try {
          ev = serde.tryDecodeSync(r.value) ?? (await serde.decode(r.value));
        } catch {
          continue; // poison is the processors' to dead-letter
        }
        if (want.includes(ev.name)) each(ev.name, ev.value);
      }
    }, { what: `rollout resume: ${topic}`, timeoutMs: 120_000 });
  } finally {
    await consumer.close().catch(() => {});
  }
}
