// The decoder-only Llama / Qwen2 model configuration, read from a checkpoint's Hugging Face config.json: the one
// parser, used by the native trainer and the built-in policy alike, so both accept exactly the same checkpoints.
// Keys keep their HF names (the native addon receives this object as it is). Extra keys of HF configs are
// ignored; anything the model cannot run as described (rope scaling, sliding windows, another activation, a
// head_dim other than hidden_size / num_attention_heads) is refused here, naming the field.
import { RlstreamError } from '../errors.ts';

export interface ModelConfig {
  hidden_size: number;
  num_hidden_layers: number;
  num_attention_heads: number;
  num_key_value_heads: number;
  intermediate_size: number;
  vocab_size: number;
  rope_theta: number;
  rms_norm_eps: number;
  tie_word_embeddings: boolean;
  max_position_embeddings: number;
  /** Qwen2: q/k/v projections carry a bias. Default false (true for Qwen2 configs, which omit the key). */
  attention_bias?: boolean;
}

function invalid(message: string): never {
  throw new RlstreamError('CONFIG_INVALID', `model config: ${message}`);
}

/** Validates config.json (its text or the parsed object) into a frozen ModelConfig; messages name the field. */
export function parseModelConfig(json: unknown): Readonly<Required<ModelConfig>> {
  if (typeof json === 'string') {
    try {
      json = JSON.parse(json);
    } catch (err) {
      throw new RlstreamError('CONFIG_INVALID', 'model config: config.json is not valid JSON', { cause: err });
    }
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) invalid('must be a JSON object');
  const o = json as Record<string, unknown>;
  const int = (k: string, dflt?: number): number => {
    const v = o[k] ?? dflt;
    if (v === undefined) invalid(`${k} is missing`);
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) invalid(`${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const num = (k: string, dflt: number): number => {
    const v = o[k] ?? dflt;
    if (typeof v !== 'number' || !Number.isFinite(v)) invalid(`${k} must be a finite number, got ${JSON.stringify(v)}`);
    return v;
  };
  const bool = (k: string, dflt: boolean): boolean => {
    const v = o[k] ?? dflt;
    if (typeof v !== 'boolean') invalid(`${k} must be a boolean, got ${JSON.stringify(v)}`);
    return v;
  };
  const hidden = int('hidden_size');
  const heads = int('num_attention_heads');
  const cfg: Required<ModelConfig> = {
    hidden_size: hidden,
    num_hidden_layers: int('num_hidden_layers'),
    num_attention_heads: heads,
    num_key_value_heads: int('num_key_value_heads', heads),
    intermediate_size: int('intermediate_size'),
    vocab_size: int('vocab_size'),
    rope_theta: num('rope_theta', 10000),
    rms_norm_eps: num('rms_norm_eps', 1e-6),
    tie_word_embeddings: bool('tie_word_embeddings', false),
    max_position_embeddings: int('max_position_embeddings'),
    // Qwen2 checkpoints always carry q/k/v biases and their config.json has no attention_bias key.
    attention_bias: bool('attention_bias', o['model_type'] === 'qwen2' || (Array.isArray(o['architectures']) && o['architectures'].includes('Qwen2ForCausalLM'))),
  };
  if (hidden % heads !== 0) invalid(`hidden_size (${hidden}) is not divisible by num_attention_heads (${heads})`);
  if (heads % cfg.num_key_value_heads !== 0) invalid(`num_attention_heads (${heads}) is not divisible by num_key_value_heads (${cfg.num_key_value_heads})`);
  if ((hidden / heads) % 2 !== 0) invalid(`head dimension hidden_size/num_attention_heads = ${hidden / heads} must be even (rotary embeddings)`);
  if (o['head_dim'] !== undefined && o['head_dim'] !== null && o['head_dim'] !== hidden / heads)
    invalid(`head_dim (${JSON.stringify(o['head_dim'])}) != hidden_size/num_attention_heads (${hidden / heads}) is not supported`);
  if (cfg.rope_theta <= 1) invalid(`rope_theta must be > 1, got ${cfg.rope_theta}`);
  if (cfg.rms_norm_eps <= 0 || cfg.rms_norm_eps >= 1) invalid(`rms_norm_eps must be in (0, 1), got ${cfg.rms_norm_eps}`);
  if (o['rope_scaling'] !== undefined && o['rope_scaling'] !== null) invalid('rope_scaling is not supported');
  if (o['hidden_act'] !== undefined && o['hidden_act'] !== 'silu') invalid(`hidden_act must be "silu", got ${JSON.stringify(o['hidden_act'])}`);
  if (o['use_sliding_window'] === true) invalid('use_sliding_window is not supported');
  return Object.freeze(cfg);
}
