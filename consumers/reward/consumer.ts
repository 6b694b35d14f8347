// The reward consumer: TrajectoryCompleted (rollout.events) → RewardedTrajectory (rewarded, key group_id).
// Rule-based functions by data_source (or one user function for all), an optional batched reward model, tool
// and interaction rewards and shaping as named components; a reward an outside agent gave
// (extra_info.external_reward) is the outcome as it is. The scoring itself is the reward stage (stage.ts), which
// replay and `rlstream score` share. A function that throws or returns NaN / Inf dead-letters that record only;
// everything runs on the exactly-once processor runtime.
import { RlstreamError, describeError } from '../../core/errors.ts';
import { deriveId } from '../../core/ids.ts';
import type { EventLog } from '../../core/log/types.ts';
import { RecentIds, StreamProcessor, type InputRecord, type ProcessContext, type ProcessorHandler } from '../../core/processor.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { NamedValue, Trajectory, TrajectoryCompleted } from '../../schemas/generated/types.ts';
import type { BatchScorer } from './model.ts';
import { defaultRewards, loadRewardModule, type RewardRegistry } from './registry.ts';
import { composeReward, type ShapingOptions } from './shaping.ts';
import { rewardOutcome, trajectoryInput, type Outcome, type RewardStage } from './stage.ts';
import type { RewardFn } from '../../core/tasks/reward-fn.ts';

export interface RewardConsumerOptions {
  log: EventLog;
  serde: EventSerde;
  /** Processor id (consumer group, transactional id). Default "reward". */
  id?: string;
  registry?: RewardRegistry;
  /** One function for every data_source (verl's custom_reward_function); overrides the registry. */
  fn?: RewardFn;
  /** The name of `fn` in RewardInfo.reward_fn. Default "custom". */
  fnName?: string;
  /** Or load it: config `reward.module` and its export name. */
  module?: { path: string; export?: string; baseDir?: string };
  shaping?: ShapingOptions;
  /** A batched reward model; its score × weight is the `reward_model` component. */
  model?: { scorer: BatchScorer; weight?: number };
  /** Up to B trajectories per batch, waiting at most T ms for it to fill. Defaults 256 / 0 (20 with a model). */
  batch?: { maxRecords?: number; maxWaitMs?: number };
  inputTopic?: string;
  outputTopic?: string;
  logger?: Logger;
}

export class RewardHandler implements ProcessorHandler {
  private readonly seen = new RecentIds();
  private readonly stage: RewardStage;
  /** Without a reward model: each record is scored and emitted as soon as the processor has decoded it. */
  readonly handle?: (input: InputRecord, ctx: ProcessContext) => Promise<void>;
  /** With a reward model: the batch's trajectories go to the model together. */
  readonly handleBatch?: (inputs: InputRecord[], ctx: ProcessContext) => Promise<void>;

  constructor(
    private readonly id: string,
    private readonly options: Pick<RewardConsumerOptions, 'registry' | 'fn' | 'fnName' | 'shaping' | 'model' | 'outputTopic'>,
  ) {
    this.stage = { registry: options.registry ?? defaultRewards, fn: options.fn ? { fn: options.fn, name: options.fnName ?? 'custom' } : null, shaping: options.shaping ?? {} };
    if (options.model) this.handleBatch = (inputs, ctx) => this.scoreBatch(inputs, ctx);
    else this.handle = (input, ctx) => this.scoreOne(input, ctx);
  }

  /** One record without a model; a throw dead-letters it (the processor does). */
  private async scoreOne(input: InputRecord, ctx: ProcessContext): Promise<void> {
    const ev = input.event.value as TrajectoryCompleted;
    if (this.seen.seen(ev.event_id, input.record)) return this.duplicate(input, ctx);
    const { outcome, fnName } = await this.outcome(ev.trajectory);
    this.emitReward(input, ev.trajectory, outcome!, fnName, [], ctx);
  }

  private async scoreBatch(inputs: InputRecord[], ctx: ProcessContext): Promise<void> {
    const model = this.options.model!;
    const ready: { input: InputRecord; traj: Trajectory; outcome: Outcome | null; fnName: string }[] = [];
    for (const input of inputs) {
      const ev = input.event.value as TrajectoryCompleted;
      if (this.seen.seen(ev.event_id, input.record)) {
        this.duplicate(input, ctx);
        continue;
      }
      try {
        const traj = ev.trajectory;
        const { outcome, fnName } = await this.outcome(traj);
        ready.push({ input, traj, outcome, fnName });
      } catch (err) {
        ctx.deadLetter(input.record, err);
      }
    }
    const modelScores = await this.modelScores(ready.map((r) => r.traj), ctx, ready.map((r) => r.input));
    ready.forEach((r, i) => {
      try {
        const extra: NamedValue[] = [];
        let outcome = r.outcome;
        let fnName = r.fnName;
        const s = modelScores?.[i];
        if (s === undefined) return; // the model failed: the batch was dead-lettered
        if (!Number.isFinite(s)) throw new RlstreamError('REWARD_NON_FINITE', `reward model ${model.scorer.name} returned ${s}`);
        const v = s * (model.weight ?? 1);
        if (outcome) extra.push({ name: 'reward_model', value: v });
        else outcome = { score: v, components: [{ name: 'reward_model', value: v }], correct: null };
        fnName = fnName ? `${fnName}+${model.scorer.name}` : model.scorer.name;
        this.emitReward(r.input, r.traj, outcome, fnName, extra, ctx);
      } catch (err) {
        ctx.deadLetter(r.input.record, err);
      }
    });
  }

  private duplicate(input: InputRecord, ctx: ProcessContext): void {
    ctx.count('duplicates');
    const ev = input.event.value as TrajectoryCompleted;
    ctx.logger.debug('duplicate input dropped', { eventId: ev.event_id, trajectoryId: ev.trajectory.trajectory_id, topic: input.record.topic, partition: input.record.partition, offset: input.record.offset });
  }

  private emitReward(input: InputRecord, traj: Trajectory, outcome: Outcome, fnName: string, extra: NamedValue[], ctx: ProcessContext): void {
    const reward = composeReward(traj, outcome, fnName, this.stage.shaping, extra);
    const ev = input.event.value as TrajectoryCompleted;
    ctx.emit(
      {
        topic: this.options.outputTopic ?? TOPICS.rewarded,
        name: 'RewardedTrajectory',
        key: traj.group_id,
        value: { event_id: deriveId(ev.event_id, this.id), time_ms: ctx.now, trajectory: traj, reward },
      },
      input.record,
    );
  }

  private outcome(traj: Trajectory): Promise<{ outcome: Outcome | null; fnName: string }> {
    return rewardOutcome(this.stage, trajectoryInput(traj), this.options.model !== undefined);
  }

  private async modelScores(trajs: Trajectory[], ctx: ProcessContext, inputs: InputRecord[]): Promise<number[] | undefined> {
    const model = this.options.model;
    if (!model || trajs.length === 0) return undefined;
    try {
      const seqs = trajs.map((t) => {
        const ids = new Int32Array(t.prompt_ids.length + t.response_ids.length);
        ids.set(t.prompt_ids);
        ids.set(t.response_ids, t.prompt_ids.length);
        return ids;
      });
      ctx.count('model_batches');
      return await model.scorer.score(seqs);
    } catch (err) {
      const e = new RlstreamError('REWARD_FAILED', `reward model ${model.scorer.name} failed: ${describeError(err)}`, { cause: err });
      for (const input of inputs) ctx.deadLetter(input.record, e);
      return undefined;
    }
  }
}

export async function createRewardProcessor(options: RewardConsumerOptions): Promise<StreamProcessor> {
  const id = options.id ?? 'reward';
  const fn = options.fn ?? (options.module ? await loadRewardModule(options.module.path, options.module.export, options.module.baseDir) : undefined);
  const handler = new RewardHandler(id, { ...options, fn });
  return new StreamProcessor({
    id,
    log: options.log,
    serde: options.serde,
    inputTopics: [options.inputTopic ?? TOPICS.rolloutEvents],
    accepts: ['TrajectoryCompleted'],
    handler,
    maxBatchRecords: options.batch?.maxRecords ?? (options.model ? 64 : 256),
    maxBatchWaitMs: options.batch?.maxWaitMs ?? (options.model ? 20 : 0),
    logger: options.logger,
  });
}
