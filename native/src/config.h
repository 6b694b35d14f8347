// Model configuration (the Hugging Face config.json fields of the Llama / Qwen2 family) and its validation.
#pragma once
#include <cstdint>

namespace rls {

struct ModelConfig {
  int hidden_size = 0;          // H
  int num_hidden_layers = 0;    // L
  int num_attention_heads = 0;  // NH
  int num_key_value_heads = 0;  // NKV (grouped-query attention: NH % NKV == 0)
  int intermediate_size = 0;    // I (SwiGLU width)
  int vocab_size = 0;           // V
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;
  bool attention_bias = false;  // Qwen2: q/k/v projections carry a bias

  int head_dim() const { return hidden_size / num_attention_heads; }
  int q_dim() const { return num_attention_heads * head_dim(); }
  int kv_dim() const { return num_key_value_heads * head_dim(); }
};

// Throws NativeError(InvalidArgument) naming the first field that does not add up.
void validate_config(const ModelConfig& c);

}  // namespace rls
