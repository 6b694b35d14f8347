// The advantage consumer: RewardedTrajectory (rewarded) → AdvantagedTrajectory (advantaged, key group_id).
// Groups are assembled by group_id and emitted when complete or timed out; the estimator (registry by name)
// runs on the group; evaluation rollouts (dataset.split ≠ train) are skipped, with a warning naming the split the
// first time. A member that cannot belong to its group (sample_index not below group_size, a group_size other
// than its group's) is dead-lettered with the reason; partial and late groups are warned about. What a closed
// group's members get is the advantage stage (stage.ts), which replay and `rlstream advantage` share. Open groups are
// state the processor runtime protects: commits stay below held records and a restart skips what was already
// emitted.
import { RlstreamError } from '../../core/errors.ts';
import { deriveId } from '../../core/ids.ts';
import type { EventLog } from '../../core/log/types.ts';
import { StreamProcessor, type InputRecord, type ProcessContext, type ProcessorHandler } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { RewardedTrajectory } from '../../schemas/generated/types.ts';
import type { EstimatorOptions } from './estimators.ts';
import { GroupTable, type CloseReason, type OpenGroup } from './groups.ts';
import { advantagedBody, advantageGroup, advantageStage, checkMember, getsAdvantage, rewardedSample, type AdvantageStage } from './stage.ts';

export interface AdvantageOptions {
  /** Estimator name, as registered (estimators.ts). Default grpo. */
  estimator?: string;
  estimatorOptions?: Partial<EstimatorOptions>;
  /**
   * A group still incomplete this long after its first member was written (its record timestamp) is closed: once a
   * record that much newer is read from its partition, or, with the partition read to its end, once the wall
   * clock has passed it. Default 60 000 ms.
   */
  groupTimeoutMs?: number;
  /** What a closed incomplete group does: drop its members, or emit those present. Default emit. */
  partialGroups?: 'drop' | 'emit';
  /** Most groups held at once; past it the oldest is closed as if timed out. Default 10 000. */
  maxOpenGroups?: number;
  /** Drop groups whose rewards are all equal (DAPO's dynamic sampling). Default false. */
  dynamicSampling?: boolean;
  outputTopic?: string;
  /** Where the reasons of skipped, partial and late records are logged. */
  logger?: Logger;
}

export interface AdvantageConsumerOptions extends AdvantageOptions {
  log: EventLog;
  serde: EventSerde;
  id?: string;
  inputTopic?: string;
  maxBatchRecords?: number;
  logger?: Logger;
}

export class AdvantageHandler implements ProcessorHandler {
  private readonly groups = new GroupTable();
  private readonly stage: AdvantageStage;
  /** Reasons already logged: each kind is logged once with an example, then only counted. */
  private readonly warned = new Set<string>();

  constructor(
    private readonly id: string,
    private readonly options: AdvantageOptions = {},
  ) {
    this.stage = advantageStage({ ...(options.estimator ? { estimator: options.estimator } : {}), ...(options.estimatorOptions ? { options: options.estimatorOptions } : {}), dynamicSampling: options.dynamicSampling ?? false });
    if (options.partialGroups !== undefined && options.partialGroups !== 'drop' && options.partialGroups !== 'emit') {
      throw new RlstreamError('CONFIG_INVALID', `advantage.partialGroups must be drop or emit, got "${String(options.partialGroups)}"`);
    }
  }

  get openGroups(): number {
    return this.groups.size;
  }

  handle(input: InputRecord, ctx: ProcessContext): void {
    const ev = input.event.value as RewardedTrajectory;
    const traj = ev.trajectory;
    // Every record read moves its partition's clock, and groups that clock has aged past the timeout close before
    // this record joins anything: a member that much newer than its group's first is late, live or replayed.
    const { topic, partition } = input.record;
    const clock = this.groups.observe(input.record);
    for (const g of this.groups.expired(topic, partition, clock, this.timeoutMs, 'log')) this.close(g, 'timeout', ctx);
    if (!getsAdvantage(traj)) {
      ctx.count('skipped_not_train');
      // Held-out rollouts are the run's own evaluations, skipped here by design: only another split is a mistake.
      if (traj.dataset.split !== 'heldout') this.warnOnce(`split:${traj.dataset.split}`, 'trajectory skipped: only dataset.split "train" gets advantages and is trained on (evaluation rollouts use "heldout")', { split: traj.dataset.split, trajectory_id: traj.trajectory_id });
      return;
    }
    checkMember(ev);
    const size = Math.max(1, traj.group_size);
    if (this.groups.isClosed(traj.group_id)) {
      ctx.count('late_members');
      this.warnOnce('late', 'trajectory skipped: its group was already closed (complete, or timed out after advantage.group_timeout_ms); it gets no advantage', { group_id: traj.group_id, trajectory_id: traj.trajectory_id });
      return;
    }
    const open = this.groups.get(traj.group_id);
    if (open && open.expected !== size) {
      throw new RlstreamError('INPUT_INVALID', `trajectory ${traj.trajectory_id}: group_size ${traj.group_size} differs from ${open.expected}, the group_size of the first member of group ${traj.group_id}`);
    }
    const { group, duplicate } = this.groups.add({ record: input.record, event: ev }, ctx.now);
    if (duplicate) return ctx.count('duplicates');
    if (group.members.length >= group.expected) this.close(group, 'complete', ctx);
    const max = this.options.maxOpenGroups ?? 10_000;
    while (this.groups.size > max) this.close(this.groups.oldest()!, 'evicted', ctx);
  }

  private warnOnce(kind: string, message: string, fields: Record<string, unknown>): void {
    if (this.warned.has(kind) || this.warned.size >= 1000) return;
    this.warned.add(kind);
    this.options.logger?.warn(message, { ...fields, note: 'logged once per kind; see the processor counters for totals' });
  }

  private get timeoutMs(): number {
    return this.options.groupTimeoutMs ?? 60_000;
  }

  /**
   * The wall clock closes a group only in a partition read to its end: then no member of it can still be waiting
   * in the log, and its producers have gone quiet for the timeout. A partition with records still unread waits
   * for its own clock (handle), so a consumer behind its input never closes a group its unread records complete.
   * The wall clock is this machine's, so the group's age on it counts from when this consumer read its first
   * member: a writer's clock skewed from ours moves no group's close earlier.
   */
  async tick(ctx: ProcessContext): Promise<void> {
    for (const { topic, partition } of this.groups.partitionsOlderThan(ctx.now, this.timeoutMs)) {
      if (!(await ctx.caughtUp(topic, partition))) continue;
      for (const g of this.groups.expired(topic, partition, ctx.now, this.timeoutMs, 'wall')) this.close(g, 'timeout', ctx);
    }
  }

  pending(topic: string, partition: number): number[] {
    return this.groups.heldOffsets(topic, partition);
  }

  release(topic: string, partition: number): void {
    this.groups.dropPartition(topic, partition);
  }

  private close(g: OpenGroup, reason: CloseReason, ctx: ProcessContext): void {
    this.groups.close(g.groupId);
    const partial = g.members.length < g.expected;
    if (partial) {
      ctx.count(`partial_${reason}`);
      this.warnOnce(`partial:${reason}`, `group closed partial (${reason}): fewer members arrived than its group_size says; a producer must send group_size trajectories per group_id`, {
        group_id: g.groupId,
        members: g.members.length,
        group_size: g.expected,
        partial_groups: this.options.partialGroups ?? 'emit',
      });
      if ((this.options.partialGroups ?? 'emit') === 'drop') {
        ctx.count('partial_dropped_members', g.members.length);
        return;
      }
    }
    let result;
    try {
      result = advantageGroup(this.stage, g.members, (m) => rewardedSample(this.stage, m.event), g.expected);
    } catch (err) {
      for (const m of g.members) ctx.deadLetter(m.record, err);
      return;
    }
    if (result.filtered) {
      ctx.count('filtered_groups');
      ctx.count('filtered_members', g.members.length);
      return;
    }
    ctx.count('groups_emitted');
    for (const { member: m, result: r } of result.members) {
      const value = { event_id: deriveId(m.event.event_id, this.id), time_ms: ctx.now, ...advantagedBody(this.stage, m.event, r, result.stats) };
      ctx.emit({ topic: this.options.outputTopic ?? TOPICS.advantaged, name: 'AdvantagedTrajectory', key: g.groupId, value }, m.record);
    }
  }
}

export function createAdvantageProcessor(options: AdvantageConsumerOptions): StreamProcessor {
  const id = options.id ?? 'advantage';
  return new StreamProcessor({
    id,
    log: options.log,
    serde: options.serde,
    inputTopics: [options.inputTopic ?? TOPICS.rewarded],
    accepts: ['RewardedTrajectory'],
    handler: new AdvantageHandler(id, options),
    maxBatchRecords: options.maxBatchRecords ?? 500,
    logger: options.logger,
  });
}
