// Model shapes the GPU and native benchmarks share (sizes from each model's config.json; random weights: speed does
// not depend on their values).
import type { ModelConfig } from '../native/model.ts';

/** SmolLM2-135M-Instruct's sizes (llama family, tied head). */
export const SMOLLM2_135M: ModelConfig = {
  hidden_size: 576,
  num_hidden_layers: 30,
  num_attention_heads: 9,
  num_key_value_heads: 3,
  intermediate_size: 1536,
  vocab_size: 49152,
  rope_theta: 100000,
  rms_norm_eps: 1e-5,
  tie_word_embeddings: true,
  max_position_embeddings: 8192,
  attention_bias: false,
};

/** The training benchmark's 500M shape (Qwen2.5-0.5B's sizes: test/gpu/driver.cpp). */
export const SHAPE_500M: ModelConfig = {
  hidden_size: 896,
  num_hidden_layers: 24,
  num_attention_heads: 14,
  num_key_value_heads: 2,
  intermediate_size: 4864,
  vocab_size: 151936,
  rope_theta: 1000000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: true,
  max_position_embeddings: 32768,
  attention_bias: true,
};

/** Qwen2.5-7B's sizes (its config.json): 28 layers, 28 query and 4 key heads of 128 dims, an untied head. */
export const SHAPE_7B: ModelConfig = {
  hidden_size: 3584,
  num_hidden_layers: 28,
  num_attention_heads: 28,
  num_key_value_heads: 4,
  intermediate_size: 18944,
  vocab_size: 152064,
  rope_theta: 1000000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: false,
  max_position_embeddings: 32768,
  attention_bias: true,
};
