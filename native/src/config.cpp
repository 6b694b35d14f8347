// Validation of ModelConfig: every rule that the shapes of the model depend on, with the field named.
#include "config.h"

#include <cmath>
#include <string>

#include "errors.h"

namespace rls {

static void positive(const char* name, long v, long max = 1L << 30) {
  if (v <= 0) invalid(std::string("config.") + name + " must be a positive integer, got " + std::to_string(v));
  if (v > max) invalid(std::string("config.") + name + " is too large: " + std::to_string(v));
}

void validate_config(const ModelConfig& c) {
  positive("hidden_size", c.hidden_size, 1 << 16);
  positive("num_hidden_layers", c.num_hidden_layers, 1024);
  positive("num_attention_heads", c.num_attention_heads, 1024);
  positive("num_key_value_heads", c.num_key_value_heads, 1024);
  positive("intermediate_size", c.intermediate_size, 1 << 18);
  positive("vocab_size", c.vocab_size, 1 << 24);
  positive("max_position_embeddings", c.max_position_embeddings, 1 << 24);
  if (c.head_dim_set < 0 || c.head_dim_set > 1024) invalid("config.head_dim must be in [1, 1024], got " + std::to_string(c.head_dim_set));
  if (c.head_dim_set == 0 && c.hidden_size % c.num_attention_heads != 0)
    invalid("config.hidden_size (" + std::to_string(c.hidden_size) + ") is not divisible by config.num_attention_heads (" +
            std::to_string(c.num_attention_heads) + ")");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    invalid("config.num_attention_heads (" + std::to_string(c.num_attention_heads) +
            ") is not divisible by config.num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim() % 2 != 0)
    invalid("head dimension " + std::to_string(c.head_dim()) + " must be even for rotary embeddings");
  if (c.sliding_window < 0) invalid("config.sliding_window must be >= 0, got " + std::to_string(c.sliding_window));
  if (c.qk_norm && c.attention_bias)
    invalid("config: q/k norms with q/k/v biases (qk_norm with attention_bias) are not supported");
  if (c.rope_scaling != 0 && c.rope_scaling != 1)
    invalid("config.rope_scaling: unknown kind " + std::to_string(c.rope_scaling));
  if (c.rope_scaling == 1) {
    if (!std::isfinite(c.rope_factor) || c.rope_factor <= 0)
      invalid("config.rope_scaling.factor must be a finite number > 0, got " + std::to_string(c.rope_factor));
    if (!std::isfinite(c.rope_low_freq_factor) || !std::isfinite(c.rope_high_freq_factor) ||
        c.rope_low_freq_factor <= 0 || c.rope_high_freq_factor <= c.rope_low_freq_factor)
      invalid("config.rope_scaling: need 0 < low_freq_factor < high_freq_factor, got " +
              std::to_string(c.rope_low_freq_factor) + " and " + std::to_string(c.rope_high_freq_factor));
    positive("rope_scaling.original_max_position_embeddings", c.rope_original_max_position_embeddings, 1 << 24);
  }
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 1.0)
    invalid("config.rope_theta must be a finite number > 1, got " + std::to_string(c.rope_theta));
  if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0.0 || c.rms_norm_eps >= 1.0)
    invalid("config.rms_norm_eps must be in (0, 1), got " + std::to_string(c.rms_norm_eps));
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int hd = head_dim(), half = hd / 2;
  std::vector<float> inv((size_t)half);
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in float32
  for (int i = 0; i < half; i++) inv[i] = 1.0f / (float)std::pow(rope_theta, (double)(float)((float)(2 * i) / (float)hd));
  if (rope_scaling == 1) {
    // transformers' _compute_llama3_parameters: long wavelengths divided by factor, short ones kept, the band
    // between interpolated (float32 tensors, Python scalars)
    const float factor = (float)rope_factor, lo = (float)rope_low_freq_factor, hi = (float)rope_high_freq_factor;
    const float old_len = (float)rope_original_max_position_embeddings;
    const double low_wavelen = (double)rope_original_max_position_embeddings / rope_low_freq_factor;
    const double high_wavelen = (double)rope_original_max_position_embeddings / rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
      const float f = inv[i];
      const float wavelen = (float)(2.0 * 3.141592653589793) / f;
      float g = (double)wavelen > low_wavelen ? f / factor : f;
      const bool medium = !((double)wavelen < high_wavelen) && !((double)wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_len / wavelen - lo) / (hi - lo);
        g = (1.0f - smooth) * g / factor + smooth * g;
      }
      inv[i] = g;
    }
  }
  return inv;
}

}  // namespace rls
