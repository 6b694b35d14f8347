// The native addon (build/Release/rlstream_native.node): its declaration, loading, and the wrappers that turn
// every native error into an RlstreamError. native/codecs.ts (log frames, trace transcoding, Native blocks) and
// native/model.ts (the policy model and its trainer) are the two surfaces over it; a codec user never loads the
// model's TypeScript.
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { RlstreamError, type ErrorCode } from '../core/errors.ts';
import type { ModelConfig } from '../core/weights/model-config.ts';
import type { AdamWOptions, CompiledPolicyLossOptions, DeviceKind, KernelProfile, PolicyLossMetrics } from './model.ts';

export interface NativeTensor {
  name: string;
  shape: number[];
  data: Float32Array;
  /** Its first float in its block: blocks may pad between tensors. */
  offset: number;
}
export interface NativeModelHandle {
  numParameters(): number;
  tensors(kind: 'params' | 'grads' | 'exp_avg' | 'exp_avg_sq'): NativeTensor[];
  upload(kind: 'params' | 'grads' | 'exp_avg' | 'exp_avg_sq'): void;
  forward(tokens: Int32Array, seqStarts: Int32Array, targets: Int32Array, outLogprobs: Float32Array, outEntropy: Float32Array): Promise<void>;
  backwardCrossEntropy(tokens: Int32Array, seqStarts: Int32Array, targets: Int32Array, responseMask: Float32Array, lossScale: number): Promise<{ loss: number; tokens: number }>;
  backwardPolicyLoss(
    tokens: Int32Array,
    seqStarts: Int32Array,
    targets: Int32Array,
    responseMask: Float32Array,
    advantages: Float32Array,
    behaviour: Float32Array,
    proximal: Float32Array | null,
    ref: Float32Array | null,
    options: CompiledPolicyLossOptions,
  ): Promise<PolicyLossMetrics>;
  kvReserve(slots: number, maxLen: number): void;
  activationBytes(tokens: number): number;
  kvBytes(slots: number, maxLen: number): number;
  kvLength(slot: number): number;
  kvTruncate(slot: number, length: number): void;
  extend(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array, outProbs: Float32Array): Promise<void>;
  extendSample(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array, uniforms: Float64Array, outTokens: Int32Array, outLogprobs: Float32Array): Promise<void>;
  zeroGrad(): void;
  copyParamsFrom(source: NativeModelHandle): void;
  mergeLora(layer: number, target: string, A: Float32Array, B: Float32Array, rank: number, scale: number): void;
  gradNorm(): number;
  clipGradNorm(maxNorm: number): number;
  adamwStep(options: AdamWOptions): Promise<void>;
  getStep(): number;
  setStep(step: number): void;
  profile(reset: boolean): KernelProfile;
  trainRange(): { offset: number; numel: number };
  setOptimizerShard(begin: number, count: number): void;
  optimizerShard(): { begin: number; count: number; sharded: boolean };
  paramsWritten(begin: number, n: number): void;
  blockView(kind: 'params' | 'grads'): Float32Array;
  momentShard(kind: 'exp_avg' | 'exp_avg_sq'): Float32Array;
  uploadMomentShard(kind: 'exp_avg' | 'exp_avg_sq'): void;
  dispose(): void;
}
export interface NativeAddon {
  NativeModel: new (
    config: ModelConfig,
    options: { threads: number; seed?: number; initStd?: number; random: boolean; logitChunkTokens?: number; device: DeviceKind; trainable: boolean; lora?: { rank: number; alpha: number; targets: readonly string[]; dropout: number; seed: number }; recompute?: 'none' | 'layer' },
  ) => NativeModelHandle;
  sgemmGflops(n: number, iters: number, threads: number): number;
  crc32(buf: Uint8Array, crc: number): number;
  sealFrames(buf: Uint8Array, from: number, limit: number): number;
  checkFrames(buf: Uint8Array, from: number, limit: number, maxRecords: number, minBody: number, maxBody: number, state: Float64Array): number;
  transcode(program: Int32Array, symbols: Uint8Array, base: Uint8Array, starts: Float64Array, lengths: Int32Array, from: number, to: number, headerBytes: number, out: Uint8Array, state: Float64Array, status: Uint8Array): number;
  nativeBlock?(payload: Uint8Array, rows: number, layout: Int32Array, heads: Uint8Array, headEnds: Int32Array, keys: Int32Array): Promise<Buffer>;
  writeNativeBlock?(path: string, payload: Uint8Array, rows: number, layout: Int32Array, heads: Uint8Array, headEnds: Int32Array, keys: Int32Array): Promise<number>;
  cudaAvailable(): boolean;
  cudaMemory(): { free: number; total: number } | null;
  backend: string;
}


let addon: NativeAddon | undefined;

/** The loaded addon; throws NATIVE_INVALID_ARGUMENT with the build command when it was not built. */
export function native(): NativeAddon {
  if (addon) return addon;
  // The JS paths that stand in for the addon where it is not built (the log's frame checks and sealing, the
  // sink's general path) run as they would there: the tests run them this way, in a process of their own.
  if (process.env['RLSTREAM_NATIVE'] === 'off') throw new RlstreamError('NATIVE_INVALID_ARGUMENT', 'native addon turned off by RLSTREAM_NATIVE=off');
  const require = createRequire(import.meta.url);
  try {
    addon = require('./build/Release/rlstream_native.node') as NativeAddon;
  } catch (err) {
    throw new RlstreamError('NATIVE_INVALID_ARGUMENT', `native addon is not built (run \`npm run build:native\`): ${(err as Error).message}`, { cause: err });
  }
  return addon;
}

const NATIVE_CODES = new Set<string>(['NATIVE_INVALID_ARGUMENT', 'NATIVE_NON_FINITE']);

function wrapError(err: unknown): unknown {
  if (err instanceof RlstreamError) return err;
  if (err instanceof Error) {
    const code = (err as Error & { code?: string }).code;
    const c: ErrorCode = code !== undefined && NATIVE_CODES.has(code) ? (code as ErrorCode) : 'NATIVE_INVALID_ARGUMENT';
    return new RlstreamError(c, err.message, { cause: err });
  }
  return new RlstreamError('NATIVE_INVALID_ARGUMENT', String(err));
}

export function call<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw wrapError(err);
  }
}

export async function callAsync<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw wrapError(err);
  }
}

let missing = false;

/**
 * The addon, or null when it is not built. A failed load is remembered: the log's frame checks ask on every
 * read, and a require that fails costs a file-system search each time.
 */
export function loadedAddon(): NativeAddon | null {
  if (missing) return null;
  try {
    return native();
  } catch {
    missing = true;
    return null;
  }
}

/** Whether the addon is built and loadable (tests and benches use it to skip with a message). */
export function nativeAvailable(): boolean {
  return loadedAddon() !== null;
}

/** Whether models can run with device 'cuda': the addon was built with RLSTREAM_CUDA=1 and a GPU is usable. */
export function cudaAvailable(): boolean {
  try {
    return native().cudaAvailable();
  } catch {
    return false;
  }
}

/** Free and total bytes of the GPU models with device 'cuda' use, or null where there is none. */
export function cudaMemory(): { free: number; total: number } | null {
  return cudaAvailable() ? native().cudaMemory() : null;
}

/** GFLOP/s of one n x n x n cblas_sgemm with the BLAS's own threads: this machine's practical fp32 peak. */
export function sgemmGflops(n = 2048, iters = 3, threads = availableParallelism()): number {
  return call(() => native().sgemmGflops(n, iters, threads));
}
