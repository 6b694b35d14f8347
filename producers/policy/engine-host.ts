// What the built-in backend needs from the thing that serves generations: one engine in this thread
// (InProcessEngine) or several in worker threads (engine-workers.ts). Both load versions from weights, so
// the backend does not care where the onnxruntime sessions live.
import type { Logger } from '../../core/telemetry.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult } from '../backends/types.ts';
import type { PolicyModelConfig } from './config.ts';
import { GenerationEngine, type EngineOptions, type EngineStats } from './engine.ts';
import { PolicyRunner } from './runner.ts';

/** The engine's options that cross into a worker thread, and the onnxruntime threads of its sessions. */
export type EngineSetup = Pick<EngineOptions, 'maxBatch' | 'kvCacheBytes' | 'interrupt'> & {
  /** onnxruntime intra-op threads per engine. */
  threads: number;
  server: string;
};

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
  load(config: PolicyModelConfig, weights: TensorMap, version: number): Promise<LoadTimes>;
  currentVersion(): number;
  stats(): EngineStats;
  close(): Promise<void>;
}

/** One GenerationEngine in this thread. */
export class InProcessEngine implements PolicyEngine {
  private constructor(
    private readonly engine: GenerationEngine,
    private readonly threads: number,
    readonly first: LoadTimes,
  ) {}

  static async create(config: PolicyModelConfig, weights: TensorMap, version: number, setup: EngineSetup, logger: Logger): Promise<InProcessEngine> {
    const { threads, ...engineOptions } = setup;
    const runner = await PolicyRunner.create(config, weights, version, { threads });
    const engine = new GenerationEngine(config, runner, { ...engineOptions, logger });
    return new InProcessEngine(engine, threads, { exportMs: runner.exportMs, loadMs: runner.loadMs });
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.engine.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    this.engine.releaseSession(sessionId);
  }

  async load(config: PolicyModelConfig, weights: TensorMap, version: number): Promise<LoadTimes> {
    const runner = await PolicyRunner.create(config, weights, version, { threads: this.threads });
    try {
      this.engine.install(runner);
    } catch (err) {
      await runner.release();
      throw err;
    }
    return { exportMs: runner.exportMs, loadMs: runner.loadMs };
  }

  currentVersion(): number {
    return this.engine.currentVersion();
  }

  stats(): EngineStats {
    return this.engine.stats();
  }

  close(): Promise<void> {
    return this.engine.close();
  }
}
