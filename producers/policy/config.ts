// The decoder-only Llama/Qwen2 model configuration, read from an HF config.json and validated once, plus the
// HF tensor names and shapes the built-in policy expects.
import { RlstreamError } from '../../core/errors.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';

export interface ModelConfig {
  readonly hiddenSize: number;
  readonly numLayers: number;
  readonly numHeads: number;
  readonly numKvHeads: number;
  readonly headDim: number;
  readonly intermediateSize: number;
  readonly vocabSize: number;
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  readonly tieWordEmbeddings: boolean;
  readonly maxPositions: number;
  readonly attentionBias: boolean;
}

function int(obj: Record<string, unknown>, key: string, fallback?: number): number {
  const v = obj[key] ?? fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) throw new RlstreamError('CONFIG_INVALID', `config.json: ${key} must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

function num(obj: Record<string, unknown>, key: string, fallback: number): number {
  const v = obj[key] ?? fallback;
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw new RlstreamError('CONFIG_INVALID', `config.json: ${key} must be a positive number, got ${JSON.stringify(v)}`);
  return v;
}

/** Parse config.json text (or an already parsed object) into a frozen ModelConfig. */
export function parseModelConfig(json: string | Record<string, unknown>): ModelConfig {
  let raw: unknown = json;
  if (typeof json === 'string') {
    try {
      raw = JSON.parse(json);
    } catch (err) {
      throw new RlstreamError('CONFIG_INVALID', 'config.json is not valid JSON', { cause: err });
    }
  }
  if (raw === null || typeof raw !== 'object') throw new RlstreamError('CONFIG_INVALID', 'config.json is not an object');
  const o = raw as Record<string, unknown>;
  const hiddenSize = int(o, 'hidden_size');
  const numHeads = int(o, 'num_attention_heads');
  const numKvHeads = int(o, 'num_key_value_heads', numHeads);
  const headDim = int(o, 'head_dim', hiddenSize / numHeads);
  if (numHeads % numKvHeads !== 0) throw new RlstreamError('CONFIG_INVALID', `config.json: num_attention_heads ${numHeads} is not a multiple of num_key_value_heads ${numKvHeads}`);
  if (headDim % 2 !== 0) throw new RlstreamError('CONFIG_INVALID', `config.json: head dimension ${headDim} must be even for rotary embeddings`);
  return Object.freeze({
    hiddenSize,
    numLayers: int(o, 'num_hidden_layers'),
    numHeads,
    numKvHeads,
    headDim,
    intermediateSize: int(o, 'intermediate_size'),
    vocabSize: int(o, 'vocab_size'),
    ropeTheta: num(o, 'rope_theta', 10000),
    rmsNormEps: num(o, 'rms_norm_eps', 1e-6),
    tieWordEmbeddings: o['tie_word_embeddings'] === true,
    maxPositions: int(o, 'max_position_embeddings', 2048),
    attentionBias: o['attention_bias'] === true,
  });
}

/** The config.json text for a ModelConfig (HF key names), e.g. for tests and benchmarks. */
export function configToJson(c: ModelConfig): string {
  return JSON.stringify({
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_size: c.hiddenSize,
    num_hidden_layers: c.numLayers,
    num_attention_heads: c.numHeads,
    num_key_value_heads: c.numKvHeads,
    head_dim: c.headDim,
    intermediate_size: c.intermediateSize,
    vocab_size: c.vocabSize,
    rope_theta: c.ropeTheta,
    rms_norm_eps: c.rmsNormEps,
    tie_word_embeddings: c.tieWordEmbeddings,
    max_position_embeddings: c.maxPositions,
    attention_bias: c.attentionBias,
  });
}

/** Every tensor the model needs, HF name → shape. */
export function expectedTensors(c: ModelConfig): Map<string, number[]> {
  const E = c.hiddenSize;
  const q = c.numHeads * c.headDim;
  const kv = c.numKvHeads * c.headDim;
  const m = new Map<string, number[]>();
  m.set('model.embed_tokens.weight', [c.vocabSize, E]);
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`;
    m.set(p + 'input_layernorm.weight', [E]);
    m.set(p + 'self_attn.q_proj.weight', [q, E]);
    m.set(p + 'self_attn.k_proj.weight', [kv, E]);
    m.set(p + 'self_attn.v_proj.weight', [kv, E]);
    m.set(p + 'self_attn.o_proj.weight', [E, q]);
    if (c.attentionBias) {
      m.set(p + 'self_attn.q_proj.bias', [q]);
      m.set(p + 'self_attn.k_proj.bias', [kv]);
      m.set(p + 'self_attn.v_proj.bias', [kv]);
    }
    m.set(p + 'post_attention_layernorm.weight', [E]);
    m.set(p + 'mlp.gate_proj.weight', [c.intermediateSize, E]);
    m.set(p + 'mlp.up_proj.weight', [c.intermediateSize, E]);
    m.set(p + 'mlp.down_proj.weight', [E, c.intermediateSize]);
  }
  m.set('model.norm.weight', [E]);
  if (!c.tieWordEmbeddings) m.set('lm_head.weight', [c.vocabSize, E]);
  return m;
}

/** Check that `weights` holds every tensor with the right shape; extra tensors are ignored. */
export function checkWeights(c: ModelConfig, weights: TensorMap): void {
  for (const [name, shape] of expectedTensors(c)) {
    const t = weights.get(name);
    if (!t) {
      // Tied checkpoints sometimes still carry lm_head; untied ones must have it.
      throw new RlstreamError('WEIGHTS_FORMAT', `weights lack tensor ${name}`);
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new RlstreamError('WEIGHTS_FORMAT', `tensor ${name} has shape ${JSON.stringify(t.shape)}, config needs ${JSON.stringify(shape)}`);
    }
  }
}

/** The lm_head matrix: its own tensor, or the embedding when tied. */
export function lmHead(c: ModelConfig, weights: TensorMap): Float32Array {
  const name = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
  return weights.get(name)!.data;
}
