// The decoder-only model configuration of the families rlstream runs (Llama 3.x, Qwen2/2.5, Qwen3, Mistral), read
// from a checkpoint's Hugging Face config.json: the one parser, used by the native trainer, the generation engines
// and `config check` alike, so all accept exactly the same checkpoints. Keys keep their HF names (the native addon
// receives this object as it is). Every key of config.json is checked against an allow-list: the keys that shape
// the model are parsed (and a value the model cannot run as described is refused, naming the key), keys that do
// not change the arithmetic (token ids, dtypes, generation defaults, bookkeeping) are ignored, and any other key
// is refused, so a checkpoint whose config says something this parser does not understand never loads as if it
// did not.
import { RlstreamError } from '../errors.ts';

/** The families, by HF model_type, with the architecture class transformers builds for each. */
export const MODEL_FAMILIES = Object.freeze({ llama: 'LlamaForCausalLM', qwen2: 'Qwen2ForCausalLM', qwen3: 'Qwen3ForCausalLM', mistral: 'MistralForCausalLM' } as const);
export type ModelFamily = keyof typeof MODEL_FAMILIES;

/** Llama 3.1's rotary scaling (rope_scaling / rope_parameters with rope_type "llama3"), the one scaling supported. */
export interface RopeScaling {
  rope_type: 'llama3';
  factor: number;
  low_freq_factor: number;
  high_freq_factor: number;
  original_max_position_embeddings: number;
}

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
  /** Qwen2: q/k/v projections carry a bias (always, for qwen2; never for the others). */
  attention_bias?: boolean;
  /** The family (default llama). qwen3: a per-head RMSNorm of q and k (q_norm, k_norm) before the rotation. */
  model_type?: ModelFamily;
  /** Width of an attention head (default hidden_size / num_attention_heads; Qwen3 sets 128 at every width). */
  head_dim?: number;
  rope_scaling?: RopeScaling | null;
  /**
   * Mistral's sliding_window (Qwen's where use_sliding_window): attention sees at most this many tokens back. A
   * sequence no longer than it attends to everything before it, so the models run sequences up to this length
   * exactly and refuse longer ones (null: no window).
   */
  sliding_window?: number | null;
}

export type ParsedModelConfig = Readonly<Required<ModelConfig>>;

function invalid(message: string): never {
  throw new RlstreamError('CONFIG_INVALID', `model config: ${message}`);
}

// Keys that do not change the model's arithmetic: ignored. PretrainedConfig's own attributes, token ids, dtypes,
// and the generation defaults older configs carry (transformers pops those too).
const IGNORED = new Set([
  'architectures', 'transformers_version', 'torch_dtype', 'dtype', '_name_or_path', 'name_or_path', '_commit_hash',
  'bos_token_id', 'eos_token_id', 'pad_token_id', 'sep_token_id', 'decoder_start_token_id', 'use_cache',
  'initializer_range', 'output_attentions', 'output_hidden_states', 'return_dict', 'use_return_dict', 'id2label',
  'label2id', 'num_labels', 'problem_type', 'tokenizer_class', 'prefix', 'task_specific_params', 'finetuning_task',
  'torchscript', 'use_bfloat16', 'tf_legacy_loss', 'pruned_heads', 'chunk_size_feed_forward', 'is_encoder_decoder',
  'is_decoder', 'add_cross_attention', 'tie_encoder_decoder', 'cross_attention_hidden_size', '_attn_implementation',
  '_attn_implementation_autoset', 'attn_implementation', 'is_llama_config', 'output_router_logits',
  'max_length', 'min_length', 'do_sample', 'early_stopping', 'num_beams', 'num_beam_groups', 'diversity_penalty',
  'temperature', 'top_k', 'top_p', 'typical_p', 'repetition_penalty', 'length_penalty', 'no_repeat_ngram_size',
  'encoder_no_repeat_ngram_size', 'bad_words_ids', 'num_return_sequences', 'output_scores', 'return_dict_in_generate',
  'forced_bos_token_id', 'forced_eos_token_id', 'remove_invalid_values', 'exponential_decay_length_penalty',
  'suppress_tokens', 'begin_suppress_tokens', 'max_window_layers',
]);
// Keys parsed below (and keys whose one accepted value is the model rlstream runs).
const PARSED = new Set([
  'model_type', 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'intermediate_size',
  'vocab_size', 'rope_theta', 'rms_norm_eps', 'tie_word_embeddings', 'max_position_embeddings', 'attention_bias',
  'head_dim', 'rope_scaling', 'rope_parameters', 'sliding_window', 'use_sliding_window', 'layer_types', 'hidden_act',
  'attention_dropout', 'mlp_bias', 'pretraining_tp', 'partial_rotary_factor', 'use_mrope', 'rope_interleaved',
]);

function family(o: Record<string, unknown>): ModelFamily {
  const mt = o['model_type'];
  const arch = o['architectures'];
  if (arch !== undefined && arch !== null) {
    const known = Object.values(MODEL_FAMILIES) as string[];
    if (!Array.isArray(arch) || arch.length !== 1 || !known.includes(arch[0] as string))
      invalid(`architectures ${JSON.stringify(arch)} is not supported (one of ${known.join(', ')})`);
  }
  if (mt === undefined || mt === null) {
    // configs written before model_type was checked: the architecture names the family, else Llama
    const a = Array.isArray(arch) ? (arch[0] as string) : 'LlamaForCausalLM';
    return (Object.keys(MODEL_FAMILIES) as ModelFamily[]).find((f) => MODEL_FAMILIES[f] === a)!;
  }
  if (typeof mt !== 'string' || !Object.hasOwn(MODEL_FAMILIES, mt))
    invalid(`model_type ${JSON.stringify(mt)} is not supported (one of ${Object.keys(MODEL_FAMILIES).join(', ')})`);
  const f = mt as ModelFamily;
  if (Array.isArray(arch) && arch[0] !== MODEL_FAMILIES[f]) invalid(`architectures ${JSON.stringify(arch)} does not match model_type ${f} (${MODEL_FAMILIES[f]})`);
  return f;
}

/** Validates config.json (its text or the parsed object) into a frozen ModelConfig; messages name the key. */
export function parseModelConfig(json: unknown): ParsedModelConfig {
  if (typeof json === 'string') {
    try {
      json = JSON.parse(json);
    } catch (err) {
      throw new RlstreamError('CONFIG_INVALID', 'model config: config.json is not valid JSON', { cause: err });
    }
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) invalid('must be a JSON object');
  const o = json as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    if (k === 'quantization_config') invalid('quantization_config: quantized checkpoints are not supported (dequantize to bf16/f16/f32 safetensors first)');
    if (k === 'auto_map') invalid('auto_map: checkpoints with their own modeling code (trust_remote_code) are not supported');
    if (!IGNORED.has(k) && !PARSED.has(k)) invalid(`${k}: unknown key (not one of the keys rlstream reads or knows to be inert for llama, qwen2, qwen3 and mistral)`);
  }
  let fam = family(o);
  const int = (k: string, dflt?: number): number => {
    const v = o[k] ?? dflt;
    if (v === undefined) invalid(`${k} is missing`);
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) invalid(`${k} must be a positive integer, got ${JSON.stringify(v)}`);
    return v;
  };
  const num = (k: string, dflt: number, from: Record<string, unknown> = o, path = k): number => {
    const v = from[k] ?? dflt;
    if (typeof v !== 'number' || !Number.isFinite(v)) invalid(`${path} must be a finite number, got ${JSON.stringify(v)}`);
    return v;
  };
  const bool = (k: string, dflt: boolean): boolean => {
    const v = o[k] ?? dflt;
    if (typeof v !== 'boolean') invalid(`${k} must be a boolean, got ${JSON.stringify(v)}`);
    return v;
  };
  const only = (k: string, ok: (v: unknown) => boolean, what: string): void => {
    if (o[k] !== undefined && o[k] !== null && !ok(o[k])) invalid(`${k} ${JSON.stringify(o[k])} is not supported (${what})`);
  };
  only('hidden_act', (v) => v === 'silu', 'only "silu"');
  only('attention_dropout', (v) => v === 0, 'only 0: rlstream trains without dropout');
  only('mlp_bias', (v) => v === false, 'only false');
  only('pretraining_tp', (v) => v === 1, 'only 1');
  only('use_mrope', (v) => v === false, 'only false');
  only('rope_interleaved', (v) => v === false, 'only false: rotary on the two halves of a head, as transformers does');
  only('partial_rotary_factor', (v) => v === 1, 'only 1: rotary over the whole head');

  const hidden = int('hidden_size');
  const heads = int('num_attention_heads');
  const kvHeads = int('num_key_value_heads', heads);
  if (o['head_dim'] === undefined || o['head_dim'] === null) {
    if (hidden % heads !== 0) invalid(`hidden_size (${hidden}) is not divisible by num_attention_heads (${heads}); set head_dim`);
  }
  const headDim = int('head_dim', hidden / heads);
  if (headDim % 2 !== 0) invalid(`head_dim ${headDim} must be even (rotary embeddings)`);
  if (heads % kvHeads !== 0) invalid(`num_attention_heads (${heads}) is not divisible by num_key_value_heads (${kvHeads})`);

  // attention biases: qwen2 has them on q/k/v always; qwen3 puts attention_bias on q/k/v AND o (not supported);
  // mistral has none. rlstream wrote Qwen2-shaped models as model_type llama with attention_bias true before it
  // read model_type (examples/calculator's checkpoint): q/k/v biases and no o bias, so that is read as qwen2 (a
  // Llama that really has an o_proj bias is refused when its weights load: o_proj.bias is a tensor of no model here).
  let bias = false;
  if (fam === 'qwen2') {
    if (o['attention_bias'] === false) invalid('attention_bias: false is not how Qwen2 is built (q/k/v always carry a bias)');
    bias = true;
  } else if (bool('attention_bias', false)) {
    if (fam !== 'llama') invalid(`attention_bias: true is not supported for ${fam} (biases on q, k, v and o)`);
    fam = 'qwen2';
    bias = true;
  }

  // rotary: rope_scaling (transformers 4) or rope_parameters (transformers 5: rope_theta inside), type default or llama3
  const rp = (o['rope_scaling'] ?? o['rope_parameters'] ?? null) as unknown;
  const rpKey = o['rope_scaling'] !== undefined && o['rope_scaling'] !== null ? 'rope_scaling' : 'rope_parameters';
  let ropeTheta = num('rope_theta', 10000);
  let scaling: RopeScaling | null = null;
  for (const key of ['rope_scaling', 'rope_parameters']) {
    const v = o[key];
    if (v !== undefined && v !== null && (typeof v !== 'object' || Array.isArray(v))) invalid(`${key} must be an object or null`);
  }
  if (o['rope_parameters'] && typeof o['rope_parameters'] === 'object' && (o['rope_parameters'] as Record<string, unknown>)['rope_theta'] !== undefined)
    ropeTheta = num('rope_theta', 0, o['rope_parameters'] as Record<string, unknown>, 'rope_parameters.rope_theta');
  if (rp !== null) {
    const r = rp as Record<string, unknown>;
    const type = r['rope_type'] ?? r['type'] ?? 'default';
    const allowed = type === 'llama3' ? ['rope_type', 'type', 'rope_theta', 'factor', 'low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings'] : ['rope_type', 'type', 'rope_theta'];
    if (type !== 'default' && type !== 'llama3') invalid(`${rpKey}.rope_type ${JSON.stringify(type)} is not supported (default or llama3)`);
    for (const k of Object.keys(r)) {
      if (k === 'partial_rotary_factor' && r[k] === 1) continue;
      if (!allowed.includes(k)) invalid(`${rpKey}.${k} is not supported for rope_type ${String(type)}`);
    }
    if (type === 'llama3') {
      const p = (k: string) => num(k, NaN, r, `${rpKey}.${k}`);
      scaling = {
        rope_type: 'llama3',
        factor: p('factor'),
        low_freq_factor: p('low_freq_factor'),
        high_freq_factor: p('high_freq_factor'),
        original_max_position_embeddings: r['original_max_position_embeddings'] === undefined ? int('max_position_embeddings') : p('original_max_position_embeddings'),
      };
      if (scaling.factor <= 0) invalid(`${rpKey}.factor must be > 0`);
      if (!(scaling.low_freq_factor > 0 && scaling.high_freq_factor > scaling.low_freq_factor)) invalid(`${rpKey}: need 0 < low_freq_factor < high_freq_factor`);
      if (!Number.isInteger(scaling.original_max_position_embeddings) || scaling.original_max_position_embeddings <= 0)
        invalid(`${rpKey}.original_max_position_embeddings must be a positive integer`);
    }
  }

  // sliding window: Mistral's where set; Qwen's only where use_sliding_window (transformers drops it otherwise)
  let window: number | null = null;
  if (fam === 'mistral') {
    if (o['sliding_window'] !== undefined && o['sliding_window'] !== null) window = int('sliding_window');
    if (o['use_sliding_window'] !== undefined) invalid('use_sliding_window is not a Mistral key (sliding_window alone sets the window)');
  } else if (fam === 'qwen2' || fam === 'qwen3') {
    if (bool('use_sliding_window', false)) {
      if (o['sliding_window'] === undefined || o['sliding_window'] === null) invalid('use_sliding_window is true but sliding_window is not set');
      window = int('sliding_window');
    }
    else only('sliding_window', (v) => typeof v === 'number', 'a number or null');
  } else {
    for (const k of ['sliding_window', 'use_sliding_window']) if (o[k] !== undefined && o[k] !== null && o[k] !== false) invalid(`${k} is not a Llama key`);
  }
  const layers = int('num_hidden_layers');
  if (o['layer_types'] !== undefined && o['layer_types'] !== null) {
    const lt = o['layer_types'];
    if (!Array.isArray(lt) || lt.length !== layers) invalid(`layer_types must list num_hidden_layers (${layers}) entries`);
    lt.forEach((t, i) => {
      if (t === 'full_attention') return;
      if (t === 'sliding_attention' && window !== null) return;
      invalid(`layer_types[${i}] ${JSON.stringify(t)} is not supported (full_attention, or sliding_attention with a sliding window)`);
    });
  }

  const cfg: Required<ModelConfig> = {
    hidden_size: hidden,
    num_hidden_layers: layers,
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    intermediate_size: int('intermediate_size'),
    vocab_size: int('vocab_size'),
    rope_theta: ropeTheta,
    rms_norm_eps: num('rms_norm_eps', 1e-6),
    tie_word_embeddings: bool('tie_word_embeddings', false),
    max_position_embeddings: int('max_position_embeddings'),
    attention_bias: bias,
    model_type: fam,
    head_dim: headDim,
    rope_scaling: scaling ? Object.freeze(scaling) : null,
    sliding_window: window,
  };
  if (cfg.rope_theta <= 1) invalid(`rope_theta must be > 1, got ${cfg.rope_theta}`);
  if (cfg.rms_norm_eps <= 0 || cfg.rms_norm_eps >= 1) invalid(`rms_norm_eps must be in (0, 1), got ${cfg.rms_norm_eps}`);
  return Object.freeze(cfg);
}

/** The longest sequence the model runs exactly: max_position_embeddings, bounded by a sliding window. */
export function maxSequence(c: ParsedModelConfig): number {
  return c.sliding_window !== null && c.sliding_window < c.max_position_embeddings ? c.sliding_window : c.max_position_embeddings;
}

/**
 * A config.json to write back (export, weight-sync directories): the model's own, every key kept, with its family
 * named as rlstream runs it (architectures and model_type: a legacy rlstream config of model_type llama with q/k/v
 * biases is a Qwen2 model to transformers).
 */
export function hfConfigOf(configJson: string): Record<string, unknown> {
  const raw = JSON.parse(configJson) as Record<string, unknown>;
  const c = parseModelConfig(raw);
  const out: Record<string, unknown> = { ...raw, architectures: [MODEL_FAMILIES[c.model_type]], model_type: c.model_type };
  // Qwen2 has no attention_bias key (its q/k/v always carry biases)
  if (c.model_type === 'qwen2') delete out['attention_bias'];
  return out;
}

/**
 * config.json for a parsed config, in the keys transformers (4.x and 5.x) reads for its family: what rlstream
 * writes for a model it made (random initialisation, SFT, a GGUF import). A model that came from a directory is
 * written back with that directory's own config.json instead (export keeps every key it had).
 */
export function hfConfigJson(c: ParsedModelConfig, dtype: 'float32' | 'bfloat16' = 'float32'): Record<string, unknown> {
  const out: Record<string, unknown> = {
    architectures: [MODEL_FAMILIES[c.model_type]],
    model_type: c.model_type,
    hidden_size: c.hidden_size,
    num_hidden_layers: c.num_hidden_layers,
    num_attention_heads: c.num_attention_heads,
    num_key_value_heads: c.num_key_value_heads,
    head_dim: c.head_dim,
    intermediate_size: c.intermediate_size,
    vocab_size: c.vocab_size,
    hidden_act: 'silu',
    rope_theta: c.rope_theta,
    rope_scaling: c.rope_scaling,
    rms_norm_eps: c.rms_norm_eps,
    tie_word_embeddings: c.tie_word_embeddings,
    max_position_embeddings: c.max_position_embeddings,
    torch_dtype: dtype,
  };
  if (c.model_type === 'llama' || c.model_type === 'qwen3') out['attention_bias'] = false;
  if (c.model_type === 'mistral') out['sliding_window'] = c.sliding_window;
  if (c.model_type === 'qwen2' || c.model_type === 'qwen3') {
    out['use_sliding_window'] = c.sliding_window !== null;
    out['sliding_window'] = c.sliding_window;
    out['max_window_layers'] = 0;
  }
  return out;
}

/**
 * Rotary inverse frequencies [head_dim / 2], rounded to float32 step by step as transformers computes them (its
 * default and llama3 rope types), as the native core does (ModelConfig::rope_inv_freq): the built-in ONNX policy's
 * tables use them, so both engines rotate by the same angles.
 */
export function ropeInvFreq(c: ParsedModelConfig): Float32Array {
  const hd = c.head_dim;
  const f = Math.fround;
  const inv = new Float32Array(hd / 2);
  for (let i = 0; i < hd / 2; i++) inv[i] = f(1 / f(Math.pow(c.rope_theta, f(f(2 * i) / f(hd)))));
  const r = c.rope_scaling;
  if (r) {
    const lowWavelen = r.original_max_position_embeddings / r.low_freq_factor;
    const highWavelen = r.original_max_position_embeddings / r.high_freq_factor;
    for (let i = 0; i < inv.length; i++) {
      const x = inv[i]!;
      const wavelen = f(f(2 * Math.PI) / x);
      let g = wavelen > lowWavelen ? f(x / f(r.factor)) : x;
      if (!(wavelen < highWavelen) && !(wavelen > lowWavelen)) {
        const smooth = f(f(f(f(r.original_max_position_embeddings) / wavelen) - f(r.low_freq_factor)) / f(f(r.high_freq_factor) - f(r.low_freq_factor)));
        g = f(f(f(f(1 - smooth) * g) / f(r.factor)) + f(smooth * g));
      }
      inv[i] = g;
    }
  }
  return inv;
}
