// The trainer role: consumes AdvantagedTrajectory, keeps only train-split samples within the staleness
// bound, and runs asynchronous, off-policy-corrected PPO steps on the native core. Each step is made
// durable before it is acknowledged: checkpoint on disk first, then one log transaction holding the
// TrainStep, the PolicyVersion (every k steps) and the consumed offsets. After a crash the trainer resumes
// from the checkpoint of the last committed TrainStep with the committed offsets: no sample used twice.
//
// This class composes the parts, each in its own module: intake.ts (read, carry, staleness drop, offsets),
// step.ts (the optimizer step and its metrics), commit.ts (checkpoint, transaction, restore), retention.ts
// (checkpoint and weights pruning) and core/control.ts (the control topic).
import { join } from 'node:path';
import { followControl } from '../../core/control.ts';
import { describeError } from '../../core/errors.ts';
import type { Follower } from '../../core/log/follow.ts';
import type { Consumer, EventLog } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { Control, NamedValue, PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { Model, type DeviceKind, type ModelConfig } from '../../native/index.ts';
import { checkpointExists, checkpointPath, StepCommitter, trainStepEvent, type StoredWeights } from './commit.ts';
import { ConsumedTrajectories } from './consumed.ts';
import { checkDeviceRunsHere } from './device.ts';
import type { TrainSample } from './batch.ts';
import { emptyTrainerCounters, TrainerIntake, type IntakeBatch, type IntakeView, type TrainerCounters } from './intake.ts';
import { learningRateAt } from './lr-schedule.ts';
import type { TrainerOptions } from './options.ts';
import { checkTrainerDevices } from './parallel/devices.ts';
import { RankProcesses } from './parallel/launcher.ts';
import { loadTrainerModel, type TrainerModelSpec } from './parallel/rank-model.ts';
import { RankFailed } from '../../native/collectives/collective.ts';
import { DataParallelRank, rankStepThenCommit } from './parallel/rank-step.ts';
import { groupsOf, shardStep } from './parallel/shard.ts';
import { saveOptimizerShard } from '../../native/optimizer-state.ts';
import { pruneCheckpoints, retainWeights } from './retention.ts';
import { emptyStepMetrics, trainOnBatch, type StepMetrics } from './step.ts';

export interface TrainerDeps {
  log: EventLog;
  serde: EventSerde;
  runId: string;
  /** Where checkpoints (trainer/) and content-addressed weights (weights/) live. */
  dataDir: string;
  /** Initial weights (version 0) when no checkpoint exists. */
  initialWeightsPath: string;
  /**
   * The warm start as a checkpoint directory (weights and AdamW moments): RL then continues the optimizer of
   * SFT instead of starting Adam afresh, whose first steps move every parameter by the full learning rate.
   */
  initialCheckpoint?: string | null;
  modelConfig: ModelConfig;
  /**
   * The model's config.json as read, published with every policy version: inference servers that load a
   * version (SGLang, vLLM) need its architectures/model_type, which the parsed modelConfig drops.
   * Default: modelConfig as JSON.
   */
  modelConfigJson?: string;
  options: TrainerOptions;
  logger?: Logger;
  /** Called after every durable step (progress bars, tests). */
  onStep?: (step: TrainStep) => void;
  /** Metrics measured elsewhere (e.g. the latest held-out accuracy) recorded with each TrainStep. */
  extraMetrics?: () => NamedValue[];
  /** Follow the control topic (set_staleness, stop); default true. */
  followControl?: boolean;
  /**
   * Called with each new version's weights in the trainer's model, after they are stored and before their
   * PolicyVersion is sent, while the model is idle: a generating model in this process (LlmBackend.stageWeights)
   * copies them device to device instead of reading the stored file, or engines on other GPUs get them by
   * broadcast. Awaited: the next step may change the weights only once their transfer is queued before it.
   */
  onWeights?: (version: number, model: Model) => void | Promise<void>;
  /**
   * Called with each new version's PolicyVersion once its step is committed, before the weights retention runs and
   * the next step starts, and awaited: export.every_versions writes the version's directory here.
   */
  onVersion?: (pv: PolicyVersion) => Promise<void> | void;
  /** The restore's deadline (commit.ts RESTORE_TIMEOUT_MS by default). */
  restoreTimeoutMs?: number;
}

const GROUP_ID = 'trainer';

export class Trainer {
  private model!: Model;
  private ref: Model | null = null;
  /** With trainer.devices > 1: the other ranks' processes, and this process's rank (rank 0). */
  private ranks: RankProcesses | null = null;
  private rank: DataParallelRank | null = null;
  private consumer!: Consumer;
  private intake!: TrainerIntake;
  private readonly committer: StepCommitter;
  private step = 0;
  private version = 0;
  private stopped = false;
  /** The run's staleness bound: trainer.staleness_bound, then what set_staleness on the control topic says. */
  private stalenessBound: number;
  private control: Follower | null = null;
  /** The step loop run() started, awaited by close(). */
  private running: Promise<void> | null = null;
  /**
   * After set_staleness lowered the bound at version v from `old` to `new`, the rollout gate (shut while
   * groupsStarted >= (version + bound + 1) * groupsPerStep) may have started groups for versions up to v + old,
   * and under the new bound reopens only at version v + old - new + 1. Until then a step may take stale-only or
   * no samples (collect) when nothing else comes; a step that fills normally meanwhile counts towards it. Bounded
   * so that rollouts that are merely slow never see versions run further ahead of them.
   */
  private catchUpToVersion = -1;
  private readonly startedMs = Date.now();
  readonly counters: TrainerCounters = emptyTrainerCounters();
  /** The trajectories of the committed steps, by id (durable in each step's checkpoint; consumed.ts). */
  private consumed = ConsumedTrajectories.empty();
  private readonly logger: Logger;
  /** This run's versions whose weights may still be in the store (version → checksum), for retention. */
  private readonly storedVersions = new Map<number, string>();
  /** What the intake reads of this trainer's state while it gathers a batch. */
  private readonly view: IntakeView = {
    version: () => this.version,
    stalenessBound: () => this.stalenessBound,
    catchingUp: () => this.version < this.catchUpToVersion,
    stopped: () => this.stopped,
  };

  constructor(private readonly deps: TrainerDeps) {
    this.logger = (deps.logger ?? silentLogger).child({ role: 'trainer' });
    this.stalenessBound = deps.options.stalenessBound;
    this.committer = new StepCommitter({
      log: deps.log,
      serde: deps.serde,
      runId: deps.runId,
      groupId: `${deps.runId}.${GROUP_ID}`,
      checkpointDir: this.ckptDir,
      weightsDir: this.weightsDir,
      modelConfigJson: deps.modelConfigJson ?? JSON.stringify(deps.modelConfig),
      logger: this.logger,
      ...(deps.restoreTimeoutMs === undefined ? {} : { restoreTimeoutMs: deps.restoreTimeoutMs }),
    });
  }

  /** The staleness bound in force (changed by set_staleness). */
  get currentStalenessBound(): number {
    return this.stalenessBound;
  }

  /** The newest policy version this trainer has published (LlmBackend's name for the same concept). */
  currentPolicyVersion(): number {
    return this.version;
  }

  get currentStep(): number {
    return this.step;
  }

  /** Where the model trains (trainer.device), once start() has loaded it. */
  get device(): DeviceKind {
    return this.model.device;
  }

  private get ckptDir(): string {
    return join(this.deps.dataDir, 'trainer');
  }

  private get weightsDir(): string {
    return join(this.deps.dataDir, 'weights');
  }

  /** Restore state from the log and disk; publish version 0 when the run is new. */
  async start(): Promise<void> {
    const { log, options } = this.deps;
    checkTrainerDevices(options.dataParallel);
    checkDeviceRunsHere(options.device);
    const on = { threads: options.threads, device: options.device, recompute: options.recompute };
    await this.committer.open();
    const last = await this.committer.restore();
    this.step = last.step;
    this.version = last.version;
    for (const [v, checksum] of last.stored) this.storedVersions.set(v, checksum);
    // With trainer.lora the model's weights stay frozen and adapters train over them; a checkpoint then holds the
    // adapters alone, resumed over the same initial weights (rank-model.ts).
    const spec: TrainerModelSpec = {
      checkpoint: this.step > 0 ? checkpointPath(this.ckptDir, this.step) : null,
      initialWeightsPath: this.deps.initialWeightsPath,
      initialCheckpoint: this.deps.initialCheckpoint ?? null,
      modelConfig: this.deps.modelConfig,
    };
    if (this.step === 0 && options.lora && this.deps.initialCheckpoint)
      this.logger.info('trainer.lora: adapters start fresh over the warm start\'s weights (its AdamW moments are for all weights)', { checkpoint: this.deps.initialCheckpoint });
    const dp = options.dataParallel;
    if (dp.ranks > 1) {
      // The other ranks load the same model in their processes meanwhile; each cuts its optimizer shard before its
      // moments load, so a resume may change the rank count (native/optimizer-state.ts).
      const ranks = (this.ranks = await RankProcesses.start({ size: dp.ranks, deviceIds: dp.deviceIds, collective: dp.collective, spec, options, logger: this.logger }));
      try {
        this.model = await loadTrainerModel(spec, options, (m) => (this.rank = new DataParallelRank(m, ranks.collective, options)));
        await ranks.ready();
      } catch (err) {
        ranks.collective.abort(err);
        await ranks.close();
        this.ranks = null;
        throw err;
      }
    } else {
      this.model = await loadTrainerModel(spec, options);
    }
    if (this.step > 0) {
      const dir = checkpointPath(this.ckptDir, this.step);
      // What the committed steps took: the checkpoint's set and the log's TrainSteps, merged, so that either one
      // surviving damage is enough to skip a trajectory that comes again.
      const saved = await ConsumedTrajectories.load(dir);
      if (saved.problem !== null) this.logger.warn('the checkpoint\'s consumed set cannot be used; rebuilding it from the log\'s TrainSteps alone', { problem: saved.problem });
      this.consumed = saved.set ?? ConsumedTrajectories.empty();
      this.consumed.add(last.taken, this.version, this.stalenessBound);
      const { exact, older } = this.consumed.size;
      this.logger.info('resumed from checkpoint', { step: this.step, version: this.version, consumed_exact: exact, consumed_older: older, consumed_horizon: this.consumed.horizon, from_checkpoint: saved.set !== null, ranks: dp.ranks });
    }
    if (options.klCoef > 0) this.ref = Model.load(this.deps.initialWeightsPath, this.deps.modelConfig, on);
    if (last.versions === 0) {
      const stored = await this.committer.publishVersion0(this.model);
      this.storedVersions.set(0, stored.checksum);
      this.logger.info('published initial policy version', { version: 0, checksum: stored.checksum });
    }
    this.consumer = await log.consumer({ groupId: `${this.deps.runId}.${GROUP_ID}`, topics: [TOPICS.advantaged], readCommitted: true });
    this.intake = new TrainerIntake({ consumer: this.consumer, serde: this.deps.serde, runId: this.deps.runId, groupsPerStep: options.groupsPerStep, consumed: this.consumed, counters: this.counters, logger: this.logger });
    // set_staleness changes the bound the intake enforces; stop ends run() after the step under way.
    if (this.deps.followControl ?? true) {
      this.control = followControl(log, this.deps.serde, {
        runId: this.deps.runId,
        startedMs: this.startedMs,
        role: 'trainer',
        onControl: (c) => this.onControl(c),
        onError: (err) => this.logger.warn('following control failed; retrying', { error: describeError(err) }),
      });
    }
  }

  /** Apply a command of this run and session (core/control.ts chooses which commands reach here). */
  onControl(c: Control): void {
    if (c.command === 'set_staleness' && c.staleness_bound !== null && c.staleness_bound >= 0) {
      if (c.staleness_bound < this.stalenessBound) this.catchUpToVersion = Math.max(this.catchUpToVersion, this.version + this.stalenessBound - c.staleness_bound + 1);
      this.stalenessBound = c.staleness_bound;
      this.logger.info('control: staleness bound set', { staleness_bound: c.staleness_bound });
    } else if (c.command === 'stop') {
      this.logger.info('control: stop', { reason: c.reason });
      this.stop();
    }
  }

  stop(): void {
    this.stopped = true;
  }

  /** Run steps until stopped or maxSteps reached. */
  run(): Promise<void> {
    this.running = this.steps();
    return this.running;
  }

  private async steps(): Promise<void> {
    const max = this.deps.options.maxSteps;
    while (!this.stopped && (max === 0 || this.step < max)) {
      const batch = await this.intake.collect(this.view, this.step + 1);
      if (!batch) break;
      if (this.ranks !== null) {
        await this.dataParallelStep(batch);
        continue;
      }
      // Only stale samples: a step that records them as consumed (dropped_trajectory_ids) and changes no weight.
      const metrics = batch.samples.length === 0 ? emptyStepMetrics() : await trainOnBatch(this.model, this.ref, batch.samples, this.deps.options, this.step);
      await this.commitStep(batch, metrics);
    }
  }

  /**
   * One step over every rank: the batch's groups sharded whole (shard.ts), each rank its share, every rank's
   * optimizer shard written into the step's checkpoint, then this process (rank 0) commits once every rank has
   * finished (rankStepThenCommit). A rank that fails or dies abandons the step: nothing is committed, the run stops,
   * and a restart resumes from the last committed step.
   */
  private async dataParallelStep(batch: IntakeBatch): Promise<void> {
    const ranks = this.ranks!;
    const rank = this.rank!;
    const { size } = rank.collective;
    const train = batch.samples.length > 0;
    const shares: TrainSample[][] = Array.from({ length: size }, () => []);
    if (train) {
      const { shards } = shardStep(groupsOf(batch.samples.map((s) => ({ groupId: s.groupId, sample: s })), (s) => s.tokens.length), size, this.deps.options.dataParallel.fewerGroups);
      shards.forEach((groups, r) => (shares[r] = groups.flatMap((g) => g.samples)));
    }
    const dir = await this.committer.prepareCheckpoint(this.step + 1);
    const others = ranks.dispatch(this.step, train, shares, dir);
    // awaited below, after rank 0's own part: a failure of the group rejects both, this one first
    others.catch(() => {});
    let committed = false;
    try {
      await rankStepThenCommit(
        rank.collective,
        async () => {
          const metrics = train ? await rank.step(shares[0]!, this.step) : emptyStepMetrics();
          await saveOptimizerShard(this.model, dir, 0, size);
          return metrics;
        },
        async (metrics) => {
          await this.commitStep(batch, metrics);
          committed = true;
        },
      );
    } finally {
      // every rank's outcome is in before the next step (or the error) goes on
      await others.catch(() => {});
    }
    // a rank that failed after the commit (before it said it was done): the step stands, the group does not
    await others.catch((err: unknown) => {
      throw committed && err instanceof RankFailed ? err.afterCommit() : err;
    });
  }

  private async commitStep(batch: IntakeBatch, metrics: StepMetrics): Promise<void> {
    const { options } = this.deps;
    const step = this.step + 1;
    // A step that trained on nothing (only stale samples) still publishes on schedule, unchanged weights under
    // a new version: the rollouts' staleness gate counts versions as steps, and withholding one would hold
    // back the groups that could still train.
    const produced = step % options.publishEvery === 0 ? this.version + 1 : null;
    // 1. The checkpoint, with the consumed set as of this step, is durable before the log says the step happened.
    await this.committer.writeCheckpoint(step, this.model, this.consumed.exactAfter(batch.taken, produced ?? this.version, this.stalenessBound), { sharded: this.ranks !== null });
    const stepEvent = trainStepEvent({ runId: this.deps.runId, step, version: this.version, produced, batch, metrics, learningRate: learningRateAt(step - 1, options.lrSchedule), extra: this.deps.extraMetrics?.() ?? [] });
    let stored: StoredWeights | null = null;
    let pv: PolicyVersion | null = null;
    if (produced !== null) {
      stored = await this.committer.storeVersion(this.model, this.storedVersions.get(0));
      await this.deps.onWeights?.(produced, this.model);
      pv = this.committer.policyVersionEvent(produced, this.version, step, stored, [{ name: 'reward_mean', value: stepEvent.reward_mean }]);
    }
    // 2. One transaction: the step, the new version and the offsets of every sample it consumed.
    await this.committer.commit(stepEvent, pv, batch.offsets);
    this.step = step;
    if (produced !== null) this.version = produced;
    this.consumed.add(batch.taken, produced ?? this.version, this.stalenessBound);
    if (stored !== null && produced !== null) this.storedVersions.set(produced, stored.checksum);
    if (pv !== null) await this.deps.onVersion?.(pv);
    await pruneCheckpoints(this.ckptDir, options.keepCheckpoints);
    await retainWeights({
      weightsDir: this.weightsDir,
      stored: this.storedVersions,
      current: this.version,
      keepVersions: options.keepVersions,
      stalenessBound: this.stalenessBound,
      referenced: () => this.intake.carriedVersions(),
      logger: this.logger,
    });
    this.logger.debug('step', { step, version: this.version, loss: metrics.loss, reward: stepEvent.reward_mean });
    this.deps.onStep?.(stepEvent);
  }

  async close(): Promise<void> {
    this.stopped = true;
    // A step in flight finishes (its checkpoint and commit) before the model it trains is disposed; the loop
    // sees `stopped` within one poll.
    await this.running?.catch(() => {});
    await this.control?.close();
    await this.consumer?.close();
    await this.committer.close();
    await this.ranks?.close();
    this.model?.dispose();
    this.ref?.dispose();
  }

  /** For tests and the main job: the live model (do not train concurrently). */
  get liveModel(): Model {
    return this.model;
  }

  static checkpointExists(dataDir: string, step: number): Promise<boolean> {
    return checkpointExists(join(dataDir, 'trainer'), step);
  }
}
