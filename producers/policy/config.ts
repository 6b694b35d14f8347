// The built-in policy's model configuration (the checkpoint's config.json in the export's and engine's terms),
// plus the HF tensor names and shapes the built-in policy expects.
import { RlstreamError } from '../../core/errors.ts';
import { maxSequence, parseModelConfig, ropeInvFreq } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';

export interface PolicyModelConfig {
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
  /** Qwen3: per-head RMSNorm of q and k (q_norm, k_norm) before the rotation. */
  readonly qkNorm: boolean;
  /** Rotary inverse frequencies [headDim / 2] (rope scaling applied). */
  readonly ropeInvFreq: Float32Array;
}

/**
 * The built-in policy's view of a checkpoint's config.json: parsed and validated by the one model-config parser
 * (core/weights/model-config.ts, which the trainer uses too), in the names the ONNX export and the engine use.
 */
export function policyConfig(json: unknown): PolicyModelConfig {
  const c = parseModelConfig(json);
  return Object.freeze({
    hiddenSize: c.hidden_size,
    numLayers: c.num_hidden_layers,
    numHeads: c.num_attention_heads,
    numKvHeads: c.num_key_value_heads,
    headDim: c.head_dim,
    intermediateSize: c.intermediate_size,
    vocabSize: c.vocab_size,
    ropeTheta: c.rope_theta,
    rmsNormEps: c.rms_norm_eps,
    tieWordEmbeddings: c.tie_word_embeddings,
    maxPositions: maxSequence(c),
    attentionBias: c.attention_bias,
    qkNorm: c.model_type === 'qwen3',
    ropeInvFreq: ropeInvFreq(c),
  });
}

/** The config.json text for a PolicyModelConfig (HF key names), e.g. for tests and benchmarks. */
export function configToJson(c: PolicyModelConfig): string {
  return JSON.stringify({
    architectures: [c.qkNorm ? 'Qwen3ForCausalLM' : c.attentionBias ? 'Qwen2ForCausalLM' : 'LlamaForCausalLM'],
    model_type: c.qkNorm ? 'qwen3' : c.attentionBias ? 'qwen2' : 'llama',
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
export function expectedTensors(c: PolicyModelConfig): Map<string, number[]> {
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
    if (c.qkNorm) {
      m.set(p + 'self_attn.q_norm.weight', [c.headDim]);
      m.set(p + 'self_attn.k_norm.weight', [c.headDim]);
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
export function checkWeights(c: PolicyModelConfig, weights: TensorMap): void {
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
export function lmHead(c: PolicyModelConfig, weights: TensorMap): Float32Array {
  const name = c.tieWordEmbeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
  return weights.get(name)!.data;
}
