// The built-in policy as an LlmBackend ('builtin'): the model exported to ONNX and served by onnxruntime-node on
// this machine, with continuous batching, kept per-session KV caches and hot-swapped policy versions.
import { RlstreamError } from '../../core/errors.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { readSafetensors, type TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from '../backends/types.ts';
import { parseModelConfig, type ModelConfig } from './config.ts';
import { GenerationEngine, type EngineStats, type SwapMode } from './engine.ts';
import { PolicyRunner } from './runner.ts';

export interface BuiltinPolicyOptions {
  /** Most sequences decoded together (default 64). */
  maxBatch?: number;
  /** Bytes of KV cache kept between the turns of sessions (default 256 MiB). */
  kvCacheBytes?: number;
  /** How a policy update reaches trajectories under way (default 'next_turn'; see engine.ts). */
  swapMode?: SwapMode;
  /** onnxruntime intra-op threads (default 1). */
  threads?: number;
  /** Name reported in GenerateResult.server (default 'builtin'). */
  server?: string;
  logger?: Logger;
}

/** Where the first policy comes from: a safetensors file, or tensors in memory (e.g. a native Model's parameters()). */
export type BuiltinPolicySource =
  | { configJson: string; weightsPath: string; version: number }
  | { configJson: string; weights: TensorMap; version: number };

async function loadWeights(source: BuiltinPolicySource): Promise<TensorMap> {
  return 'weights' in source ? source.weights : readSafetensors(source.weightsPath);
}

export class BuiltinPolicyBackend implements LlmBackend {
  readonly name = 'builtin';
  private updating: Promise<void> = Promise.resolve();

  private constructor(
    private config: ModelConfig,
    private readonly engine: GenerationEngine,
    private readonly threads: number,
    private readonly logger: Logger,
  ) {}

  static async create(source: BuiltinPolicySource, options: BuiltinPolicyOptions = {}): Promise<BuiltinPolicyBackend> {
    const config = parseModelConfig(source.configJson);
    const threads = options.threads ?? 1;
    if (!Number.isInteger(threads) || threads < 1) throw new RlstreamError('CONFIG_INVALID', `threads must be a positive integer, got ${threads}`);
    const logger = options.logger ?? silentLogger;
    const runner = await PolicyRunner.create(config, await loadWeights(source), source.version, { threads });
    logger.info('built-in policy loaded', { version: source.version, exportMs: runner.exportMs, loadMs: runner.loadMs });
    const engine = new GenerationEngine(config, runner, {
      ...(options.maxBatch !== undefined && { maxBatch: options.maxBatch }),
      ...(options.kvCacheBytes !== undefined && { kvCacheBytes: options.kvCacheBytes }),
      ...(options.swapMode !== undefined && { swapMode: options.swapMode }),
      server: options.server ?? 'builtin',
      logger,
    });
    return new BuiltinPolicyBackend(config, engine, threads, logger);
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.engine.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    this.engine.releaseSession(sessionId);
  }

  /** Load a new version (export + new onnxruntime session) and switch to it; updates apply in order. */
  updatePolicy(update: PolicyUpdate): Promise<void> {
    const next = this.updating.then(async () => {
      if (update.version <= this.engine.currentVersion()) {
        this.logger.warn('ignoring a policy update that is not newer', { version: update.version, current: this.engine.currentVersion() });
        return;
      }
      const config = parseModelConfig(update.configJson);
      const weights = await readSafetensors(update.weightsPath);
      const runner = await PolicyRunner.create(config, weights, update.version, { threads: this.threads });
      if (!sameShape(config, this.config)) {
        await runner.release();
        throw new RlstreamError('WEIGHTS_FORMAT', `policy v${update.version} changes the model architecture; the built-in policy only swaps weights`);
      }
      this.engine.install(runner);
      this.config = config;
      this.logger.info('policy hot-swapped', { version: update.version, exportMs: runner.exportMs, loadMs: runner.loadMs });
    });
    // A failed update must not block later ones.
    this.updating = next.catch(() => {});
    return next;
  }

  currentPolicyVersion(): number {
    return this.engine.currentVersion();
  }

  stats(): EngineStats {
    return this.engine.stats();
  }

  async close(): Promise<void> {
    await this.updating;
    await this.engine.close();
  }
}

function sameShape(a: ModelConfig, b: ModelConfig): boolean {
  return (Object.keys(a) as (keyof ModelConfig)[]).every((k) => a[k] === b[k]);
}
