// The built-in policy as an LlmBackend ('builtin' with device: cpu): the model exported to ONNX and served by
// onnxruntime-node on this machine through the one continuous-batching scheduler (native-engine.ts over
// onnx-slot-runner.ts), with session KV caches kept between turns and hot-swapped policy versions.
import { RlstreamError } from '../../core/errors.ts';
import { silentLogger, type Logger } from '../../core/telemetry.ts';
import { readWeights } from '../../core/weights/hf-dir.ts';
import { maxSequence, parseModelConfig, type ParsedModelConfig } from '../../core/weights/model-config.ts';
import { readSafetensors, type TensorMap } from '../../core/weights/safetensors.ts';
import type { GenerateRequest, GenerateResult, LlmBackend, PolicyUpdate } from '../backends/types.ts';
import type { NativeEngineStats, RolloutInterrupt } from './native-engine.ts';
import { InProcessEngine, type EngineSetup, type PolicyEngine } from './engine-host.ts';
import { WorkerEngines } from './engine-workers.ts';
import { PolicyUpdates } from './updates.ts';
import { MAX_TOP_LOGPROBS } from './sampler.ts';

export interface BuiltinPolicyOptions {
  /** Most sequences decoded together (default 64). */
  maxBatch?: number;
  /** Bytes of KV cache for idle sessions kept between their turns, in whole slots of maxLen tokens (default 256 MiB). */
  kvCacheBytes?: number;
  /** Tokens a KV-cache slot holds: a trajectory's whole context (default min(4096, maxSequence of the model config)). */
  maxLen?: number;
  /** How a policy update reaches trajectories under way (default 'next_turn'; see native-engine.ts). */
  interrupt?: RolloutInterrupt;
  /** onnxruntime intra-op threads per engine (default 1). */
  threads?: number;
  /**
   * Engines in worker threads that share the running batch, each with maxBatch / workers rows (default 1: one
   * engine in this thread). On a machine with spare cores, workers × threads up to the core count serves
   * large batches faster than threads alone (see engine-workers.ts).
   */
  workers?: number;
  /** Name reported in GenerateResult.server (default 'builtin'). */
  server?: string;
  logger?: Logger;
}

/** Where the first policy comes from: a safetensors file, or tensors in memory (e.g. a native Model's parameters()). */
export type BuiltinPolicySource =
  | { configJson: string; weightsPath: string; version: number }
  | { configJson: string; weights: TensorMap; version: number };

async function loadWeights(source: BuiltinPolicySource): Promise<TensorMap> {
  return 'weights' in source ? source.weights : readWeights(source.weightsPath);
}

export class BuiltinPolicyBackend implements LlmBackend {
  readonly name = 'builtin';
  /** The engine returns the top alternatives of the very distribution each token was sampled from. */
  readonly maxTopLogprobs = MAX_TOP_LOGPROBS;
  private readonly updates: PolicyUpdates;

  private constructor(
    private config: ParsedModelConfig,
    private readonly engine: PolicyEngine,
    private readonly logger: Logger,
    /** Engine worker threads serving generations (1: the engine runs in the caller's thread). */
    readonly workers: number,
  ) {
    this.updates = new PolicyUpdates(() => engine.currentPolicyVersion(), logger);
  }

  static async create(source: BuiltinPolicySource, options: BuiltinPolicyOptions = {}): Promise<BuiltinPolicyBackend> {
    const config = parseModelConfig(source.configJson);
    const threads = options.threads ?? 1;
    if (!Number.isInteger(threads) || threads < 1) throw new RlstreamError('CONFIG_INVALID', `threads must be a positive integer, got ${threads}`);
    const workers = options.workers ?? 1;
    if (!Number.isInteger(workers) || workers < 1) throw new RlstreamError('CONFIG_INVALID', `workers must be a positive integer, got ${workers}`);
    const maxLen = options.maxLen ?? Math.min(4096, maxSequence(config));
    if (!Number.isInteger(maxLen) || maxLen < 2) throw new RlstreamError('CONFIG_INVALID', `maxLen must be an integer of at least 2, got ${maxLen}`);
    const logger = options.logger ?? silentLogger;
    const setup: EngineSetup = { maxBatch: options.maxBatch ?? 64, kvCacheBytes: options.kvCacheBytes ?? 256 * 1024 * 1024, maxLen, interrupt: options.interrupt ?? 'next_turn', threads, server: options.server ?? 'builtin' };
    const weights = await loadWeights(source);
    const engine = workers === 1 ? await InProcessEngine.create(config, weights, source.version, setup, logger) : await WorkerEngines.create(config, weights, source.version, setup, workers, logger);
    logger.info('built-in policy loaded', { version: source.version, workers, ...engine.first });
    return new BuiltinPolicyBackend(config, engine, logger, workers);
  }

  generate(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResult> {
    return this.engine.generate(request, signal);
  }

  releaseSession(sessionId: string): void {
    this.engine.releaseSession(sessionId);
  }

  /** Load a new version (export + new onnxruntime session) and switch to it; updates apply in order. */
  updatePolicy(update: PolicyUpdate): Promise<void> {
    return this.updates.apply(update, async () => {
      const config = parseModelConfig(update.configJson);
      PolicyUpdates.checkArchitecture(update, config, this.config);
      PolicyUpdates.refuseAdapter(update, 'onnx');
      const weights = await readSafetensors(update.weightsPath);
      const times = await this.engine.load(config, weights, update.version);
      this.config = config;
      this.logger.info('policy hot-swapped', { version: update.version, ...times });
    });
  }

  currentPolicyVersion(): number {
    return this.engine.currentPolicyVersion();
  }

  stats(): NativeEngineStats {
    return this.engine.stats();
  }

  async close(): Promise<void> {
    await this.updates.settled();
    await this.engine.close();
  }
}
