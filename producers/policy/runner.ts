// One loaded policy version: the exported ONNX graph in an onnxruntime-node session, and a typed `step` that
// feeds token ids, positions, the additive attention bias and the KV cache, and returns log-probs and the
// new cache.
import * as ort from 'onnxruntime-node';
import { RlstreamError } from '../../core/errors.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import type { ModelConfig } from './config.ts';
import { exportOnnx, pastKeyName, pastValueName, presentKeyName, presentValueName, type OutputMode } from './export.ts';

export interface RunnerOptions {
  /** onnxruntime intra-op threads (default 1: on small models a second thread mostly adds sync cost). */
  threads?: number;
  mode?: OutputMode;
}

/** The batched KV cache as [layers] of K and V, each [batch, kvHeads, len, headDim] row-major. */
export interface KvTensors {
  len: number;
  keys: Float32Array[];
  values: Float32Array[];
}

export interface StepInput {
  batch: number;
  seq: number;
  inputIds: BigInt64Array; // [batch, seq]
  positionIds: BigInt64Array; // [batch, seq]
  bias: Float32Array; // [batch, 1, seq, past + seq]
  past: KvTensors; // len = past
}

export interface StepOutput {
  /** [batch, vocab] ('last') or [batch, seq, vocab] ('all'). */
  logprobs: Float32Array;
  present: KvTensors;
}

export class PolicyRunner {
  private constructor(
    readonly config: ModelConfig,
    readonly version: number,
    private readonly session: ort.InferenceSession,
    readonly exportMs: number,
    readonly loadMs: number,
  ) {}

  static async create(config: ModelConfig, weights: TensorMap, version: number, options: RunnerOptions = {}): Promise<PolicyRunner> {
    const t0 = performance.now();
    const bytes = exportOnnx(config, weights, options.mode ?? 'last');
    const t1 = performance.now();
    let session: ort.InferenceSession;
    try {
      session = await ort.InferenceSession.create(bytes, {
        executionProviders: ['cpu'],
        graphOptimizationLevel: 'all',
        intraOpNumThreads: options.threads ?? 1,
        interOpNumThreads: 1,
        executionMode: 'sequential',
        logSeverityLevel: 3, // errors reach the caller as exceptions; keep onnxruntime's own log quiet
      });
    } catch (err) {
      throw new RlstreamError('INTERNAL', `onnxruntime could not load the exported policy v${version}`, { cause: err });
    }
    return new PolicyRunner(config, version, session, t1 - t0, performance.now() - t1);
  }

  async step(input: StepInput): Promise<StepOutput> {
    const c = this.config;
    const { batch, seq } = input;
    const total = input.past.len + seq;
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor('int64', input.inputIds, [batch, seq]),
      position_ids: new ort.Tensor('int64', input.positionIds, [batch, seq]),
      attention_bias: new ort.Tensor('float32', input.bias, [batch, 1, seq, total]),
    };
    const kvDims = [batch, c.numKvHeads, input.past.len, c.headDim];
    for (let l = 0; l < c.numLayers; l++) {
      feeds[pastKeyName(l)] = new ort.Tensor('float32', input.past.keys[l]!, kvDims);
      feeds[pastValueName(l)] = new ort.Tensor('float32', input.past.values[l]!, kvDims);
    }
    const out = await this.session.run(feeds);
    const keys: Float32Array[] = [];
    const values: Float32Array[] = [];
    for (let l = 0; l < c.numLayers; l++) {
      keys.push(out[presentKeyName(l)]!.data as Float32Array);
      values.push(out[presentValueName(l)]!.data as Float32Array);
    }
    return { logprobs: out['logprobs']!.data as Float32Array, present: { len: total, keys, values } };
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** An empty cache for `batch` rows. */
export function emptyKv(c: ModelConfig): KvTensors {
  return { len: 0, keys: Array.from({ length: c.numLayers }, () => new Float32Array(0)), values: Array.from({ length: c.numLayers }, () => new Float32Array(0)) };
}
