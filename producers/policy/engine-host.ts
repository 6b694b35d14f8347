// What the built-in backend needs from the thing that serves generations: one engine in this thread
// (InProcessEngine) or several in worker threads (engine-workers.ts). Both load versions from weights, so
// the backend does not care where the onnxruntime sessions live. An engine is the one continuous-batching
// scheduler (native-engine.ts) over the ONNX runner (onnx-slot-runner.ts).
import type { Logger } from '../../core/telemetry.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult } from '../backends/types.ts';
import { cpuKvSlots } from './kv-sizing.ts';
import { NativeEngine, type NativeEngineStats, type RolloutInterrupt } from './native-engine.ts';
import { OnnxSlotRunner } from './onnx-slot-runner.ts';

/** The engine's options that cross into a worker thread. */
export interface EngineSetup {
  /** Most sequences decoded together. */
  maxBatch: number;
  /** Bytes of KV cache for idle sessions kept between turns (whole slots of maxLen tokens: cpuKvSlots). */
  kvCacheBytes: number;
  /** Tokens a slot holds (a trajectory's whole context). */
  maxLen: number;
  interrupt: RolloutInterrupt;
  /** onnxruntime intra-op threads per engine. */
  threads: number;
  server: string;
}

export interface LoadTimes {
  exportMs: number;
  loadMs: number;
}

export interface PolicyEngine {
  /** Export and load times of the first version. */
  readonly first: LoadTimes;
  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult>;
  releaseSession(sessionId: string): void;
  /** Export and load `version` and make it the one new requests use (see RolloutInterrupt for those under way). */
  load(config: ParsedModelConfig, weights: TensorMap, version: number): Promise<LoadTimes>;
  currentPolicyVersion(): number;
  stats(): NativeEngineStats;
  close(): Promise<void>;
}

/** One scheduler over the ONNX runner in this thread. */
export class InProcessEngine implements PolicyEngine {
  private constructor(
    private readonly engine: NativeEngine,
    private readonly runner: OnnxSlotRunner,
    private readonly interrupt: RolloutInterrupt,
    private readonly logger: Logger,
    readonly first: LoadTimes,
  ) {}

  static async create(config: ParsedModelConfig, weights: TensorMap, version: number, setup: EngineSetup, logger: Logger): Promise<InProcessEngine> {
    const runner = await OnnxSlotRunner.create(config, weights, { threads: setup.threads, version });
    try {
      const { slots, keptSessions } = cpuKvSlots({ kvCacheBytes: setup.kvCacheBytes, slotBytes: runner.kvBytes(1, setup.maxLen), maxBatch: setup.maxBatch });
      const engine = new NativeEngine(runner, { slots, maxBatch: setup.maxBatch, maxLen: setup.maxLen, version, server: setup.server });
      logger.debug('policy engine ready', { version, slots, keptSessions, maxLen: setup.maxLen });
      return new InProcessEngine(engine, runner, setup.interrupt, logger, runner.loadTimes(version));
    } catch (err) {
      await runner.release();
      throw err;
    }
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.engine.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    this.engine.releaseSession(sessionId);
  }

  async load(_config: ParsedModelConfig, weights: TensorMap, version: number): Promise<LoadTimes> {
    let times: LoadTimes | null = null;
    const previous = this.engine.currentPolicyVersion();
    await this.engine.swap(
      version,
      async () => {
        await this.runner.addWeights(weights, version);
        times = this.runner.loadTimes(version);
      },
      this.interrupt,
    );
    this.logger.info('policy installed', { version, previous, interrupt: this.interrupt });
    return times!;
  }

  currentPolicyVersion(): number {
    return this.engine.currentPolicyVersion();
  }

  stats(): NativeEngineStats {
    return this.engine.stats();
  }

  async close(): Promise<void> {
    this.engine.close();
    await this.runner.release();
  }
}
