// Model configuration (the Hugging Face config.json fields of the Llama / Qwen2 / Qwen3 / Mistral family) and its
// validation.
#pragma once
#include <cstdint>
#include <vector>

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
  int head_dim_set = 0;         // HF head_dim where config.json names one (Qwen3: 128 at any width); 0: H / NH
  bool qk_norm = false;         // Qwen3: RMSNorm of each head of q and k (q_norm, k_norm [head_dim]) before rotary
  int sliding_window = 0;       // Mistral: a sequence may not be longer (attention within it is then exact); 0: none
  // rotary scaling: 0 none, 1 Llama 3's (rope_scaling.rope_type "llama3"), with its four parameters
  int rope_scaling = 0;
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int rope_original_max_position_embeddings = 0;

  int head_dim() const { return head_dim_set > 0 ? head_dim_set : hidden_size / num_attention_heads; }
  // The longest sequence (positions per slot) the model runs exactly: max_position_embeddings, bounded by the
  // sliding window where there is one.
  int max_sequence() const {
    return sliding_window > 0 && sliding_window < max_position_embeddings ? sliding_window : max_position_embeddings;
  }
  // Rotary inverse frequencies [head_dim / 2], rounded to float32 step by step as transformers computes them
  // (default and llama3 rope types).
  std::vector<float> rope_inv_freq() const;
  int q_dim() const { return num_attention_heads * head_dim(); }
  int kv_dim() const { return num_key_value_heads * head_dim(); }
};

// Throws NativeError(InvalidArgument) naming the first field that does not add up.
void validate_config(const ModelConfig& c);

}  // namespace rls
