// The policy model and its trainer in native memory: the public types (packed batches, loss inputs and
// options, AdamW), option compilation with exact validation messages, and Model (init, load, forward, the two
// losses' backward passes, gradient clipping, AdamW, weights and checkpoints as safetensors).
// Shapes: T tokens in a packed batch of S sequences; every per-token array has length T.
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { RlstreamError } from '../core/errors.ts';
import { hfConfigJson, parseModelConfig, type ModelConfig, type ParsedModelConfig } from '../core/weights/model-config.ts';
import { openWeights } from '../core/weights/hf-dir.ts';
import { writeSafetensors } from '../core/weights/safetensors.ts';
import { call, callAsync, native, type NativeModelHandle, type NativeTensor } from './addon.ts';
import { checkLoraOptions, isAdapterTensor, loraFromMetadata, loraMetadata, parseAdapterName, type LoraOptions } from './lora.ts';
import { loadOptimizerState, OPTIMIZER_FILE } from './optimizer-state.ts';

export { LORA_FILE_FORMAT, LORA_TARGETS, type LoraOptions, type LoraTarget } from './lora.ts';

/** The model's shape, as a checkpoint's config.json gives it (parsed in core/weights/model-config.ts). */
export { parseModelConfig, type ModelConfig } from '../core/weights/model-config.ts';

/** Several sequences packed without padding. Attention never crosses a sequence; positions restart at 0. */
export interface PackedBatch {
  tokens: Int32Array; // [T]
  seqStarts: Int32Array; // [S+1] cu_seqlens: 0 = seqStarts[0] < seqStarts[1] < ... < seqStarts[S] = T
}

/**
 * Per-token inputs, aligned with tokens: targets[t] is the token predicted at position t (normally tokens[t+1]
 * of the same sequence); -1 where there is none. Positions with responseMask 0 are ignored (their other values
 * must still be finite: fill them with 0).
 */
export interface PolicyLossInputs {
  targets: Int32Array; // [T]
  /** The trajectories' response_mask moved onto the packed positions (see consumers/trainer/batch.ts). */
  responseMask: Float32Array; // [T] >= 0, normally 0/1
  advantages: Float32Array; // [T]
  behaviourLogprobs: Float32Array; // [T] log-probs of the policy that sampled the tokens
  proximalLogprobs?: Float32Array; // [T] default = behaviour (plain PPO)
  refLogprobs?: Float32Array; // [T] needed when klCoef != 0
}

/** The native policy-loss kernels (native/src/losses.cpp, one function each; registry: consumers/trainer/policy-losses.ts). */
export type PolicyLossName = 'ppo' | 'gspo' | 'cispo';
export const POLICY_LOSS_NAMES: readonly PolicyLossName[] = Object.freeze(['ppo', 'gspo', 'cispo']);

/**
 * Rollout correction of the behaviour-vs-proximal mismatch, on the weight w = pi_prox / pi_behaviour of a token
 * or of its sequence (the product of its token weights): 'truncate' trains with min(w, cap) (TIS), 'mask' with w
 * where low <= w <= high and drops the token (or the whole sequence) elsewhere (MIS, IcePop), 'off' with 1.
 */
export type RolloutCorrection =
  | { mode: 'off' }
  | { mode: 'truncate'; level?: 'token' | 'sequence'; cap: number }
  | { mode: 'mask'; level?: 'token' | 'sequence'; low: number; high: number };

/**
 * The defaults of the options every policy loss shares, in one place: compilePolicyLossOptions fills them, and the
 * trainer's config schema (consumers/trainer/options.ts) shows them as its defaults. The clip bounds have none
 * here: each loss's registry entry (consumers/trainer/policy-losses.ts) has its own. The C++ side has none at all
 * (native/src/losses.h): the glue passes it every value.
 */
export const POLICY_LOSS_DEFAULTS = Object.freeze({
  loss: 'ppo' as PolicyLossName,
  correction: Object.freeze({ mode: 'truncate', level: 'token', cap: 2 } as const),
  klCoef: 0,
  klType: 'k3' as 'k1' | 'k2' | 'k3',
  entropyCoef: 0,
  aggregation: 'token-mean' as 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean',
  lossScale: 1,
});

export interface PolicyLossOptions {
  loss?: PolicyLossName; // default 'ppo'
  clipLow: number; // ratio lower bound 1 - clipLow (cispo: of the IS weight; 1 = no lower bound)
  clipHigh: number; // ratio upper bound 1 + clipHigh
  dualClipC?: number | null; // ppo only; > 1; null/undefined: no dual clip
  iwCap?: number | null; // shorthand for correction { mode: 'truncate', level: 'token', cap }; default 2; null: 'off'
  correction?: RolloutCorrection; // instead of iwCap
  klCoef?: number; // default 0
  klType?: 'k1' | 'k2' | 'k3'; // default 'k3'
  entropyCoef?: number; // default 0 (bonus: loss -= entropyCoef * entropy)
  aggregation?: 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean'; // default 'token-mean'
  lossScale?: number; // default 1; multiplies loss and gradients (micro-batch accumulation)
}

/** Fully specified options as the addon receives them (0 = off for dualClipC and iwCap). */
export interface CompiledPolicyLossOptions {
  readonly loss: PolicyLossName;
  readonly clipLow: number;
  readonly clipHigh: number;
  readonly dualClipC: number;
  readonly correction: 'off' | 'truncate' | 'mask';
  readonly correctionLevel: 'token' | 'sequence';
  readonly iwCap: number;
  readonly maskLow: number;
  readonly maskHigh: number;
  readonly klCoef: number;
  readonly klType: 'k1' | 'k2' | 'k3';
  readonly entropyCoef: number;
  readonly aggregation: 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean';
  readonly lossScale: number;
}

export interface PolicyLossMetrics {
  loss: number; // lossScale * (pgLoss + klCoef * kl - entropyCoef * entropy)
  pgLoss: number; // aggregated clipped surrogate (times the importance weights)
  clipFraction: number; // masked mean of [clipped term chosen]
  dualClipFraction: number; // masked mean of [dual-clip bound chosen]
  approxKl: number; // masked mean of log pi_prox - log pi (prox = behaviour without the decoupled objective)
  entropy: number; // aggregated entropy
  kl: number; // aggregated KL to the reference (0 without refLogprobs)
  iwMean: number; // masked mean of the raw weight pi_prox / pi_behaviour (1 when disabled)
  iwMax: number; // max of the raw weight
  iwTruncatedFraction: number; // masked fraction with raw weight > cap (correction 'truncate')
  iwMaskedFraction: number; // masked fraction dropped for a weight outside [low, high] (correction 'mask')
  tokens: number; // positions with responseMask != 0
}

export interface AdamWOptions {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number; // decoupled: p *= 1 - lr * weightDecay, applied to every parameter
}

export interface TensorView {
  shape: number[];
  data: Float32Array;
}

/** Seconds of kernel wall time per kind since the model was made (or the profile reset). */
export interface KernelProfile {
  matmul: number;
  attention: number;
  elementwise: number;
  logits: number;
  optimizer: number;
  /** Decode steps replayed as CUDA graphs, each whole (0 on the CPU, or with RLSTREAM_CUDA_GRAPHS=0). */
  graph: number;
}

/** Where a model's kernels run. 'cuda' needs an addon built with RLSTREAM_CUDA=1 and a GPU (see cudaAvailable()). */
export type DeviceKind = 'cpu' | 'cuda';

export interface InitOptions {
  seed: number;
  device?: DeviceKind; // default 'cpu'
  threads?: number; // default: available parallelism
  initStd?: number; // default 0.02 (norms 1, biases 0)
  logitChunkTokens?: number; // tokens per logits chunk; default ~32 MiB of logits
  trainable?: boolean; // default true; false: parameters only (a quarter of the memory), training calls throw
  /** Adapters: only they train (gradients and AdamW state cover them alone); the base weights stay frozen. */
  lora?: LoraOptions;
  /** 'layer': activation recomputation per layer (one layer's activations kept; one more forward's work). Default 'none'. */
  recompute?: Recompute;
}

export interface LoadOptions {
  device?: DeviceKind; // default 'cpu'
  threads?: number;
  logitChunkTokens?: number;
  trainable?: boolean; // default true; false: parameters only (a quarter of the memory), training calls throw
  /** Adapters over the loaded (frozen) weights, initialised from lora.seed; see InitOptions.lora. */
  lora?: LoraOptions;
  /** See InitOptions.recompute. */
  recompute?: Recompute;
}

/** Activation recomputation: 'none' keeps every layer's activations for the backward, 'layer' recomputes them. */
export type Recompute = 'none' | 'layer';

function recomputeOf(r: unknown, where: string): Recompute | undefined {
  if (r === undefined) return undefined;
  if (r !== 'none' && r !== 'layer') invalid(`${where}: options.recompute must be 'none' or 'layer', got ${JSON.stringify(r)}`);
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Config and options

function invalid(msg: string): never {
  throw new RlstreamError('NATIVE_INVALID_ARGUMENT', msg);
}

function deviceOf(d: unknown, where: string): DeviceKind {
  if (d === undefined) return 'cpu';
  if (d !== 'cpu' && d !== 'cuda') invalid(`${where}: options.device must be 'cpu' or 'cuda', got ${JSON.stringify(d)}`);
  return d;
}

/** Fills defaults and validates; the messages name the option. */
export function compilePolicyLossOptions(o: PolicyLossOptions): CompiledPolicyLossOptions {
  const fin = (k: string, v: unknown): number => {
    if (typeof v !== 'number' || !Number.isFinite(v)) invalid(`policy loss options: ${k} must be a finite number, got ${String(v)}`);
    return v;
  };
  const D = POLICY_LOSS_DEFAULTS;
  const loss = o.loss ?? D.loss;
  if (!POLICY_LOSS_NAMES.includes(loss)) invalid(`policy loss options: loss must be one of ${POLICY_LOSS_NAMES.join(', ')}, got ${String(loss)}`);
  const clipLow = fin('clipLow', o.clipLow);
  const clipHigh = fin('clipHigh', o.clipHigh);
  if (loss === 'cispo' ? clipLow < 0 || clipLow > 1 : clipLow < 0 || clipLow >= 1)
    invalid(`policy loss options: clipLow must be in ${loss === 'cispo' ? '[0, 1] (1: no lower bound)' : '[0, 1)'}, got ${clipLow}`);
  if (clipHigh < 0) invalid(`policy loss options: clipHigh must be >= 0, got ${clipHigh}`);
  const dual = o.dualClipC ?? 0;
  if (o.dualClipC !== null && o.dualClipC !== undefined && (fin('dualClipC', dual) <= 1))
    invalid(`policy loss options: dualClipC must be > 1 (or null), got ${dual}`);
  if (dual !== 0 && loss !== 'ppo') invalid(`policy loss options: dualClipC applies to the ppo loss only (loss is ${loss})`);
  if (o.correction !== undefined && o.iwCap !== undefined) invalid('policy loss options: give iwCap or correction, not both');
  const c: RolloutCorrection = o.correction ?? (o.iwCap === null ? { mode: 'off' } : o.iwCap === undefined ? D.correction : { mode: 'truncate', cap: o.iwCap });
  if (!['off', 'truncate', 'mask'].includes(c.mode)) invalid(`policy loss options: correction.mode must be 'off', 'truncate' or 'mask', got ${String(c.mode)}`);
  const level = c.mode === 'off' ? 'token' : (c.level ?? D.correction.level);
  if (level !== 'token' && level !== 'sequence') invalid(`policy loss options: correction.level must be 'token' or 'sequence', got ${String(level)}`);
  const iwCap = c.mode === 'truncate' ? fin(o.correction ? 'correction.cap' : 'iwCap', c.cap) : 0;
  if (c.mode === 'truncate' && iwCap <= 0) invalid(`policy loss options: ${o.correction ? 'correction.cap' : 'iwCap'} must be > 0 (or null to disable), got ${iwCap}`);
  const maskLow = c.mode === 'mask' ? fin('correction.low', c.low) : 0;
  const maskHigh = c.mode === 'mask' ? fin('correction.high', c.high) : 0;
  if (c.mode === 'mask' && !(maskLow >= 0 && maskLow < maskHigh)) invalid(`policy loss options: correction needs 0 <= low < high, got [${maskLow}, ${maskHigh}]`);
  const klCoef = fin('klCoef', o.klCoef ?? D.klCoef);
  if (klCoef < 0) invalid(`policy loss options: klCoef must be >= 0, got ${klCoef}`);
  const klType = o.klType ?? D.klType;
  if (!['k1', 'k2', 'k3'].includes(klType)) invalid(`policy loss options: klType must be 'k1', 'k2' or 'k3', got ${String(klType)}`);
  const aggregation = o.aggregation ?? D.aggregation;
  if (!['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean'].includes(aggregation))
    invalid(`policy loss options: aggregation must be 'token-mean', 'seq-mean-token-sum' or 'seq-mean-token-mean', got ${String(aggregation)}`);
  const compiled: CompiledPolicyLossOptions = Object.freeze({
    loss,
    clipLow,
    clipHigh,
    dualClipC: dual,
    correction: c.mode,
    correctionLevel: level,
    iwCap,
    maskLow,
    maskHigh,
    klCoef,
    klType,
    entropyCoef: fin('entropyCoef', o.entropyCoef ?? D.entropyCoef),
    aggregation,
    lossScale: lossScaleOf(o.lossScale ?? D.lossScale),
  });
  COMPILED.add(compiled);
  return compiled;
}

/** Options compilePolicyLossOptions made: backwardPolicyLoss takes them as they are, without compiling again. */
const COMPILED = new WeakSet<CompiledPolicyLossOptions>();

function lossScaleOf(v: unknown): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) invalid(`policy loss options: lossScale must be a finite number >= 0, got ${String(v)}`);
  return v;
}

/**
 * Compiled options with another loss scale (a micro-batch's share of its mini-batch): the trainer compiles its
 * options once at start-up and scales them per micro-batch, checking only the scale.
 */
export function withLossScale(o: CompiledPolicyLossOptions, lossScale: number): CompiledPolicyLossOptions {
  if (!COMPILED.has(o)) invalid('withLossScale takes options from compilePolicyLossOptions');
  const scaled = Object.freeze({ ...o, lossScale: lossScaleOf(lossScale) });
  COMPILED.add(scaled);
  return scaled;
}

// ---------------------------------------------------------------------------------------------------------------
// Model

// Tensors some HF checkpoints carry that this model recomputes or ignores.
const IGNORED_TENSOR = /(^|\.)rotary_emb\.inv_freq$/;

/**
 * A policy model with gradients and AdamW state in native memory. Long calls return promises and run off the
 * main thread; calls on one model run one at a time in call order (queued). Synchronous calls made while a long
 * call is pending throw NATIVE_INVALID_ARGUMENT instead of racing it.
 *
 * On device 'cuda' the weights, gradients and optimizer state live on the GPU; parameters(), gradients() and
 * optimizerState() return host snapshots taken at the call (writing into them does not change the model), and
 * weights and checkpoints are the same files as on the CPU.
 */
export class Model {
  /** The config as the one parser returned it (core/weights/model-config.ts): every key set, frozen. */
  readonly config: ParsedModelConfig;
  readonly numParameters: number;
  readonly device: DeviceKind;
  /** The adapters this model trains, or null when every parameter trains. */
  readonly lora: Required<LoraOptions> | null;
  private handle: NativeModelHandle | null;
  private tail: Promise<unknown> = Promise.resolve();
  private pending = 0;
  private pendingOp = '';

  private constructor(config: ParsedModelConfig, handle: NativeModelHandle, device: DeviceKind, lora: Required<LoraOptions> | null) {
    this.config = config;
    this.device = device;
    this.lora = lora;
    this.handle = handle;
    this.numParameters = call(() => handle.numParameters());
  }

  static init(config: ModelConfig, options: InitOptions): Model {
    const cfg = parseModelConfig(config);
    const device = deviceOf(options.device, 'Model.init');
    const lora = options.lora === undefined ? null : checkLoraOptions(options.lora, 'Model.init');
    const opts = { threads: options.threads ?? availableParallelism(), seed: options.seed, initStd: options.initStd ?? 0.02, random: true, logitChunkTokens: options.logitChunkTokens, device, trainable: options.trainable ?? true, lora: lora ?? undefined, recompute: recomputeOf(options.recompute, 'Model.init') };
    if (!Number.isInteger(opts.seed)) invalid(`Model.init: options.seed must be an integer, got ${String(opts.seed)}`);
    return new Model(cfg, call(() => new (native().NativeModel)(cfg, opts)), device, lora);
  }

  /** Loads weights (F32, BF16 or F16) with Hugging Face tensor names: a safetensors file or a model directory (shards and index). */
  static load(weightsPath: string, config: ModelConfig, options: LoadOptions = {}): Model {
    const cfg = parseModelConfig(config);
    const device = deviceOf(options.device, 'Model.load');
    const lora = options.lora === undefined ? null : checkLoraOptions(options.lora, 'Model.load');
    const handle = call(() => new (native().NativeModel)(cfg, { threads: options.threads ?? availableParallelism(), random: false, logitChunkTokens: options.logitChunkTokens, device, trainable: options.trainable ?? true, lora: lora ?? undefined, recompute: recomputeOf(options.recompute, 'Model.load') }));
    const model = new Model(cfg, handle, device, lora);
    try {
      readInto(weightsPath, model.baseParameters(), 'weights', cfg.tie_word_embeddings ? new Set(['lm_head.weight']) : new Set());
      call(() => handle.upload('params')); // the views are host mirrors on a device (a no-op on the CPU)
    } catch (err) {
      model.dispose();
      throw err;
    }
    return model;
  }

  /**
   * Replaces the weights in place from a safetensors file of the same shapes (on 'cuda' through the host mirror
   * and one upload): a generation engine over this model takes a new policy version without a new model.
   */
  loadWeights(weightsPath: string): Promise<void> {
    return this.queue('loadWeights', async (h) => {
      readInto(weightsPath, this.baseParameters(), 'weights', this.config.tie_word_embeddings ? new Set(['lm_head.weight']) : new Set());
      h.upload('params');
    });
  }

  /** Replaces this model's adapters from an adapter file (saveAdapter's) of the same rank, alpha and targets. */
  loadAdapter(path: string): Promise<void> {
    return this.queue('loadAdapter', async (h) => {
      const own = this.lora;
      if (!own) invalid('model.loadAdapter: this model has no adapters (made without options.lora)');
      const meta = readInto(path, this.adapter(), 'adapter', new Set());
      const got = loraFromMetadata(meta, path);
      if (got.rank !== own.rank || got.alpha !== own.alpha || got.targets.join() !== own.targets.join())
        throw new RlstreamError('WEIGHTS_FORMAT', `${path}: adapter of rank ${got.rank}, alpha ${got.alpha}, targets ${got.targets.join(',')}; this model has rank ${own.rank}, alpha ${own.alpha}, targets ${own.targets.join(',')}`);
      h.upload('params');
    });
  }

  /** The adapter tensors (views as parameters()'s), empty without adapters. */
  adapter(): Map<string, TensorView> {
    const all = this.parameters();
    for (const name of [...all.keys()]) if (!isAdapterTensor(name)) all.delete(name);
    return all;
  }

  /** The base model's tensors (every parameter but the adapters). */
  baseParameters(): Map<string, TensorView> {
    const all = this.parameters();
    for (const name of [...all.keys()]) if (isAdapterTensor(name)) all.delete(name);
    return all;
  }

  /** Writes the adapters alone (their names, rank, alpha and targets in the metadata): what a policy version publishes. */
  saveAdapter(path: string, metadata: Record<string, string> = {}): Promise<void> {
    return this.queue('saveAdapter', async () => {
      if (!this.lora) invalid('model.saveAdapter: this model has no adapters (made without options.lora)');
      await writeSafetensors(path, this.adapter(), { ...metadata, ...loraMetadata(this.lora) });
    });
  }

  /** Writes the base weights alone (all of save()'s without adapters; save() writes the adapters' tensors too). */
  saveBase(weightsPath: string): Promise<void> {
    return this.queue('saveBase', async () => {
      await writeSafetensors(weightsPath, this.baseParameters(), { format: 'pt' });
    });
  }

  /**
   * Folds the adapters of an adapter file into this model's weights in place (W += scale * alpha/rank * B A),
   * scale -1 takes them out again: how a generating engine applies a policy version published as an adapter.
   * The model must have no adapters of its own.
   */
  mergeAdapter(path: string, scale = 1): Promise<void> {
    return this.queue('mergeAdapter', async (h) => {
      const w = openWeights(path);
      try {
        const o = loraFromMetadata(w.metadata, path);
        const tensors: [string, Float32Array][] = [];
        for (const [name, t] of w.tensors) {
          const data = new Float32Array(t.entry.shape.reduce((a, b) => a * b, 1));
          w.read(name, data);
          tensors.push([name, data]);
        }
        this.foldAdapters(h, tensors, o, scale, path);
      } finally {
        w.close();
      }
    });
  }

  /**
   * mergeAdapter's fold from tensors in memory (named as in an adapter file): how an engine applies adapters a
   * trainer in another process broadcast to it. `source` names them in errors.
   */
  mergeAdapterTensors(tensors: Iterable<[string, Float32Array]>, lora: { rank: number; alpha: number }, scale: number, source: string): void {
    this.sync('mergeAdapterTensors', (h) => this.foldAdapters(h, tensors, lora, scale, source));
  }

  private foldAdapters(h: NativeModelHandle, tensors: Iterable<[string, Float32Array]>, o: { rank: number; alpha: number }, scale: number, source: string): void {
    const pairs = new Map<string, { layer: number; target: string; A?: Float32Array; B?: Float32Array }>();
    for (const [name, data] of tensors) {
      const at = parseAdapterName(name);
      if (!at) throw new RlstreamError('WEIGHTS_FORMAT', `${source}: unexpected tensor ${name} in an adapter file`);
      if (at.layer >= this.config.num_hidden_layers) throw new RlstreamError('WEIGHTS_FORMAT', `${source}: ${name}: layer ${at.layer} beyond the model's ${this.config.num_hidden_layers}`);
      const key = `${at.layer}.${at.target}`;
      const p = pairs.get(key) ?? { layer: at.layer, target: at.target };
      p[at.matrix] = data;
      pairs.set(key, p);
    }
    // every pair checked before the first is folded in: a damaged file leaves the weights as they were
    for (const p of pairs.values())
      if (!p.A || !p.B) throw new RlstreamError('WEIGHTS_FORMAT', `${source}: layer ${p.layer} ${p.target} has lora_${p.A ? 'B' : 'A'} missing`);
    for (const p of pairs.values()) h.mergeLora(p.layer, p.target, p.A!, p.B!, o.rank, (scale * o.alpha) / o.rank);
  }

  private get h(): NativeModelHandle {
    if (!this.handle) invalid('model was disposed');
    return this.handle;
  }

  private sync<T>(op: string, fn: (h: NativeModelHandle) => T): T {
    if (this.pending > 0) invalid(`model.${op}: ${this.pendingOp} is still running on this model; await it first`);
    return call(() => fn(this.h));
  }

  /** Queues a long call behind the ones already issued on this model. */
  private queue<T>(op: string, fn: (h: NativeModelHandle) => Promise<T>): Promise<T> {
    this.pending++;
    const run = async (): Promise<T> => {
      this.pendingOp = op;
      try {
        return await callAsync(() => fn(this.h));
      } finally {
        this.pending--;
      }
    };
    const p = this.tail.then(run, run);
    this.tail = p.catch(() => undefined);
    return p;
  }

  get step(): number {
    return call(() => this.h.getStep());
  }

  /**
   * Zero-copy views of the parameters, HF names. Writing into them changes the model (on 'cpu'; on 'cuda' they are
   * a snapshot of the GPU copy). Valid after dispose.
   */
  parameters(): Map<string, TensorView> {
    return views(call(() => this.h.tensors('params')));
  }
  /** Zero-copy views of the accumulated gradients (names and shapes of the trained parameters: all, or the adapters). */
  gradients(): Map<string, TensorView> {
    return views(call(() => this.h.tensors('grads')));
  }
  /** Zero-copy views of AdamW's first and second moments. */
  optimizerState(): { expAvg: Map<string, TensorView>; expAvgSq: Map<string, TensorView> } {
    return { expAvg: views(call(() => this.h.tensors('exp_avg'))), expAvgSq: views(call(() => this.h.tensors('exp_avg_sq'))) };
  }

  /** Log-probs of targets ([T], 0 where targets[t] = -1) and entropies ([T]) of the next-token distributions. */
  forward(batch: PackedBatch, targets: Int32Array): Promise<{ logprobs: Float32Array; entropy: Float32Array }> {
    const T = batch.tokens?.length ?? 0;
    const logprobs = new Float32Array(T);
    const entropy = new Float32Array(T);
    return this.queue('forward', async (h) => {
      await h.forward(batch.tokens, batch.seqStarts, targets, logprobs, entropy);
      return { logprobs, entropy };
    });
  }

  /** Forward + backward of the RL policy loss; gradients are accumulated. */
  backwardPolicyLoss(batch: PackedBatch, inputs: PolicyLossInputs, options: PolicyLossOptions | CompiledPolicyLossOptions): Promise<PolicyLossMetrics> {
    const o = COMPILED.has(options as CompiledPolicyLossOptions) ? (options as CompiledPolicyLossOptions) : compilePolicyLossOptions(options as PolicyLossOptions);
    return this.queue('backwardPolicyLoss', (h) =>
      h.backwardPolicyLoss(
        batch.tokens,
        batch.seqStarts,
        inputs.targets,
        inputs.responseMask,
        inputs.advantages,
        inputs.behaviourLogprobs,
        inputs.proximalLogprobs ?? null,
        inputs.refLogprobs ?? null,
        o,
      ),
    );
  }

  /** Forward + backward of the token-mean cross-entropy over masked positions; gradients are accumulated. */
  backwardCrossEntropy(batch: PackedBatch, targets: Int32Array, responseMask: Float32Array, options: { lossScale?: number } = {}): Promise<{ loss: number; tokens: number }> {
    const scale = options.lossScale ?? 1;
    return this.queue('backwardCrossEntropy', (h) => h.backwardCrossEntropy(batch.tokens, batch.seqStarts, targets, responseMask, scale));
  }

  /**
   * Allocates the KV cache of incremental decoding: `slots` sequences of up to `maxLen` tokens (where the kernels run;
   * 2 x layers x slots x maxLen x kv_dim floats). Replaces any previous cache; every slot starts empty.
   */
  kvReserve(slots: number, maxLen: number): void {
    this.sync('kvReserve', (h) => h.kvReserve(slots, maxLen));
  }

  /** Bytes of the activations a step of `tokens` tokens allocates (where the kernels run). */
  activationBytes(tokens: number): number {
    return this.sync('activationBytes', (h) => h.activationBytes(tokens));
  }

  /** Bytes kvReserve(slots, maxLen) allocates. */
  kvBytes(slots: number, maxLen: number): number {
    return this.sync('kvBytes', (h) => h.kvBytes(slots, maxLen));
  }

  /** Tokens cached in a slot. */
  kvLength(slot: number): number {
    return this.sync('kvLength', (h) => h.kvLength(slot));
  }

  /** Keeps the first `length` tokens of a slot (0 frees it for another sequence). */
  kvTruncate(slot: number, length: number): void {
    this.sync('kvTruncate', (h) => h.kvTruncate(slot, length));
  }

  /**
   * Appends counts[b] tokens to slots[b] for every b (tokens packed in that order: a prefill is a count above 1, a
   * decode step a count of 1, and one call may mix them), attending to what each slot cached before, and returns
   * the next-token distribution after each slot's last token, softmax(logits * invTemperature[b]), as [B, V]
   * (invTemperature defaults to 1), into `out` when given (B x V floats: a caller stepping many times reuses one
   * buffer instead of a fresh allocation of B x V floats per step). Uses the weights in place now: a trainer step
   * between calls is seen by the next call, while tokens cached before it keep the K/V of the weights that
   * computed them.
   */
  extend(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature?: Float32Array, out?: Float32Array): Promise<Float32Array> {
    const B = slots?.length ?? 0;
    const inv = invTemperature ?? new Float32Array(B).fill(1);
    const probs = out ?? new Float32Array(B * this.config.vocab_size);
    return this.queue('extend', async (h) => {
      await h.extend(slots, counts, tokens, inv, probs);
      return probs;
    });
  }

  /**
   * extend, then one token per slot drawn where the rows are (they never reach the host): uniforms[b] in [0, 1)
   * takes the first token whose cumulative probability exceeds it, a negative one the arg-max (producers/policy/
   * sampler.ts's rule for rows without top-k / top-p). Returns each token and its log-probability under the row.
   */
  extendSample(slots: Int32Array, counts: Int32Array, tokens: Int32Array, invTemperature: Float32Array, uniforms: Float64Array): Promise<{ tokens: Int32Array; logprobs: Float32Array }> {
    const B = slots?.length ?? 0;
    const out = { tokens: new Int32Array(B), logprobs: new Float32Array(B) };
    return this.queue('extendSample', async (h) => {
      await h.extendSample(slots, counts, tokens, invTemperature, uniforms, out.tokens, out.logprobs);
      return out;
    });
  }

  zeroGrad(): void {
    this.sync('zeroGrad', (h) => h.zeroGrad());
  }

  /**
   * This model's weights become a copy of `source`'s (same shapes, same device), device to device: how a model
   * that generates takes a version from a trainer's model in the same process without a file. Both models must
   * be idle; kernels issued afterwards on either see the copy.
   */
  copyParamsFrom(source: Model): void {
    if (source.pending > 0) invalid(`model.copyParamsFrom: ${source.pendingOp} is still running on the source model; await it first`);
    this.sync('copyParamsFrom', (h) => h.copyParamsFrom(source.h));
  }

  /** Global L2 norm of the accumulated gradients. */
  gradNorm(): number {
    return this.sync('gradNorm', (h) => h.gradNorm());
  }

  /** Kernel time per kind so far (see KernelProfile); `reset` starts a new measurement. */
  profile(reset = false): KernelProfile {
    return this.sync('profile', (h) => h.profile(reset));
  }

  /**
   * Where the trained floats sit in the parameter block: gradient float i is parameter float offset + i (all of the
   * parameters, offset 0, without LoRA; the adapters' block with it).
   */
  trainRange(): { offset: number; numel: number } {
    return this.sync('trainRange', (h) => h.trainRange());
  }

  /**
   * ZeRO-1: AdamW's moments for trained floats [begin, begin + count) alone (2 x count floats instead of 2 x the
   * trained count), and adamwStep updates that slice only; the other slices come from the other ranks. Before the
   * first optimizer step only; the moments' views and checkpoints are refused while a shard is set.
   */
  setOptimizerShard(begin: number, count: number): void {
    this.sync('setOptimizerShard', (h) => h.setOptimizerShard(begin, count));
  }

  /** The trained floats the optimizer's moments cover (all of them unless setOptimizerShard cut them). */
  optimizerShard(): { begin: number; count: number; sharded: boolean } {
    return this.sync('optimizerShard', (h) => h.optimizerShard());
  }

  /** Parameters [begin, begin + n) were written from outside the kernels (a collective): derived copies are made again. */
  paramsWritten(begin: number, n: number): void {
    this.sync('paramsWritten', (h) => h.paramsWritten(begin, n));
  }

  /** The whole parameter or gradient block as one zero-copy view: the model's memory, so on 'cpu' only. */
  blockView(kind: 'params' | 'grads'): Float32Array {
    return this.sync('blockView', (h) => h.blockView(kind));
  }

  /**
   * The trained tensors (every parameter, or the adapters) in the gradient block's order, with where each starts in
   * it: the gradient block, the moments and the optimizer shards index trained floats this way, and the block may
   * pad between tensors.
   */
  trainedLayout(): { name: string; offset: number; length: number }[] {
    return this.sync('trainedLayout', (h) => h.tensors('grads').map((t) => ({ name: t.name, offset: t.offset, length: t.data.length })));
  }

  /**
   * The AdamW moments as the optimizer holds them, flat: `count` floats from trained float `begin` (optimizerShard();
   * every trained float, in the gradient block's order, when unsharded), and the step their bias corrections are at.
   * The model's memory on 'cpu'; on 'cuda' host copies made now, which setOptimizerMoments writes back.
   */
  optimizerMoments(): { begin: number; count: number; step: number; expAvg: Float32Array; expAvgSq: Float32Array } {
    return this.sync('optimizerMoments', (h) => {
      const { begin, count } = h.optimizerShard();
      return { begin, count, step: h.getStep(), expAvg: h.momentShard('exp_avg'), expAvgSq: h.momentShard('exp_avg_sq') };
    });
  }

  /** After the caller filled optimizerMoments()'s arrays: they become the optimizer's state, at step `step`. */
  setOptimizerMoments(step: number): void {
    this.sync('setOptimizerMoments', (h) => {
      h.uploadMomentShard('exp_avg');
      h.uploadMomentShard('exp_avg_sq');
      h.setStep(step);
    });
  }

  /**
   * The addon's handle for another part of the addon that works on this model's memory in place (the NCCL
   * collectives over its blocks); only while no call is running on it.
   */
  nativeHandle(op: string): NativeModelHandle {
    return this.sync(op, (h) => h);
  }

  /** Scales gradients to a global norm of at most maxNorm; returns the norm before clipping. */
  clipGradNorm(maxNorm: number): number {
    return this.sync('clipGradNorm', (h) => h.clipGradNorm(maxNorm));
  }

  adamwStep(options: AdamWOptions): Promise<void> {
    return this.queue('adamwStep', (h) => h.adamwStep(options));
  }

  save(weightsPath: string): Promise<void> {
    return this.queue('save', async () => {
      await writeSafetensors(weightsPath, this.parameters(), { format: 'pt' });
    });
  }

  /**
   * dir/model.safetensors (HF names), dir/config.json, dir/optimizer.safetensors: tensors `exp_avg.<name>` and
   * `exp_avg_sq.<name>`, metadata { format: 'rlstream-adamw', step } (unless options.optimizer is false).
   */
  saveCheckpoint(dir: string, options: { optimizerDtype?: 'F32' | 'BF16'; optimizer?: boolean } = {}): Promise<void> {
    // BF16 optimizer moments halve a shippable checkpoint (bf16 keeps float32's range, so exp_avg_sq never
    // underflows); resumable training checkpoints keep F32 so a resume is bit-identical.
    return this.queue('saveCheckpoint', async (h) => {
      mkdirSync(dir, { recursive: true });
      // With adapters: the adapters alone (the base is the run's frozen weights, named in lora.json)
      if (this.lora) await writeSafetensors(join(dir, 'adapter.safetensors'), this.adapter(), loraMetadata(this.lora));
      else await writeSafetensors(join(dir, 'model.safetensors'), this.parameters(), { format: 'pt' });
      // optimizer: false leaves the optimizer state to the caller: a data-parallel run's ranks each write their shard
      // (native/optimizer-state.ts).
      if (options.optimizer ?? true) {
        const { expAvg, expAvgSq } = this.optimizerState();
        const opt: [string, TensorView][] = [];
        for (const [n, t] of expAvg) opt.push([`exp_avg.${n}`, t]);
        for (const [n, t] of expAvgSq) opt.push([`exp_avg_sq.${n}`, t]);
        await writeSafetensors(join(dir, OPTIMIZER_FILE), opt, { format: 'rlstream-adamw', step: String(h.getStep()) }, options.optimizerDtype ?? 'F32');
      }
      const tmp = join(dir, `config.json.tmp-${process.pid}`);
      writeFileSync(tmp, JSON.stringify(hfConfigJson(this.config), null, 2));
      renameSync(tmp, join(dir, 'config.json'));
    });
  }

  /**
   * A checkpoint of a model with adapters holds them alone (adapter.safetensors, its optimizer state and
   * config.json); `base` is the weights they sit on. Without adapters, as loadCheckpoint. The optimizer state is
   * optimizer.safetensors, or the shards of a data-parallel run's ranks (native/optimizer-state.ts). `optimizer:
   * false` loads the weights alone: a data-parallel rank cuts its optimizer shard first, then loads its moments
   * (loadOptimizerState), so no process ever holds every moment.
   */
  static async loadCheckpoint(dir: string, options: LoadOptions & { base?: string; optimizer?: boolean } = {}): Promise<Model> {
    let json: unknown;
    try {
      json = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
    } catch (err) {
      throw new RlstreamError('WEIGHTS_FORMAT', `${join(dir, 'config.json')}: ${(err as Error).message}`, { cause: err });
    }
    const adapterFile = join(dir, 'adapter.safetensors');
    let lora: Required<LoraOptions> | undefined;
    if (existsSync(adapterFile)) {
      const w = openWeights(adapterFile);
      try {
        lora = loraFromMetadata(w.metadata, adapterFile);
      } finally {
        w.close();
      }
      if (!options.base) throw new RlstreamError('WEIGHTS_FORMAT', `${dir}: a checkpoint of adapters; loadCheckpoint needs options.base, the weights they were trained on`);
    }
    const model = lora
      ? Model.load(options.base!, parseModelConfig(json), { ...options, lora: { ...lora, seed: options.lora?.seed ?? 0 } })
      : Model.load(join(dir, 'model.safetensors'), parseModelConfig(json), options);
    try {
      if (lora) await model.loadAdapter(adapterFile);
      if (options.optimizer ?? true) loadOptimizerState(model, dir);
    } catch (err) {
      model.dispose();
      throw err;
    }
    return model;
  }

  /** Frees native memory now (views from parameters() stay valid). Throws while a call is pending. */
  dispose(): void {
    if (!this.handle) return;
    if (this.pending > 0) invalid(`model.dispose: ${this.pendingOp} is still running on this model; await it first`);
    const h = this.handle;
    this.handle = null;
    call(() => h.dispose());
  }
}

function views(ts: NativeTensor[]): Map<string, TensorView> {
  const m = new Map<string, TensorView>();
  for (const t of ts) m.set(t.name, { shape: t.shape, data: t.data });
  return m;
}

/**
 * Fills `target` from weights (a safetensors file, or a model directory with its shards): every tensor must be there
 * with its shape; returns the metadata.
 */
function readInto(path: string, target: Map<string, TensorView>, what: string, optionalExtra: Set<string>): Record<string, string> {
  const w = openWeights(path);
  try {
    const tensors = w.tensors;
    // Every name and shape is checked before any tensor is read, so a wrong file leaves the target untouched.
    for (const [name, view] of target) {
      const e = tensors.get(name)?.entry;
      if (!e) throw new RlstreamError('WEIGHTS_FORMAT', `${path}: ${what} tensor ${name} is missing`);
      if (e.shape.length !== view.shape.length || e.shape.some((d, i) => d !== view.shape[i]))
        throw new RlstreamError('WEIGHTS_FORMAT', `${path}: tensor ${name} has shape [${e.shape.join(', ')}], the config gives [${view.shape.join(', ')}]`);
    }
    for (const name of tensors.keys())
      if (!target.has(name) && !optionalExtra.has(name) && !IGNORED_TENSOR.test(name))
        throw new RlstreamError('WEIGHTS_FORMAT', `${path}: unexpected tensor ${name} for this config`);
    for (const [name, view] of target) w.read(name, view.data);
    for (const [name, view] of target)
      for (let i = 0; i < view.data.length; i++)
        if (!Number.isFinite(view.data[i])) throw new RlstreamError('NATIVE_NON_FINITE', `${path}: tensor ${name}[${i}] is not finite`);
    return w.metadata;
  } finally {
    w.close();
  }
}
