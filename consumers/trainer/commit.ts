// The trainer's durability: each step is durable before it is acknowledged — its checkpoint (weights, AdamW moments
// and the consumed set) on disk first, then one log transaction holding the TrainStep, the PolicyVersion (every
// publish_every steps) and the consumed offsets. A restart reads the run's committed steps and versions back from
// the log (restore) and resumes from the checkpoint of the last committed TrainStep with the committed offsets.
import { mkdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { deriveId } from '../../core/ids.ts';
import { readToEnd } from '../../core/log/read-to-end.ts';
import type { EventLog, Producer, TopicPartitionOffset } from '../../core/log/types.ts';
import type { EventSerde } from '../../core/serde/events.ts';
import type { Logger } from '../../core/telemetry.ts';
import { TOPICS } from '../../core/topics.ts';
import type { PolicyVersion, TrainStep, NamedValue } from '../../schemas/generated/types.ts';
import { LORA_FILE_FORMAT, type Model } from '../../native/index.ts';
import type { ConsumedTrajectories } from './consumed.ts';
import type { IntakeBatch } from './intake.ts';
import type { StepMetrics } from './step.ts';
import { storeWeights } from './weights-store.ts';

/** How long a restart may take to read the run's steps and versions back before it gives up (retriable). */
export const RESTORE_TIMEOUT_MS = 120_000;

/** What the log says the run's committed steps did. */
export interface Restored {
  /** The last committed step (0: none). */
  step: number;
  /** The newest published policy version. */
  version: number;
  /** How many PolicyVersions the run published (0: version 0 is still to publish). */
  versions: number;
  /**
   * Every trajectory a committed step took, with the step's policy version: the version the sample was generated
   * at is at most that, so pruning by it (ConsumedTrajectories.add) keeps every id still needed.
   */
  taken: [string, number][];
  /** The published versions' weights (version → checksum), for retention. */
  stored: Map<number, string>;
}

export interface StoredWeights {
  path: string;
  checksum: string;
  format: string;
}

export interface CommitDeps {
  log: EventLog;
  serde: EventSerde;
  runId: string;
  /** The trainer's consumer group, whose offsets each step's transaction commits. */
  groupId: string;
  /** Checkpoints: `<dir>/step-<n>`. */
  checkpointDir: string;
  /** The content-addressed weights store. */
  weightsDir: string;
  /** The model's config.json as published with every version. */
  modelConfigJson: string;
  logger: Logger;
  /** The restore's deadline (default RESTORE_TIMEOUT_MS); tests of a stalled restore shorten it. */
  restoreTimeoutMs?: number;
}

export function checkpointPath(checkpointDir: string, step: number): string {
  return join(checkpointDir, `step-${step}`);
}

export class StepCommitter {
  private producer!: Producer;

  constructor(private readonly deps: CommitDeps) {}

  /** The trainer's transactional producer; opening it fences an older instance of the same run's trainer. */
  async open(): Promise<void> {
    this.producer = await this.deps.log.producer({ transactionalId: `${this.deps.runId}.trainer` });
  }

  async close(): Promise<void> {
    await this.producer?.close();
  }

  /** The last committed TrainStep and PolicyVersion of this run, read back from the log. */
  async restore(): Promise<Restored> {
    const { log, serde, runId, logger } = this.deps;
    let step = 0;
    let version = 0;
    let versions = 0;
    const taken: [string, number][] = [];
    const stored = new Map<number, string>();
    const took = (e: TrainStep) => {
      for (const id of e.trajectory_ids) taken.push([id, e.policy_version]);
      for (const id of e.dropped_trajectory_ids) taken.push([id, e.policy_version]);
    };
    for (const [topic, onEvent] of [
      [TOPICS.trainSteps, (e: TrainStep) => ((step = Math.max(step, e.step)), took(e))],
      [TOPICS.policyVersions, (e: PolicyVersion) => ((version = Math.max(version, e.policy_version)), versions++, stored.set(e.policy_version, e.checksum))],
    ] as const) {
      const c = await log.consumer({ groupId: `${runId}.trainer-restore.${deriveId(Date.now(), Math.random())}`, topics: [topic], readCommitted: true });
      const ends = await log.offsets(topic);
      const target = new Map(ends.filter((p) => p.high > p.low).map((p) => [p.partition, p.high]));
      // To the end listed before the read, by position, and never short of it (see readToEnd): a restore that
      // stopped early, at the first empty polls or after a stall, resumed from an older step and trained on the
      // same samples twice. A read that cannot finish fails the start retriably; the restarted role reads again.
      await readToEnd(c, topic, target, async (records) => {
        for (const r of records) {
          const d = await serde.decode(r.value);
          if (d.name === 'TrainStep' && d.value.run_id === runId) (onEvent as (e: TrainStep) => void)(d.value);
          if (d.name === 'PolicyVersion' && d.value.run_id === runId) (onEvent as (e: PolicyVersion) => void)(d.value);
        }
      }, { what: 'trainer restore', timeoutMs: this.deps.restoreTimeoutMs ?? RESTORE_TIMEOUT_MS }).finally(() => c.close());
      logger.info('restored from the log', { topic, end: [...target], step, version });
    }
    return { step, version, versions, taken, stored };
  }

  /**
   * Step `step`'s checkpoint: the model (weights and AdamW moments) and the consumed set as of the step, durable
   * before the log says the step happened.
   */
  async writeCheckpoint(step: number, model: Model, consumedAfter: ConsumedTrajectories, options: { sharded?: boolean } = {}): Promise<void> {
    const dir = checkpointPath(this.deps.checkpointDir, step);
    // A data-parallel step's directory was made empty before the step (prepareCheckpoint), and every rank wrote its
    // optimizer shard into it; rank 0 adds the weights and the consumed set.
    if (!options.sharded) await this.prepareCheckpoint(step);
    await model.saveCheckpoint(dir, { optimizer: !options.sharded });
    await consumedAfter.save(dir);
  }

  /** Step `step`'s checkpoint directory, empty (what an abandoned attempt at the step left there is removed). */
  async prepareCheckpoint(step: number): Promise<string> {
    const dir = checkpointPath(this.deps.checkpointDir, step);
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    return dir;
  }

  /**
   * The model's weights into the store, or with adapters the adapters alone (small), their file naming the
   * version-0 weights they sit on (metadata base_uri, base_checksum): a reader folds them into those. `base` is
   * version 0's checksum.
   */
  storeVersion(model: Model, base: string | undefined): Promise<StoredWeights> {
    const { weightsDir } = this.deps;
    if (!model.lora) return storeWeights(weightsDir, (p) => model.save(p)).then((s) => ({ ...s, format: 'safetensors' }));
    if (base === undefined) throw new RlstreamError('CONFIG_INVALID', 'trainer.lora: version 0 (the frozen weights) is not in the store; adapters cannot name their base');
    const baseUri = join(weightsDir, `${base}.safetensors`);
    return storeWeights(weightsDir, (p) => model.saveAdapter(p, { base_uri: baseUri, base_checksum: base })).then((s) => ({ ...s, format: LORA_FILE_FORMAT }));
  }

  /** Version 0 is the weights themselves (adapters start at B = 0, so with LoRA too): the base later versions name. */
  async publishVersion0(model: Model): Promise<StoredWeights> {
    const stored = { ...(await storeWeights(this.deps.weightsDir, (p) => model.saveBase(p))), format: 'safetensors' };
    const tx = await this.producer.transaction();
    await tx.send(TOPICS.policyVersions, [{ key: this.deps.runId, value: this.deps.serde.encode('PolicyVersion', this.policyVersionEvent(0, null, 0, stored, [])) }]);
    await tx.commit();
    return stored;
  }

  policyVersionEvent(version: number, parent: number | null, step: number, stored: StoredWeights, metrics: NamedValue[]): PolicyVersion {
    const { runId } = this.deps;
    return {
      event_id: deriveId(runId, 'policy-version', version),
      time_ms: Date.now(),
      run_id: runId,
      policy_version: version,
      parent,
      step,
      weights_uri: stored.path,
      checksum: stored.checksum,
      format: stored.format,
      config_json: this.deps.modelConfigJson,
      metrics,
    };
  }

  /** One transaction: the step, the new version (if any) and the offsets of every sample it consumed. */
  async commit(stepEvent: TrainStep, pv: PolicyVersion | null, offsets: TopicPartitionOffset[]): Promise<void> {
    const { serde, runId } = this.deps;
    this.deps.logger.debug('committing step', { step: stepEvent.step, offsets: offsets.map((o) => `${o.partition}@${o.offset}`).join(',') });
    const tx = await this.producer.transaction();
    try {
      await tx.send(TOPICS.trainSteps, [{ key: runId, value: serde.encode('TrainStep', stepEvent) }]);
      if (pv !== null) await tx.send(TOPICS.policyVersions, [{ key: runId, value: serde.encode('PolicyVersion', pv) }]);
      // An empty step (see TrainerIntake.collect) consumed nothing: no offsets to commit.
      if (offsets.length > 0) await tx.sendOffsets(this.deps.groupId, offsets);
      await tx.commit();
    } catch (err) {
      await tx.abort().catch(() => {});
      throw err;
    }
  }
}

export function checkpointExists(checkpointDir: string, step: number): Promise<boolean> {
  return stat(checkpointPath(checkpointDir, step)).then(() => true, () => false);
}

export interface StepRecord {
  runId: string;
  /** The step being committed (the last committed + 1). */
  step: number;
  /** The policy version it trained (the trainer's before the step). */
  version: number;
  /** The version it publishes, or null when this step publishes none. */
  produced: number | null;
  batch: IntakeBatch;
  metrics: StepMetrics;
  learningRate: number;
  /** Metrics measured elsewhere (trainer deps extraMetrics). */
  extra: NamedValue[];
}

/** The TrainStep a step's transaction carries: what it trained on and what it measured. */
export function trainStepEvent(r: StepRecord): TrainStep {
  const { samples } = r.batch;
  const m = r.metrics;
  const staleness = samples.map((s) => s.staleness);
  const toolCalls = samples.reduce((n, s) => n + s.toolCalls, 0);
  const toolErrors = samples.reduce((n, s) => n + s.toolErrors, 0);
  return {
    event_id: deriveId(r.runId, 'train-step', r.step),
    time_ms: Date.now(),
    run_id: r.runId,
    step: r.step,
    policy_version: r.version,
    produced_version: r.produced,
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
    learning_rate: r.learningRate,
    reward_mean: samples.reduce((a, s) => a + s.reward, 0) / Math.max(1, samples.length),
    staleness_mean: staleness.reduce((a, b) => a + b, 0) / Math.max(1, staleness.length),
    staleness_max: Math.max(0, ...staleness),
    iw_mean: m.iwMean,
    iw_max: m.iwMax,
    iw_truncated_fraction: m.iwTrunc,
    dropped_stale: r.batch.droppedIds.length,
    dropped_trajectory_ids: [...r.batch.droppedIds],
    wait_ms: r.batch.waitMs,
    compute_ms: m.computeMs,
    metrics: [
      { name: 'masked_tokens', value: m.maskedTokens },
      { name: 'skipped_already_consumed', value: r.batch.alreadyConsumed },
      ...m.lossMetrics,
      { name: 'loss/correction/truncated_frac', value: m.iwTrunc },
      { name: 'loss/correction/masked_frac', value: m.iwMasked },
      { name: 'logprob_mismatch_mean', value: m.mismatch.mean },
      { name: 'logprob_mismatch_max', value: m.mismatch.max },
      { name: 'tool_calls', value: toolCalls },
      { name: 'tool_success_rate', value: toolCalls + toolErrors > 0 ? Math.max(0, 1 - toolErrors / Math.max(toolCalls, toolErrors)) : 0 },
      ...r.extra,
    ],
  };
}
