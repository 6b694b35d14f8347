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
  if (c.hidden_size % c.num_attention_heads != 0)
    invalid("config.hidden_size (" + std::to_string(c.hidden_size) + ") is not divisible by config.num_attention_heads (" +
            std::to_string(c.num_attention_heads) + ")");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    invalid("config.num_attention_heads (" + std::to_string(c.num_attention_heads) +
            ") is not divisible by config.num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim() % 2 != 0)
    invalid("head dimension hidden_size/num_attention_heads = " + std::to_string(c.head_dim()) +
            " must be even for rotary embeddings");
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 1.0)
    invalid("config.rope_theta must be a finite number > 1, got " + std::to_string(c.rope_theta));
  if (!std::isfinite(c.rms_norm_eps) || c.rms_norm_eps <= 0.0 || c.rms_norm_eps >= 1.0)
    invalid("config.rms_norm_eps must be in (0, 1), got " + std::to_string(c.rms_norm_eps));
}

}  // namespace rls
