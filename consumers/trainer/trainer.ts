// The trainer role: consumes AdvantagedTrajectory, keeps only train-split samples within the staleness
// bound, and runs asynchronous, off-policy-corrected PPO steps on the native core. Each step is made
// durable before it is acknowledged: checkpoint on disk first, then one log transaction holding the
// TrainStep, the PolicyVersion (every k steps) and the consumed offsets. After a crash the trainer resumes
// from the checkpoint of the last committed TrainStep with the committed offsets: no sample used twice.
import { mkdir, readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { describeError, RlstreamError } from '../../core/errors.ts';
import { deriveId } from '../../core/ids.ts';
import { follow, type Follower } from '../../core/log/follow.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import type { EventLog, Consumer, LogRecord, Producer, TopicPartitionOffset } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { silentLogger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { AdvantagedTrajectory, Control, NamedValue, PolicyVersion, TrainStep } from '../../schemas/generated/types.ts';
import { LORA_FILE_FORMAT, Model, withLossScale, type DeviceKind, type ModelConfig, type PolicyLossMetrics } from '../../native/index.ts';
import { packMicroBatches, sampleFromEvent, type TrainSample } from './batch.ts';
import { ConsumedTrajectories } from './consumed.ts';
import { checkTrainerDevice } from './device.ts';
import { checkTrainerDevices } from './parallel/devices.ts';
import type { TrainerOptions } from './options.ts';
import { learningRateAt } from './lr-schedule.ts';
import { policyLosses } from './policy-losses.ts';
import { mustKeepVersion, pruneWeights, storeWeights } from './weights-store.ts';

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
   * copies them device to device instead of reading the stored file.
   */
  onWeights?: (version: number, model: Model) => void;
  /**
   * Called with each new version's PolicyVersion once its step is committed, before the weights retention runs and
   * the next step starts, and awaited: export.every_versions writes the version's directory here.
   */
  onVersion?: (pv: PolicyVersion) => Promise<void> | void;
}

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

const GROUP_ID = 'trainer';
/**
 * How long the trainer waits, with nothing new arriving, before it records groups whose every sample was too
 * stale to train on as a step of their own. Normally the next group's step carries them; at the end of a finite
 * run there is no next group, and they would stay unconsumed forever.
 */
const STALE_TAIL_FLUSH_MS = 3000;
/** How long a restart may take to read the run's steps and versions back before it gives up (retriable). */
const RESTORE_TIMEOUT_MS = 120_000;

export class Trainer {
  private model!: Model;
  private ref: Model | null = null;
  private consumer!: Consumer;
  private producer!: Producer;
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
  private readonly carry: LogRecord[] = [];
  private droppedSinceStep = 0;
  /** Ids of the samples dropped as stale since the last step: recorded in the next TrainStep. */
  private droppedIds: string[] = [];
  /**
   * Per partition of the advantaged topic, the offset after the last record this trainer took (into a step, or
   * dropped or skipped). The trainer is the group's only member, so a rebalance (Kafka's session expiring during
   * a broker outage) gives the partitions straight back, from the committed offsets: the records between those
   * and this point are already in a committed step, the step being collected, or the carry.
   */
  private readonly readThrough = new Map<number, number>();
  readonly counters: TrainerCounters = { consumed: 0, droppedStale: 0, skippedNonTrain: 0, skippedOtherRun: 0, redelivered: 0, alreadyConsumed: 0 };
  /** The trajectories of the committed steps, by id (durable in each step's checkpoint; consumed.ts). */
  private consumed = ConsumedTrajectories.empty();
  /** What the step being collected took (trained or dropped), id → generating version; cleared when it commits. */
  private taking = new Map<string, number>();
  /** Records skipped since the last step because their trajectory was consumed already. */
  private alreadyConsumedSinceStep = 0;
  private readonly logger: Logger;
  /** This run's versions whose weights may still be in the store (version → checksum), for retention. */
  private readonly storedVersions = new Map<number, string>();

  constructor(private readonly deps: TrainerDeps) {
    this.logger = (deps.logger ?? silentLogger).child({ role: 'trainer' });
    this.stalenessBound = deps.options.stalenessBound;
  }

  /** The staleness bound in force (changed by set_staleness). */
  get currentStalenessBound(): number {
    return this.stalenessBound;
  }

  get currentVersion(): number {
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
    checkTrainerDevice(options.device);
    const on = { threads: options.threads, device: options.device, recompute: options.recompute };
    // With trainer.lora the model's weights stay frozen and adapters train over them; a checkpoint then holds the
    // adapters alone, resumed over the same initial weights.
    const lora = options.lora ? { ...options.lora, seed: 0 } : undefined;
    this.producer = await log.producer({ transactionalId: `${this.deps.runId}.trainer` });
    const last = await this.lastCommitted();
    this.step = last.step;
    this.version = last.version;
    if (this.step > 0) {
      const dir = join(this.ckptDir, `step-${this.step}`);
      this.model = await Model.loadCheckpoint(dir, { ...on, lora, base: this.deps.initialWeightsPath });
      // What the committed steps took: the checkpoint's set and the log's TrainSteps, merged, so that either one
      // surviving damage is enough to skip a trajectory that comes again.
      const saved = await ConsumedTrajectories.load(dir);
      if (saved.problem !== null) this.logger.warn('the checkpoint\'s consumed set cannot be used; rebuilding it from the log\'s TrainSteps alone', { problem: saved.problem });
      this.consumed = saved.set ?? ConsumedTrajectories.empty();
      this.consumed.add(last.taken, this.version, this.stalenessBound);
      const { exact, older } = this.consumed.size;
      this.logger.info('resumed from checkpoint', { step: this.step, version: this.version, consumed_exact: exact, consumed_older: older, consumed_horizon: this.consumed.horizon, from_checkpoint: saved.set !== null });
    } else {
      if (lora && this.deps.initialCheckpoint)
        this.logger.info('trainer.lora: adapters start fresh over the warm start\'s weights (its AdamW moments are for all weights)', { checkpoint: this.deps.initialCheckpoint });
      this.model = this.deps.initialCheckpoint && !lora
        ? await Model.loadCheckpoint(this.deps.initialCheckpoint, on)
        : Model.load(this.deps.initialWeightsPath, this.deps.modelConfig, { ...on, lora });
    }
    if (options.klCoef > 0) this.ref = Model.load(this.deps.initialWeightsPath, this.deps.modelConfig, on);
    if (last.versions === 0) await this.publishVersion0();
    this.consumer = await log.consumer({ groupId: `${this.deps.runId}.${GROUP_ID}`, topics: [TOPICS.advantaged], readCommitted: true });
    if (this.deps.followControl ?? true) this.control = this.followControl(log);
  }

  /**
   * The trainer follows the control topic as the rollout workers do: set_staleness changes the bound its
   * intake enforces, stop ends run() after the step under way. Commands from before this process started
   * belong to earlier sessions of the run and are skipped (replaying a past stop would end this one).
   */
  private followControl(log: EventLog): Follower {
    return follow(
      log,
      async (records) => {
        for (const r of records) {
          const d = await this.deps.serde.decode(r.value);
          if (d.name === 'Control') this.onControl(d.value);
        }
      },
      {
        consumer: () => ({ groupId: `${this.deps.runId}.trainer-control.${deriveId(Date.now(), Math.random())}`, topics: [TOPICS.control], fromBeginning: true }),
        poll: { maxRecords: 100, timeoutMs: 200 },
        onError: (err) => this.logger.warn('following control failed; retrying', { error: describeError(err) }),
      },
    );
  }

  onControl(c: Control): void {
    if (c.run_id !== this.deps.runId || c.time_ms < this.startedMs - 1000) return;
    if (c.command === 'set_staleness' && c.staleness_bound !== null && c.staleness_bound >= 0) {
      if (c.staleness_bound < this.stalenessBound) this.catchUpToVersion = Math.max(this.catchUpToVersion, this.version + this.stalenessBound - c.staleness_bound + 1);
      this.stalenessBound = c.staleness_bound;
      this.logger.info('control: staleness bound set', { staleness_bound: c.staleness_bound });
    } else if (c.command === 'stop') {
      this.logger.info('control: stop', { reason: c.reason });
      this.stop();
    }
  }

  /** The last committed TrainStep and PolicyVersion of this run, read back from the log. */
  private async lastCommitted(): Promise<{ step: number; version: number; versions: number; taken: [string, number][] }> {
    let step = 0;
    let version = 0;
    let versions = 0;
    // Every trajectory a committed step took, with the step's policy version: the version the sample was
    // generated at is at most that, so pruning by it (ConsumedTrajectories.add) keeps every id still needed.
    const taken: [string, number][] = [];
    const took = (e: TrainStep) => {
      for (const id of e.trajectory_ids) taken.push([id, e.policy_version]);
      for (const id of e.dropped_trajectory_ids) taken.push([id, e.policy_version]);
    };
    for (const [topic, onEvent] of [
      [TOPICS.trainSteps, (e: TrainStep) => ((step = Math.max(step, e.step)), took(e))],
      [TOPICS.policyVersions, (e: PolicyVersion) => ((version = Math.max(version, e.version)), versions++, this.storedVersions.set(e.version, e.checksum))],
    ] as const) {
      const c = await this.deps.log.consumer({ groupId: `${this.deps.runId}.trainer-restore.${deriveId(Date.now(), Math.random())}`, topics: [topic], readCommitted: true });
      const ends = await this.deps.log.offsets(topic);
      const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
      // To the end listed before the read, by position, and never short of it (see readToEnd): a restore that
      // stopped early, at the first empty polls or after a stall, resumed from an older step and trained on the
      // same samples twice. A read that cannot finish fails the start retriably; the restarted role reads again.
      await readToEnd(c, topic, target, async (records) => {
        for (const r of records) {
          const d = await this.deps.serde.decode(r.value);
          if (d.name === 'TrainStep' && d.value.run_id === this.deps.runId) (onEvent as (e: TrainStep) => void)(d.value);
          if (d.name === 'PolicyVersion' && d.value.run_id === this.deps.runId) (onEvent as (e: PolicyVersion) => void)(d.value);
        }
      }, { what: 'trainer restore', timeoutMs: RESTORE_TIMEOUT_MS }).finally(() => c.close());
      this.logger.info('restored from the log', { topic, end: [...target], step, version });
    }
    return { step, version, versions, taken };
  }

  /**
   * The model's weights into the store, or with adapters the adapters alone (small), their file naming the
   * version-0 weights they sit on (metadata base_uri, base_checksum): a reader folds them into those.
   */
  private storeVersion(): Promise<{ path: string; checksum: string; format: string }> {
    if (!this.model.lora) return storeWeights(this.weightsDir, (p) => this.model.save(p)).then((s) => ({ ...s, format: 'safetensors' }));
    const base = this.storedVersions.get(0);
    if (base === undefined) throw new RlstreamError('CONFIG_INVALID', 'trainer.lora: version 0 (the frozen weights) is not in the store; adapters cannot name their base');
    const baseUri = join(this.weightsDir, `${base}.safetensors`);
    return storeWeights(this.weightsDir, (p) => this.model.saveAdapter(p, { base_uri: baseUri, base_checksum: base })).then((s) => ({ ...s, format: LORA_FILE_FORMAT }));
  }

  private async publishVersion0(): Promise<void> {
    // Version 0 is the weights themselves (adapters start at B = 0, so with LoRA too): the base later versions name.
    const stored = { ...(await storeWeights(this.weightsDir, (p) => this.model.saveBase(p))), format: 'safetensors' };
    const tx = await this.producer.transaction();
    await tx.send(TOPICS.policyVersions, [{ key: this.deps.runId, value: this.deps.serde.encode('PolicyVersion', this.policyVersionEvent(0, null, 0, stored, [])) }]);
    await tx.commit();
    this.storedVersions.set(0, stored.checksum);
    this.logger.info('published initial policy version', { version: 0, checksum: stored.checksum });
  }

  private policyVersionEvent(version: number, parent: number | null, step: number, stored: { path: string; checksum: string; format: string }, metrics: NamedValue[]): PolicyVersion {
    return {
      event_id: deriveId(this.deps.runId, 'policy-version', version),
      time_ms: Date.now(),
      run_id: this.deps.runId,
      version,
      parent,
      step,
      weights_uri: stored.path,
      checksum: stored.checksum,
      format: stored.format,
      config_json: this.deps.modelConfigJson ?? JSON.stringify(this.deps.modelConfig),
      metrics,
    };
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
      const batch = await this.collectBatch();
      if (!batch) break;
      await this.trainStep(batch.samples, batch.offsets, batch.waitMs);
    }
  }

  /**
   * Gather one step's samples: whole groups only (the advantage consumer emits a group's members together,
   * each carrying the emitted group size), stopping at `groupsPerStep` groups with at least one kept sample.
   * Returns null when stopped first.
   */
  private async collectBatch(): Promise<{ samples: TrainSample[]; offsets: TopicPartitionOffset[]; waitMs: number } | null> {
    const { options } = this.deps;
    const samples: TrainSample[] = [];
    const seen = new Map<string, { expected: number; got: number; kept: number; again: number }>();
    const next = new Map<number, number>();
    const t0 = performance.now();
    let lastArrival = t0;
    let lastNote = t0;
    const complete = () => {
      let kept = 0;
      for (const g of seen.values()) {
        if (g.got < g.expected) return false;
        if (g.kept > 0) kept++;
      }
      return kept >= options.groupsPerStep;
    };
    while (!this.stopped) {
      const records = this.carry.length > 0 ? this.carry.splice(0) : await this.consumer.poll({ maxRecords: 256, timeoutMs: 200 });
      if (records.length > 0) lastArrival = performance.now();
      else if (performance.now() - lastNote > 5000) {
        lastNote = performance.now();
        const groups = [...seen.values()];
        this.logger.debug('waiting for samples', { step: this.step + 1, samples: samples.length, groups: groups.length, complete: groups.filter((g) => g.got >= g.expected).length, assignment: this.consumer.assignment().map((a) => `${a.topic}/${a.partition}@${a.offset}`).join(',') });
      }
      for (let i = 0; i < records.length; i++) {
        if (complete()) {
          // The rest waits for the next step; it stays uncommitted until that step is durable.
          this.carry.push(...records.slice(i));
          break;
        }
        const r = records[i]!;
        if (r.offset < (this.readThrough.get(r.partition) ?? 0)) {
          if (this.counters.redelivered++ === 0) this.logger.warn('the log handed back records this trainer had already taken (a rebalance rewound a partition to its committed offset); skipping them', { partition: r.partition, offset: r.offset, takenThrough: this.readThrough.get(r.partition) });
          continue;
        }
        this.readThrough.set(r.partition, r.offset + 1);
        next.set(r.partition, r.offset + 1);
        this.counters.consumed++;
        const d = await this.deps.serde.decode(r.value);
        if (d.name !== 'AdvantagedTrajectory') continue;
        const e: AdvantagedTrajectory = d.value;
        if (e.trajectory.run_id !== this.deps.runId) {
          this.counters.skippedOtherRun++;
          continue;
        }
        if (e.trajectory.dataset.split !== 'train') {
          this.counters.skippedNonTrain++;
          continue;
        }
        const g = seen.get(e.trajectory.group_id) ?? { expected: Math.max(1, e.group.group_size), got: 0, kept: 0, again: 0 };
        seen.set(e.trajectory.group_id, g);
        g.got++;
        const id = e.trajectory.trajectory_id;
        if (this.consumed.has(id) || this.taking.has(id)) {
          // Counted towards its group's completeness (its group's other members may be new), never trained.
          g.again++;
          this.alreadyConsumedSinceStep++;
          if (this.counters.alreadyConsumed++ === 0) this.logger.warn('a trajectory already taken by a committed step (or by this one) came again; skipping it, and every other such record (TrainStep metric skipped_already_consumed counts them)', { trajectory_id: id, partition: r.partition, offset: r.offset });
          continue;
        }
        const version = e.trajectory.min_policy_version;
        this.taking.set(id, version);
        const s = sampleFromEvent(e, this.version);
        if (s.staleness > this.stalenessBound || this.consumed.belowHorizon(version)) {
          this.counters.droppedStale++;
          this.droppedSinceStep++;
          this.droppedIds.push(s.trajectoryId);
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
      const quiet = performance.now() - lastArrival > STALE_TAIL_FLUSH_MS && [...seen.values()].every((g) => g.got >= g.expected);
      const catchingUp = this.version < this.catchUpToVersion;
      // Groups that only came again (every member consumed before) make no step of their own: their offsets are
      // committed with the next one.
      const staleTail = quiet && (catchingUp || (samples.length === 0 && [...seen.values()].some((g) => g.got > g.again)));
      if (complete() || staleTail) return { samples, offsets: this.stepOffsets(next), waitMs: performance.now() - t0 };
    }
    return null;
  }

  /**
   * The offsets a step commits: after its last record per partition, or the consumer's position where that
   * is further and nothing of the partition is carried to the next step. On Kafka a partition may hold
   * transaction markers after its last record, which the consumer has already passed; committing past them
   * is what lets the trainer's lag reach 0.
   */
  private stepOffsets(next: Map<number, number>): TopicPartitionOffset[] {
    const carried = new Set(this.carry.map((r) => r.partition));
    const at = new Map(this.consumer.assignment().filter((a) => a.topic === TOPICS.advantaged).map((a) => [a.partition, a.offset]));
    return [...next].map(([partition, offset]) => {
      const position = at.get(partition);
      return { topic: TOPICS.advantaged, partition, offset: !carried.has(partition) && position !== undefined && position > offset ? position : offset };
    });
  }

  private async trainStep(samples: TrainSample[], offsets: TopicPartitionOffset[], waitMs: number): Promise<void> {
    const { options } = this.deps;
    const t0 = performance.now();
    if (samples.length === 0) {
      // Only stale samples: a step that records them as consumed (dropped_trajectory_ids) and changes no weight.
      const none = { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwMax: 0, iwTrunc: 0, iwMasked: 0, gradNorm: 0, lossMetrics: [] };
      await this.commitStep(samples, offsets, none, { mean: 0, max: 0 }, waitMs, 0, 0);
      return;
    }
    const micro = packMicroBatches(samples, options.maxTokensPerMicroBatch);
    // Proximal log-probs: the current weights before this step's updates (decoupled PPO, AReaL).
    const prox = await Promise.all(micro.map(async (mb) => (await this.model.forward(mb, mb.targets)).logprobs));
    const ref = this.ref ? await Promise.all(micro.map(async (mb) => (await this.ref!.forward(mb, mb.targets)).logprobs)) : null;
    const mismatch = logprobMismatch(micro, prox);
    const totalMasked = micro.reduce((n, mb) => n + mb.maskedTokens, 0);
    const sums = { loss: 0, pgLoss: 0, clip: 0, approxKl: 0, entropy: 0, kl: 0, iwMean: 0, iwMax: 0, iwTrunc: 0, iwMasked: 0, gradNorm: 0, updates: 0 };
    const loss = options.policyLoss;
    const lossMetricFns = Object.entries(policyLosses.get(loss.name).metrics);
    const lossMetricSums = lossMetricFns.map(() => 0);
    const perMini = Math.ceil(micro.length / options.miniBatches);
    for (let epoch = 0; epoch < options.ppoEpochs; epoch++) {
      for (let m = 0; m < micro.length; m += perMini) {
        const chunk = micro.slice(m, m + perMini).map((mb, j) => ({ mb, k: m + j }));
        const chunkMasked = chunk.reduce((n, { mb }) => n + mb.maskedTokens, 0) || 1;
        this.model.zeroGrad();
        for (const { mb, k } of chunk) {
          const metrics: PolicyLossMetrics = await this.model.backwardPolicyLoss(
            mb,
            { targets: mb.targets, responseMask: mb.responseMask, advantages: mb.advantages, behaviourLogprobs: mb.behaviourLogprobs, proximalLogprobs: prox[k]!, ...(ref ? { refLogprobs: ref[k]! } : {}) },
            // Compiled once with the options (compileTrainerOptions); a micro-batch only sets its share.
            withLossScale(options.lossOptions, mb.maskedTokens / chunkMasked),
          );
          const w = mb.maskedTokens / (totalMasked * options.ppoEpochs || 1);
          sums.loss += metrics.loss * w;
          sums.pgLoss += metrics.pgLoss * w;
          sums.clip += metrics.clipFraction * w;
          sums.approxKl += metrics.approxKl * w;
          sums.entropy += metrics.entropy * w;
          sums.kl += metrics.kl * w;
          sums.iwMean += metrics.iwMean * w;
          sums.iwTrunc += metrics.iwTruncatedFraction * w;
          sums.iwMasked += metrics.iwMaskedFraction * w;
          lossMetricFns.forEach(([, f], i) => (lossMetricSums[i]! += f(metrics) * w));
          sums.iwMax = Math.max(sums.iwMax, metrics.iwMax);
        }
        sums.gradNorm += this.model.clipGradNorm(options.gradClip);
        sums.updates++;
        await this.model.adamwStep({ lr: learningRateAt(this.step, options.lrSchedule), beta1: options.beta1, beta2: options.beta2, eps: options.adamEps, weightDecay: options.weightDecay });
      }
    }
    const computeMs = performance.now() - t0;
    const lossMetrics = lossMetricFns.map(([name], i) => ({ name: `loss/${loss.name}/${name}`, value: lossMetricSums[i]! }));
    await this.commitStep(samples, offsets, { ...sums, gradNorm: sums.gradNorm / Math.max(1, sums.updates), lossMetrics }, mismatch, waitMs, computeMs, totalMasked);
  }

  private async commitStep(
    samples: TrainSample[],
    offsets: TopicPartitionOffset[],
    m: { loss: number; pgLoss: number; clip: number; approxKl: number; entropy: number; kl: number; iwMean: number; iwMax: number; iwTrunc: number; iwMasked: number; gradNorm: number; lossMetrics: NamedValue[] },
    mismatch: { mean: number; max: number },
    waitMs: number,
    computeMs: number,
    maskedTokens: number,
  ): Promise<void> {
    const { options, serde, runId } = this.deps;
    const step = this.step + 1;
    // 1. The checkpoint is durable before the log says the step happened.
    const dir = join(this.ckptDir, `step-${step}`);
    await rm(dir, { recursive: true, force: true });
    await mkdir(this.ckptDir, { recursive: true });
    await this.model.saveCheckpoint(dir);
    // A step that trained on nothing (only stale samples) still publishes on schedule, unchanged weights under
    // a new version: the rollouts' staleness gate counts versions as steps, and withholding one would hold
    // back the groups that could still train.
    const publish = step % options.publishEvery === 0;
    const produced = publish ? this.version + 1 : null;
    // The consumed set as of this step, in its checkpoint before the log says the step happened.
    await this.consumed.exactAfter(this.taking, produced ?? this.version, this.stalenessBound).save(dir);
    const staleness = samples.map((s) => s.staleness);
    const toolCalls = samples.reduce((n, s) => n + s.toolCalls, 0);
    const toolErrors = samples.reduce((n, s) => n + s.toolErrors, 0);
    const stepEvent: TrainStep = {
      event_id: deriveId(runId, 'train-step', step),
      time_ms: Date.now(),
      run_id: runId,
      step,
      policy_version: this.version,
      produced_version: produced,
      trajectories: samples.length,
      tokens: samples.reduce((n, s) => n + s.tokens.length, 0),
      trajectory_ids: samples.map((s) => s.trajectoryId),
      loss: m.loss,
      pg_loss: m.pgLoss,
      kl: m.kl,
      entropy: m.entropy,
      clip_fraction: m.clip,
      approx_kl: m.approxKl,
      grad_norm: m.gradNorm,
      learning_rate: learningRateAt(step - 1, options.lrSchedule),
      reward_mean: samples.reduce((a, s) => a + s.reward, 0) / Math.max(1, samples.length),
      staleness_mean: staleness.reduce((a, b) => a + b, 0) / Math.max(1, staleness.length),
      staleness_max: Math.max(0, ...staleness),
      iw_mean: m.iwMean,
      iw_max: m.iwMax,
      iw_truncated_fraction: m.iwTrunc,
      dropped_stale: this.droppedSinceStep,
      dropped_trajectory_ids: [...this.droppedIds],
      wait_ms: waitMs,
      compute_ms: computeMs,
      metrics: [
        { name: 'masked_tokens', value: maskedTokens },
        { name: 'skipped_already_consumed', value: this.alreadyConsumedSinceStep },
        ...m.lossMetrics,
        { name: 'loss/correction/truncated_frac', value: m.iwTrunc },
        { name: 'loss/correction/masked_frac', value: m.iwMasked },
        { name: 'logprob_mismatch_mean', value: mismatch.mean },
        { name: 'logprob_mismatch_max', value: mismatch.max },
        { name: 'tool_calls', value: toolCalls },
        { name: 'tool_success_rate', value: toolCalls + toolErrors > 0 ? Math.max(0, 1 - toolErrors / Math.max(toolCalls, toolErrors)) : 0 },
        ...(this.deps.extraMetrics?.() ?? []),
      ],
    };
    let stored: { path: string; checksum: string; format: string } | null = null;
    if (publish) stored = await this.storeVersion();
    if (stored && produced !== null) this.deps.onWeights?.(produced, this.model);
    // 2. One transaction: the step, the new version and the offsets of every sample it consumed.
    this.logger.debug('committing step', { step, offsets: offsets.map((o) => `${o.partition}@${o.offset}`).join(',') });
    const tx = await this.producer.transaction();
    let pv: PolicyVersion | null = null;
    try {
      await tx.send(TOPICS.trainSteps, [{ key: runId, value: serde.encode('TrainStep', stepEvent) }]);
      if (stored && produced !== null) {
        pv = this.policyVersionEvent(produced, this.version, step, stored, [{ name: 'reward_mean', value: stepEvent.reward_mean }]);
        await tx.send(TOPICS.policyVersions, [{ key: runId, value: serde.encode('PolicyVersion', pv) }]);
      }
      // An empty step (see collectBatch) consumed nothing: no offsets to commit.
      if (offsets.length > 0) await tx.sendOffsets(`${runId}.${GROUP_ID}`, offsets);
      await tx.commit();
    } catch (err) {
      await tx.abort().catch(() => {});
      throw err;
    }
    this.step = step;
    if (produced !== null) this.version = produced;
    this.droppedSinceStep = 0;
    this.droppedIds = [];
    this.consumed.add(this.taking, produced ?? this.version, this.stalenessBound);
    this.taking = new Map();
    this.alreadyConsumedSinceStep = 0;
    if (stored && produced !== null) this.storedVersions.set(produced, stored.checksum);
    if (pv !== null) await this.deps.onVersion?.(pv);
    await this.pruneCheckpoints();
    await this.pruneWeights();
    this.logger.debug('step', { step, version: this.version, loss: m.loss, reward: stepEvent.reward_mean });
    this.deps.onStep?.(stepEvent);
  }

  private async pruneCheckpoints(): Promise<void> {
    const names = await readdir(this.ckptDir).catch(() => [] as string[]);
    const steps = names.map((n) => /^step-(\d+)$/.exec(n)).filter((m): m is RegExpExecArray => m !== null).map((m) => Number(m[1])).sort((a, b) => b - a);
    for (const s of steps.slice(this.deps.options.keepCheckpoints)) await rm(join(this.ckptDir, `step-${s}`), { recursive: true, force: true });
  }

  /**
   * Weights retention: keep the newest trainer.keep_versions versions, every version a sample could still be
   * trained at (within the staleness bound; the rollouts' gate keeps every rollout in flight within it too),
   * and every version named by a record read but not yet consumed. Nothing loads an older version's weights:
   * samples carry their behaviour log-probs, a restart resumes from its checkpoint, and rollouts load the newest.
   */
  private async pruneWeights(): Promise<void> {
    const { keepVersions } = this.deps.options;
    const keep0 = { current: this.version, keepVersions, stalenessBound: this.stalenessBound, referenced: [] };
    if ([...this.storedVersions.keys()].every((v) => mustKeepVersion(v, keep0))) return;
    const referenced: [number, number][] = [];
    for (const r of this.carry) {
      const d = await this.deps.serde.decode(r.value).catch(() => null);
      if (d?.name === 'AdvantagedTrajectory') referenced.push([d.value.trajectory.min_policy_version, d.value.trajectory.max_policy_version]);
    }
    const gone = await pruneWeights(this.weightsDir, this.storedVersions, (v) => mustKeepVersion(v, { ...keep0, referenced }));
    if (gone.length > 0) this.logger.debug('weights retention', { deleted_versions: gone, kept: [...this.storedVersions.keys()] });
  }

  async close(): Promise<void> {
    this.stopped = true;
    // A step in flight finishes (its checkpoint and commit) before the model it trains is disposed; the loop
    // sees `stopped` within one poll.
    await this.running?.catch(() => {});
    await this.control?.close();
    await this.consumer?.close();
    await this.producer?.close();
    this.model?.dispose();
    this.ref?.dispose();
  }

  /** For tests and the main job: the live model (do not train concurrently). */
  get liveModel(): Model {
    return this.model;
  }

  static async checkpointExists(dataDir: string, step: number): Promise<boolean> {
    return stat(join(dataDir, 'trainer', `step-${step}`)).then(() => true, () => false);
  }
}

/** Rollout–trainer log-prob mismatch: |behaviour − recomputed| over masked tokens, before any update. */
function logprobMismatch(micro: { responseMask: Float32Array; behaviourLogprobs: Float32Array }[], recomputed: Float32Array[]): { mean: number; max: number } {
  let sum = 0;
  let n = 0;
  let max = 0;
  micro.forEach((mb, k) => {
    const lp = recomputed[k]!;
    for (let i = 0; i < mb.responseMask.length; i++) {
      if (mb.responseMask[i] !== 1) continue;
      const d = Math.abs(lp[i]! - mb.behaviourLogprobs[i]!);
      sum += d;
      n++;
      if (d > max) max = d;
    }
  });
  return { mean: n ? sum / n : 0, max };
}
