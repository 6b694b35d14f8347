// The built-in policy on the native core ('builtin' with device: cuda): the model in native memory (the GPU),
// NativeEngine's continuous batching over its slot KV cache, and policy updates written into the same model in
// place: from the trainer's model by a device-to-device copy when the trainer runs in this process on the same
// device (stageWeights), else from the published safetensors (one upload). No export.
import { resolve } from 'node:path';
import { RlstreamError } from '../../core/errors.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { Model, parseModelConfig, type DeviceKind } from '../../native/model.ts';
import type { GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from '../backends/types.ts';
import type { RolloutInterrupt } from './native-engine.ts';
import { cudaMemory } from '../../native/addon.ts';
import { kvCacheSlots } from './kv-sizing.ts';
import { DEFAULT_PREFILL_TOKENS, NativeEngine, type NativeEngineStats } from './native-engine.ts';
import { PolicyUpdates } from './updates.ts';

export interface NativePolicyOptions {
  device: DeviceKind;
  /** device cpu: the native core's threads (default: the machine's available parallelism). */
  threads?: number;
  /** Sequences decoded together, and KV-cache slots (running turns plus sessions kept for their next turn). */
  maxBatch: number;
  /** Tokens a slot holds (prompt and everything generated in a trajectory); default min(4096, max_position_embeddings). */
  maxLen?: number;
  /**
   * device cuda: the share of the GPU's memory the policy may hold (weights, a step's activations, KV cache);
   * the KV cache gets what is left of it, at most maxBatch slots (./kv-sizing.ts). Unused on the CPU.
   */
  gpuMemoryUtilization: number;
  interrupt: RolloutInterrupt;
  /**
   * device cuda: a trainer in this process on the same device will offer its weights (stageWeights), so the
   * policy's share plans for their copy. Default false (a rollout worker of its own process).
   */
  stagesTrainerWeights?: boolean;
  server?: string;
  logger?: Logger;
}

/** The interrupt modes in-place weights can honour ('finish' would need two versions of the weights at once). */
/**
 * Adapter versions swapped on the device (the folded adapter taken out, the new one folded in) between reads of
 * their base file. Each swap rounds the fp32 weights once more (W + D − D is W to an ulp), so the base is read
 * afresh every this many swaps; reading it is what the swap saves (at 7B, 15 GB converted on the host: 19 s a
 * version, 77 s of a 173 s RL phase, test/gpu/RESULTS.md).
 */
export const ADAPTER_SWAPS_PER_BASE_READ = 16;

/** Where a version's weights came from, as the hot-swap log line says. */
type LoadedFrom = 'trainer' | 'broadcast' | 'adapter' | 'file';

/** An adapter folded into the weights: its version, and its file (read where it was not broadcast). */
interface FoldedAdapter {
  path: string;
  version: number;
}

/** A version's adapters as a trainer in another process broadcast them (receiveAdapters). */
export interface StagedAdapters {
  tensors: [string, Float32Array][];
  rank: number;
  alpha: number;
}

export const NATIVE_INTERRUPTS: readonly RolloutInterrupt[] = Object.freeze(['next_turn', 'next_token']);

export class NativePolicyBackend implements LlmBackend {
  readonly name = 'builtin';
  private readonly updates: PolicyUpdates;
  /** The newest version a trainer here offered (stageWeights), as a device copy, and its number. */
  private staging: Model | null = null;
  private stagedVersion = -1;
  /** Whether the staged copy came from another process (receiveWeights) rather than a trainer here. */
  private stagedRemote = false;
  /**
   * What the model's weights are, when known: a base file as read, plus the adapter folded into it (from its file
   * or a broadcast) and the device-side swaps since the base was read. null after a staged copy or a failed load (the next adapter version
   * then reads its base).
   */
  private folded: { base: string; adapter: FoldedAdapter | null; swaps: number } | null;
  /** Adapters a trainer in another process broadcast, by version (receiveAdapters), until folded in and out. */
  private readonly stagedAdapters = new Map<number, StagedAdapters>();

  private constructor(
    private readonly model: Model,
    private readonly engine: NativeEngine,
    private readonly interrupt: 'next_turn' | 'next_token',
    private readonly logger: Logger,
    initialWeights: string,
  ) {
    this.folded = { base: resolve(initialWeights), adapter: null, swaps: 0 };
    this.updates = new PolicyUpdates(() => engine.currentPolicyVersion(), logger);
  }

  static create(source: { configJson: string; weightsPath: string; version: number }, o: NativePolicyOptions): NativePolicyBackend {
    if (o.interrupt !== 'next_turn' && o.interrupt !== 'next_token')
      throw new RlstreamError('CONFIG_INVALID', `rollout.interrupt: the built-in policy on device ${o.device} updates its weights in place and supports ${NATIVE_INTERRUPTS.join(' and ')}, not ${o.interrupt}`);
    const config = parseModelConfig(JSON.parse(source.configJson));
    const maxLen = o.maxLen ?? Math.min(4096, config.max_position_embeddings);
    const logger = o.logger ?? silentLogger;
    const before = o.device === 'cuda' ? cudaMemory() : null;
    const model = Model.load(source.weightsPath, config, { device: o.device, trainable: false, ...(o.threads !== undefined && { threads: o.threads }) });
    try {
      let slots = o.maxBatch;
      let kvGiB: number | undefined;
      const after = before ? cudaMemory() : null;
      if (before && after) {
        const sizing = kvCacheSlots({
          totalBytes: after.total,
          freeBeforeBytes: before.free,
          freeAfterBytes: after.free,
          utilization: o.gpuMemoryUtilization,
          trainerCopy: o.stagesTrainerWeights === true,
          stepBytes: model.activationBytes(DEFAULT_PREFILL_TOKENS + o.maxBatch),
          slotBytes: model.kvBytes(1, maxLen),
          maxBatch: o.maxBatch,
          maxLen,
        });
        slots = sizing.slots;
        kvGiB = model.kvBytes(slots, maxLen) / 1024 ** 3;
        if (slots < o.maxBatch)
          logger.warn('the KV cache holds fewer sequences than backend.max_batch: fewer decode together', { slots, maxBatch: o.maxBatch, maxLen, budgetGiB: sizing.budgetBytes / 1024 ** 3, stagingGiB: sizing.stagingBytes / 1024 ** 3, fix: 'raise backend.gpu_memory_utilization or lower backend.max_len' });
      }
      const engine = new NativeEngine(model, { slots, maxLen, version: source.version, server: o.server ?? 'builtin' });
      logger.info('built-in policy loaded on the native core', { version: source.version, device: o.device, slots, maxLen, ...(kvGiB !== undefined && { kvCacheGiB: Number(kvGiB.toFixed(2)) }) });
      return new NativePolicyBackend(model, engine, o.interrupt, logger, source.weightsPath);
    } catch (err) {
      model.dispose();
      throw err;
    }
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.engine.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    this.engine.releaseSession(sessionId);
  }

  /** Writes the new version's weights into the model between decode steps (rollout.interrupt decides when). */
  updatePolicy(update: PolicyUpdate): Promise<void> {
    return this.updates.apply(update, async () => {
      const config = parseModelConfig(JSON.parse(update.configJson));
      PolicyUpdates.checkArchitecture(update, config, this.model.config);
      const t0 = performance.now();
      let from: LoadedFrom = 'file';
      await this.engine.swap(update.version, async () => void (from = await this.loadVersion(update)), this.interrupt);
      this.logger.info('policy hot-swapped in place', { version: update.version, from, ms: Math.round(performance.now() - t0) });
    });
  }

  /**
   * Keeps a device copy of a trainer's weights for `version` (the newest offered only), when the trainer's model
   * is on this model's device: the version's update then copies it into the generating model, with no file read.
   */
  stageWeights(version: number, source: Model): void {
    // (a trainer with adapters publishes them as a small file, folded in from there: nothing to stage)
    if (source.device !== this.model.device || source.lora) return;
    // Called from the trainer's step: a model that cannot be staged (other shapes, no memory) must not fail the
    // step; its versions are then read from their files.
    try {
      this.staging ??= this.stagingModel();
      this.staging.copyParamsFrom(source);
      this.stagedVersion = version;
      this.stagedRemote = false;
    } catch (err) {
      this.stagedVersion = -1;
      this.logger.warn('the trainer\'s weights cannot be staged on the device; versions are read from their files', { version, error: (err as Error).message });
    }
  }

  /**
   * The staging copy (allocated once; every version overwrites it). Drawing its initial weights costs (10 s at 1.5B
   * on an H200): an engine that receives broadcasts makes it at start (prepareStaging), not at its first version.
   */
  private stagingModel(): Model {
    return Model.init(this.model.config, { seed: 0, device: this.model.device, trainable: false });
  }

  /** Makes the staging copy now (an engine in a weights group, before its first broadcast). */
  prepareStaging(): void {
    this.staging ??= this.stagingModel();
  }

  /**
   * Version `version`'s weights arriving from a trainer in another process (engine-process-main.ts: rank 0's
   * broadcast): `receive` writes them into the staging copy, as stageWeights copies a trainer's here. The staging
   * copy is made at the first call; a failed receive leaves no version staged (its update reads the file).
   */
  async receiveWeights(version: number, receive: (staging: Model) => Promise<void>): Promise<void> {
    this.staging ??= this.stagingModel();
    this.stagedVersion = -1;
    await receive(this.staging);
    this.stagedVersion = version;
    this.stagedRemote = true;
  }

  /**
   * Version `version`'s LoRA adapters arriving from a trainer in another process, as tensors named as in an adapter
   * file: the version's update folds them in from memory (taking the folded ones out the same way) instead of
   * reading its adapter file.
   */
  receiveAdapters(version: number, adapters: StagedAdapters): void {
    this.stagedAdapters.set(version, adapters);
    // the newest two are all an update can need: the one folded in now, and the next
    for (const v of [...this.stagedAdapters.keys()].sort((a, b) => a - b).slice(0, -2)) if (v !== this.folded?.adapter?.version) this.stagedAdapters.delete(v);
  }

  /**
   * The version's weights into the model: from the staged copy when it holds that version; an adapter version by
   * swapping adapters on the device when the weights are its base with another adapter folded in; else from files.
   */
  private async loadVersion(update: PolicyUpdate): Promise<LoadedFrom> {
    if (this.staging && this.stagedVersion === update.version) {
      this.folded = null;
      this.model.copyParamsFrom(this.staging);
      return this.stagedRemote ? 'broadcast' : 'trainer';
    }
    const f = this.folded;
    this.folded = null; // unknown until this load has finished
    if (update.adapter) {
      const base = resolve(update.adapter.baseWeightsPath);
      const next: FoldedAdapter = { path: update.adapter.path, version: update.version };
      if (f && f.base === base && f.swaps < ADAPTER_SWAPS_PER_BASE_READ && (await this.unfold(f.adapter))) {
        const from = await this.fold(next);
        this.folded = { base, adapter: next, swaps: f.swaps + 1 };
        return from === 'memory' ? 'broadcast' : 'adapter';
      }
      await this.model.loadWeights(base);
      this.folded = { base, adapter: null, swaps: 0 };
      await this.fold(next);
      this.folded = { base, adapter: next, swaps: 0 };
      return 'file';
    }
    await this.model.loadWeights(update.weightsPath);
    this.folded = { base: resolve(update.weightsPath), adapter: null, swaps: 0 };
    return 'file';
  }

  /**
   * Takes the folded adapter out of the weights (none: nothing to do). false when its file cannot be read back
   * (retention deleted it, say): mergeAdapter reads the whole file before it changes a weight, so the weights are
   * then untouched and the caller reads the base instead.
   */
  private async unfold(adapter: FoldedAdapter | null): Promise<boolean> {
    if (adapter === null) return true;
    try {
      await this.fold(adapter, -1);
      this.stagedAdapters.delete(adapter.version);
      return true;
    } catch (err) {
      this.logger.warn('the folded adapter cannot be taken out; the base weights are read again', { adapter: adapter.path, error: (err as Error).message });
      return false;
    }
  }

  /** Folds a version's adapters in (scale 1) or out (-1): from memory where they were broadcast, else their file. */
  private async fold(adapter: FoldedAdapter, scale = 1): Promise<'memory' | 'file'> {
    const staged = this.stagedAdapters.get(adapter.version);
    if (staged) {
      this.model.mergeAdapterTensors(staged.tensors, staged, scale, `policy v${adapter.version}'s broadcast adapters`);
      return 'memory';
    }
    await this.model.mergeAdapter(adapter.path, scale);
    return 'file';
  }

  currentPolicyVersion(): number {
    return this.engine.currentPolicyVersion();
  }

  stats(): NativeEngineStats {
    return this.engine.stats();
  }

  deviceSeconds(): { generate: number; loadWeights: number } {
    const s = this.engine.stats();
    return { generate: s.computeMs / 1000, loadWeights: s.loadMs / 1000 };
  }

  async close(): Promise<void> {
    await this.updates.settled();
    this.engine.close();
    this.model.dispose();
    this.staging?.dispose();
    this.staging = null;
  }
}
