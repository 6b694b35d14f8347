// The trainer's intake: reads AdvantagedTrajectory records into one step's batch — whole groups only, train split,
// this run's, within the staleness bound, never a trajectory already consumed — and says which offsets the step
// commits. Records read past a complete batch are carried to the next one; they are the records this trainer
// holds (commitOffset in core/processor.ts), so a step never commits past them.
import type { Consumer, LogRecord, TopicPartitionOffset } from '../../core/log/types.ts';
import { commitOffset } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { AdvantagedTrajectory } from '../../schemas/generated/types.ts';
import { sampleFromEvent, type TrainSample } from './batch.ts';
import type { ConsumedTrajectories } from './consumed.ts';

export interface TrainerCounters {
  consumed: number;
  droppedStale: number;
  skippedNonTrain: number;
  /** Samples of other runs sharing the topic (a shared Kafka cluster): never trained on. */
  skippedOtherRun: number;
  /**
   * Records read again after a rebalance handed a partition back from its committed offset while this trainer
   * held what it had read past that (in a step or in the next batch): skipped, each was consumed once already.
   */
  redelivered: number;
  /**
   * Records of trajectories a committed step had already taken (trained or dropped as stale), or that this step
   * took already: skipped (consumed.ts). Each step counts its own in the TrainStep metric skipped_already_consumed.
   */
  alreadyConsumed: number;
}

export function emptyTrainerCounters(): TrainerCounters {
  return { consumed: 0, droppedStale: 0, skippedNonTrain: 0, skippedOtherRun: 0, redelivered: 0, alreadyConsumed: 0 };
}

/** One step's intake. */
export interface IntakeBatch {
  /** The samples to train on (none when the step only records stale samples as consumed). */
  samples: TrainSample[];
  /** The offsets the step's transaction commits (none when it consumed nothing). */
  offsets: TopicPartitionOffset[];
  /** How long the batch took to gather. */
  waitMs: number;
  /** Every trajectory the step took, trained or dropped as stale: id → the policy version it was generated at. */
  taken: Map<string, number>;
  /** The ids dropped as stale (recorded in the TrainStep). */
  droppedIds: string[];
  /** Records skipped because their trajectory was consumed already. */
  alreadyConsumed: number;
}

/** What the trainer's state says while a batch is gathered; read on every record, since control changes it. */
export interface IntakeView {
  /** The trainer's current policy version (staleness is measured against it). */
  version(): number;
  stalenessBound(): number;
  /** After set_staleness lowered the bound, until the rollouts' gate reopens (see Trainer.onControl). */
  catchingUp(): boolean;
  stopped(): boolean;
}

export interface IntakeDeps {
  consumer: Consumer;
  serde: EventSerde;
  runId: string;
  groupsPerStep: number;
  /** The committed steps' trajectories; commit.ts adds to it after each step. */
  consumed: ConsumedTrajectories;
  counters: TrainerCounters;
  logger: Logger;
}

/**
 * How long the trainer waits, with nothing new arriving, before it records groups whose every sample was too
 * stale to train on as a step of their own. Normally the next group's step carries them; at the end of a finite
 * run there is no next group, and they would stay unconsumed forever.
 */
const STALE_TAIL_FLUSH_MS = 3000;

export class TrainerIntake {
  private readonly carry: LogRecord[] = [];
  /**
   * Per partition of the advantaged topic, the offset after the last record this trainer took (into a step, or
   * dropped or skipped). The trainer is the group's only member, so a rebalance (Kafka's session expiring during
   * a broker outage) gives the partitions straight back, from the committed offsets: the records between those
   * and this point are already in a committed step, the step being collected, or the carry.
   */
  private readonly readThrough = new Map<number, number>();

  constructor(private readonly deps: IntakeDeps) {}

  /**
   * Gather one step's samples: whole groups only (the advantage consumer emits a group's members together,
   * each carrying the emitted group size), stopping at `groupsPerStep` groups with at least one kept sample.
   * Returns null when stopped first. `step` (the step being gathered) is for the log lines only.
   */
  async collect(view: IntakeView, step: number): Promise<IntakeBatch | null> {
    const { consumer, consumed, counters, logger } = this.deps;
    const samples: TrainSample[] = [];
    const taken = new Map<string, number>();
    const droppedIds: string[] = [];
    let alreadyConsumed = 0;
    // per group: `emitted` is GroupStats.group_members, the members the advantage stage sent (a partial group sends
    // fewer than its trajectories' group_size), so a group is whole here when all of those arrived
    const seen = new Map<string, { emitted: number; got: number; kept: number; again: number }>();
    const next = new Map<number, number>();
    const t0 = performance.now();
    let lastArrival = t0;
    let lastNote = t0;
    const complete = () => {
      let kept = 0;
      for (const g of seen.values()) {
        if (g.got < g.emitted) return false;
        if (g.kept > 0) kept++;
      }
      return kept >= this.deps.groupsPerStep;
    };
    while (!view.stopped()) {
      const records = this.carry.length > 0 ? this.carry.splice(0) : await consumer.poll({ maxRecords: 256, timeoutMs: 200 });
      if (records.length > 0) lastArrival = performance.now();
      else if (performance.now() - lastNote > 5000) {
        lastNote = performance.now();
        const groups = [...seen.values()];
        logger.debug('waiting for samples', { step, samples: samples.length, groups: groups.length, complete: groups.filter((g) => g.got >= g.emitted).length, assignment: consumer.assignment().map((a) => `${a.topic}/${a.partition}@${a.offset}`).join(',') });
      }
      for (let i = 0; i < records.length; i++) {
        if (complete()) {
          // The rest waits for the next step; it stays uncommitted until that step is durable.
          this.carry.push(...records.slice(i));
          break;
        }
        const r = records[i]!;
        if (r.offset < (this.readThrough.get(r.partition) ?? 0)) {
          if (counters.redelivered++ === 0) logger.warn('the log handed back records this trainer had already taken (a rebalance rewound a partition to its committed offset); skipping them', { partition: r.partition, offset: r.offset, takenThrough: this.readThrough.get(r.partition) });
          continue;
        }
        this.readThrough.set(r.partition, r.offset + 1);
        next.set(r.partition, r.offset + 1);
        counters.consumed++;
        const d = await this.deps.serde.decode(r.value);
        if (d.name !== 'AdvantagedTrajectory') continue;
        const e: AdvantagedTrajectory = d.value;
        if (e.trajectory.run_id !== this.deps.runId) {
          counters.skippedOtherRun++;
          continue;
        }
        if (e.trajectory.dataset.split !== 'train') {
          counters.skippedNonTrain++;
          continue;
        }
        const g = seen.get(e.trajectory.group_id) ?? { emitted: Math.max(1, e.group.group_members), got: 0, kept: 0, again: 0 };
        seen.set(e.trajectory.group_id, g);
        g.got++;
        const id = e.trajectory.trajectory_id;
        if (consumed.has(id) || taken.has(id)) {
          // Counted towards its group's completeness (its group's other members may be new), never trained.
          g.again++;
          alreadyConsumed++;
          if (counters.alreadyConsumed++ === 0) logger.warn('a trajectory already taken by a committed step (or by this one) came again; skipping it, and every other such record (TrainStep metric skipped_already_consumed counts them)', { trajectory_id: id, partition: r.partition, offset: r.offset });
          continue;
        }
        const version = e.trajectory.min_policy_version;
        taken.set(id, version);
        const s = sampleFromEvent(e, view.version());
        if (s.staleness > view.stalenessBound() || consumed.belowHorizon(version)) {
          counters.droppedStale++;
          droppedIds.push(s.trajectoryId);
          continue;
        }
        g.kept++;
        samples.push(s);
      }
      // After the bound was lowered (set_staleness), groups the rollouts started under the old bound are
      // dropped while their gate, which counted them, stays shut until a new version: waiting for
      // groupsPerStep kept groups would wait forever, so the step takes what it kept. When every such group
      // arrived before this step began, nothing comes at all: the step is then empty, and its new version is
      // what reopens the gate.
      const quiet = performance.now() - lastArrival > STALE_TAIL_FLUSH_MS && [...seen.values()].every((g) => g.got >= g.emitted);
      // Groups that only came again (every member consumed before) make no step of their own: their offsets are
      // committed with the next one.
      const staleTail = quiet && (view.catchingUp() || (samples.length === 0 && [...seen.values()].some((g) => g.got > g.again)));
      if (complete() || staleTail) return { samples, offsets: this.stepOffsets(next), waitMs: performance.now() - t0, taken, droppedIds, alreadyConsumed };
    }
    return null;
  }

  /**
   * The offsets a step commits: after its last record per partition, or the consumer's position where that is
   * further, never past a record carried to the next step.
   */
  private stepOffsets(next: Map<number, number>): TopicPartitionOffset[] {
    const at = new Map(this.deps.consumer.assignment().filter((a) => a.topic === TOPICS.advantaged).map((a) => [a.partition, a.offset]));
    return [...next].map(([partition, offset]) => ({
      topic: TOPICS.advantaged,
      partition,
      offset: commitOffset(offset, at.get(partition), this.carry.filter((r) => r.partition === partition).map((r) => r.offset)),
    }));
  }

  /**
   * The [min, max] policy versions of the trajectories carried to the next step: read, not yet consumed, so their
   * versions' weights are kept (retention.ts). Records that do not decode name none.
   */
  async carriedVersions(): Promise<[number, number][]> {
    const referenced: [number, number][] = [];
    for (const r of this.carry) {
      const d = await this.deps.serde.decode(r.value).catch(() => null);
      if (d?.name === 'AdvantagedTrajectory') referenced.push([d.value.trajectory.min_policy_version, d.value.trajectory.max_policy_version]);
    }
    return referenced;
  }
}
