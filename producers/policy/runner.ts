// One loaded policy version: the exported ONNX graph in an onnxruntime-node session. `run` feeds token ids,
// positions, the two additive attention biases and the cached K/V (views of buffers the caller owns) and
// returns the next-token probabilities at each row's temperature (log-probs in mode 'all') and the new tokens'
// K/V only, fetching nothing else; `step` is the simpler concat-style call (past in, present out, log-probs)
// for scoring, prefill from scratch and tests.
import * as ort from 'onnxruntime-node';
import { RlstreamError } from '../../core/errors.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';
import { exportOnnx, NEW_KV_COLUMN, newKeyName, newValueName, pastKeyName, pastValueName, type OutputMode } from './export.ts';

export interface RunnerOptions {
  /**
   * onnxruntime intra-op threads (default 1). A second thread speeds up large batches (their matrix products
   * split well) and leaves one-sequence steps about as they were.
   */
  threads?: number;
  mode?: Exclude<OutputMode, 'decode'>;
  /**
   * Also load the one-token decode graph that `decode` runs (default: true in mode 'last'). It is a second
   * onnxruntime session, so the weights are held twice in memory.
   */
  decodeGraph?: boolean;
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

/** Like StepInput, with the bias split into the part over the cache and the part over the new tokens. */
export interface RunInput {
  batch: number;
  seq: number;
  inputIds: BigInt64Array; // [batch, seq]
  positionIds: BigInt64Array; // [batch, seq]
  pastBias: Float32Array; // [batch, 1, seq, past.len]
  newBias: Float32Array; // [batch, 1, seq, seq]
  /** [batch, kvHeads, past.len, headDim] per layer; the arrays may be longer (only the prefix is read). */
  past: KvTensors;
  /** [batch] 1 / temperature per row for `probs` (modes 'last' and decode; default 1). */
  invTemperature?: Float32Array;
  /** Mode 'last': fetch log_softmax(logits) instead of probs. */
  logprobs?: boolean;
}

export interface RunOutput {
  /**
   * Modes 'last' and decode: [batch, vocab], softmax(logits / T) per row (T from `invTemperature`). Null in
   * mode 'all'.
   */
  probs: Float32Array | null;
  /** Mode 'all': [batch, seq, vocab] log_softmax(logits); mode 'last' when asked for (`logprobs: true`). */
  logprobs: Float32Array | null;
  /** The new tokens' K/V: len = seq, [batch, kvHeads, seq, headDim] per layer. */
  fresh: KvTensors;
}

export interface DecodeOutput {
  /** [batch, vocab] softmax(logits / T) per row. */
  probs: Float32Array;
  /** The new token's K/V of every row and layer: [batch, layers, 2 (K, V), kvHeads, headDim]. */
  column: Float32Array;
}

export interface StepOutput {
  /** [batch, vocab] ('last') or [batch, seq, vocab] ('all'). */
  logprobs: Float32Array;
  present: KvTensors;
}

export class PolicyRunner {
  private released = false;

  private constructor(
    readonly config: ParsedModelConfig,
    readonly version: number,
    private readonly session: ort.InferenceSession,
    private readonly decodeSession: ort.InferenceSession | null,
    readonly exportMs: number,
    readonly loadMs: number,
  ) {}

  static async create(config: ParsedModelConfig, weights: TensorMap, version: number, options: RunnerOptions = {}): Promise<PolicyRunner> {
    const mode = options.mode ?? 'last';
    const t0 = performance.now();
    const bytes = exportOnnx(config, weights, mode);
    const decodeBytes = (options.decodeGraph ?? mode === 'last') ? exportOnnx(config, weights, 'decode') : null;
    const t1 = performance.now();
    const sessionOptions: ort.InferenceSession.SessionOptions = {
      executionProviders: ['cpu'],
      graphOptimizationLevel: 'all',
      intraOpNumThreads: options.threads ?? 1,
      interOpNumThreads: 1,
      executionMode: 'sequential',
      logSeverityLevel: 3, // errors reach the caller as exceptions; keep onnxruntime's own log quiet
      // Idle intra-op workers sleep instead of spinning: between steps the engine's own JavaScript runs, and on
      // a shared machine a spinning worker takes a core another process (or the next step) needs, so that with
      // spinning a second thread can cost more than it brings on a busy machine with few cores.
      extra: { session: { intra_op: { allow_spinning: '0' } } },
    };
    let session: ort.InferenceSession;
    let decodeSession: ort.InferenceSession | null = null;
    try {
      session = await ort.InferenceSession.create(bytes, sessionOptions);
      if (decodeBytes) decodeSession = await ort.InferenceSession.create(decodeBytes, sessionOptions);
    } catch (err) {
      throw new RlstreamError('INTERNAL', `onnxruntime could not load the exported policy v${version}`, { cause: err });
    }
    return new PolicyRunner(config, version, session, decodeSession, t1 - t0, performance.now() - t1);
  }

  /**
   * One new token per row on top of the cache (each token also attends to itself): the decode step. Runs the
   * dedicated one-token graph when loaded, else the general one.
   */
  async decode(input: Omit<RunInput, 'seq' | 'newBias' | 'logprobs'>): Promise<DecodeOutput> {
    if (!this.decodeSession) {
      const out = await this.run({ ...input, seq: 1, newBias: new Float32Array(input.batch) });
      return { probs: out.probs!, column: packColumn(this.config, input.batch, out.fresh) };
    }
    const { rows, out } = await this.exec(this.decodeSession, { ...input, seq: 1 });
    return { probs: rows, column: out[NEW_KV_COLUMN]!.data as Float32Array };
  }

  async run(input: RunInput): Promise<RunOutput> {
    const c = this.config;
    const { rows, out, kind } = await this.exec(this.session, input);
    const layers = Array.from({ length: c.num_hidden_layers }, (_, l) => l);
    const fresh = { len: input.seq, keys: layers.map((l) => out[newKeyName(l)]!.data as Float32Array), values: layers.map((l) => out[newValueName(l)]!.data as Float32Array) };
    return { probs: kind === 'probs' ? rows : null, logprobs: kind === 'logprobs' ? rows : null, fresh };
  }

  /** Feed the inputs and fetch the per-row distribution and the new K/V (in whichever form the graph has). */
  private async exec(session: ort.InferenceSession, input: Omit<RunInput, 'newBias'> & { newBias?: Float32Array }): Promise<{ rows: Float32Array; kind: 'probs' | 'logprobs'; out: ort.InferenceSession.ReturnType }> {
    const c = this.config;
    const { batch, seq } = input;
    const P = input.past.len;
    const kvSize = batch * c.num_key_value_heads * P * c.head_dim;
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor('int64', input.inputIds, [batch, seq]),
      position_ids: new ort.Tensor('int64', input.positionIds, [batch, seq]),
      past_bias: new ort.Tensor('float32', prefix(input.pastBias, batch * seq * P), [batch, 1, seq, P]),
    };
    if (input.newBias) feeds['new_bias'] = new ort.Tensor('float32', input.newBias, [batch, 1, seq, seq]);
    const kvDims = [batch, c.num_key_value_heads, P, c.head_dim];
    // The decode graph returns every layer's new K/V as one output: each fetched output costs onnxruntime-node
    // a tensor wrap (two per layer took ~13% of a one-sequence decode step).
    const packed = session.outputNames.includes(NEW_KV_COLUMN);
    const fetches: string[] = packed ? [NEW_KV_COLUMN] : [];
    for (let l = 0; l < c.num_hidden_layers; l++) {
      feeds[pastKeyName(l)] = new ort.Tensor('float32', prefix(input.past.keys[l]!, kvSize), kvDims);
      feeds[pastValueName(l)] = new ort.Tensor('float32', prefix(input.past.values[l]!, kvSize), kvDims);
      if (!packed) fetches.push(newKeyName(l), newValueName(l));
    }
    if (session.inputNames.includes('inv_temperature')) {
      feeds['inv_temperature'] = new ort.Tensor('float32', input.invTemperature ? prefix(input.invTemperature, batch) : new Float32Array(batch).fill(1), [batch, 1]);
    }
    const rows = session.outputNames.includes('probs') && !input.logprobs ? 'probs' : 'logprobs';
    fetches.push(rows);
    const out = await session.run(feeds, fetches);
    return { rows: out[rows]!.data as Float32Array, kind: rows, out };
  }

  /** One forward with a [batch, 1, seq, past + seq] bias, returning the whole cache (past then new) as `present`. */
  async step(input: StepInput): Promise<StepOutput> {
    const c = this.config;
    const { batch, seq } = input;
    const P = input.past.len;
    const T = P + seq;
    const pastBias = new Float32Array(batch * seq * P);
    const newBias = new Float32Array(batch * seq * seq);
    for (let r = 0; r < batch * seq; r++) {
      pastBias.set(input.bias.subarray(r * T, r * T + P), r * P);
      newBias.set(input.bias.subarray(r * T + P, (r + 1) * T), r * seq);
    }
    const out = await this.run({ batch, seq, inputIds: input.inputIds, positionIds: input.positionIds, pastBias, newBias, past: input.past, logprobs: true });
    const rows = batch * c.num_key_value_heads;
    const D = c.head_dim;
    const cat = (past: Float32Array, fresh: Float32Array): Float32Array => {
      const all = new Float32Array(rows * T * D);
      for (let r = 0; r < rows; r++) {
        all.set(past.subarray(r * P * D, (r + 1) * P * D), r * T * D);
        all.set(fresh.subarray(r * seq * D, (r + 1) * seq * D), (r * T + P) * D);
      }
      return all;
    };
    const keys = out.fresh.keys.map((k, l) => cat(input.past.keys[l]!, k));
    const values = out.fresh.values.map((v, l) => cat(input.past.values[l]!, v));
    return { logprobs: out.logprobs!, present: { len: T, keys, values } };
  }

  /**
   * Whether the sessions still run: one token on an empty cache through each graph. The engine asks after a
   * failed step, to tell a bad batch (later requests can still be served) from a dead session (fail them all).
   */
  async healthy(): Promise<boolean> {
    const c = this.config;
    const input = { batch: 1, inputIds: BigInt64Array.of(0n), positionIds: BigInt64Array.of(0n), pastBias: new Float32Array(0), past: emptyKv(c) };
    try {
      await this.run({ ...input, seq: 1, newBias: new Float32Array(1) });
      if (this.decodeSession) await this.decode(input);
      return true;
    } catch {
      return false;
    }
  }

  /** Free the onnxruntime sessions; a second call does nothing. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    await this.session.release();
    await this.decodeSession?.release();
  }
}

/** An empty cache for `batch` rows. */
export function emptyKv(c: ParsedModelConfig): KvTensors {
  return { len: 0, keys: Array.from({ length: c.num_hidden_layers }, () => new Float32Array(0)), values: Array.from({ length: c.num_hidden_layers }, () => new Float32Array(0)) };
}

/** One new token's K/V per row ([batch, kvHeads, 1, headDim] per layer) in the decode graph's packed layout. */
function packColumn(c: ParsedModelConfig, batch: number, fresh: KvTensors): Float32Array {
  const row = c.num_key_value_heads * c.head_dim;
  const column = new Float32Array(batch * c.num_hidden_layers * 2 * row);
  for (let b = 0; b < batch; b++) {
    for (let l = 0; l < c.num_hidden_layers; l++) {
      const dst = (b * c.num_hidden_layers + l) * 2 * row;
      column.set(fresh.keys[l]!.subarray(b * row, (b + 1) * row), dst);
      column.set(fresh.values[l]!.subarray(b * row, (b + 1) * row), dst + row);
    }
  }
  return column;
}

function prefix(a: Float32Array, n: number): Float32Array {
  return a.length === n ? a : a.subarray(0, n);
}
