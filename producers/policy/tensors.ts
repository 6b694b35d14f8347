// The HF tensor names and shapes the built-in policy expects of a checkpoint, by its parsed model config (the one
// parser, core/weights/model-config.ts, which the trainer and the native core read too).
import { RlstreamError } from '../../core/errors.ts';
import type { ParsedModelConfig } from '../../core/weights/model-config.ts';
import type { TensorMap } from '../../core/weights/safetensors.ts';

/** Every tensor the model needs, HF name → shape. */
export function expectedTensors(c: ParsedModelConfig): Map<string, number[]> {
  const E = c.hidden_size;
  const q = c.num_attention_heads * c.head_dim;
  const kv = c.num_key_value_heads * c.head_dim;
  const I = c.intermediate_size;
  const m = new Map<string, number[]>();
  m.set('model.embed_tokens.weight', [c.vocab_size, E]);
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `model.layers.${l}.`;
    m.set(p + 'input_layernorm.weight', [E]);
    m.set(p + 'self_attn.q_proj.weight', [q, E]);
    m.set(p + 'self_attn.k_proj.weight', [kv, E]);
    m.set(p + 'self_attn.v_proj.weight', [kv, E]);
    m.set(p + 'self_attn.o_proj.weight', [E, q]);
    if (c.attention_bias) {
      m.set(p + 'self_attn.q_proj.bias', [q]);
      m.set(p + 'self_attn.k_proj.bias', [kv]);
      m.set(p + 'self_attn.v_proj.bias', [kv]);
    }
    if (hasQkNorm(c)) {
      m.set(p + 'self_attn.q_norm.weight', [c.head_dim]);
      m.set(p + 'self_attn.k_norm.weight', [c.head_dim]);
    }
    m.set(p + 'post_attention_layernorm.weight', [E]);
    m.set(p + 'mlp.gate_proj.weight', [I, E]);
    m.set(p + 'mlp.up_proj.weight', [I, E]);
    m.set(p + 'mlp.down_proj.weight', [E, I]);
  }
  m.set('model.norm.weight', [E]);
  if (!c.tie_word_embeddings) m.set('lm_head.weight', [c.vocab_size, E]);
  return m;
}

/** Qwen3: a per-head RMSNorm of q and k (q_norm, k_norm) before the rotation. */
export function hasQkNorm(c: ParsedModelConfig): boolean {
  return c.model_type === 'qwen3';
}

/** Check that `weights` holds every tensor with the right shape; extra tensors are ignored. */
export function checkWeights(c: ParsedModelConfig, weights: TensorMap): void {
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
export function lmHead(c: ParsedModelConfig, weights: TensorMap): Float32Array {
  const name = c.tie_word_embeddings ? 'model.embed_tokens.weight' : 'lm_head.weight';
  return weights.get(name)!.data;
}
