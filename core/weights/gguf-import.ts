// A llama-architecture GGUF as a Hugging Face model directory: config.json, model.safetensors (dequantized,
// Hugging Face tensor names and layout), tokenizer.json, tokenizer_config.json, generation_config.json.
// llama.cpp's converter reorders the rows of q_proj and k_proj within each head (it interleaves the two
// rotary halves, for its rope kernel); Hugging Face's Llama rotates halves, so the rows are put back here.
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeSafetensors } from './safetensors.ts';
import { RlstreamError } from '../errors.ts';
import { GgufFile, type GgufTensorInfo } from './gguf.ts';
import { ggufTokenizer } from './gguf-tokenizer.ts';

export type ImportDtype = 'F32' | 'BF16';

export interface ImportSummary {
  architecture: string;
  tensors: number;
  parameters: number;
  /** Tensor count per GGUF type name. */
  sourceTypes: Record<string, number>;
  dtype: ImportDtype;
  tieWordEmbeddings: boolean;
  vocabSize: number;
  chatTemplate: boolean;
  duplicateTokens: number;
  files: string[];
}

function fail(source: string, message: string): never {
  throw new RlstreamError('WEIGHTS_FORMAT', `${source}: ${message}`);
}

const GLOBAL_NAMES: Record<string, string> = {
  'token_embd.weight': 'model.embed_tokens.weight',
  'output_norm.weight': 'model.norm.weight',
  'output.weight': 'lm_head.weight',
};

const BLOCK_NAMES: Record<string, string> = {
  'attn_norm.weight': 'input_layernorm.weight',
  'ffn_norm.weight': 'post_attention_layernorm.weight',
  'attn_q.weight': 'self_attn.q_proj.weight',
  'attn_k.weight': 'self_attn.k_proj.weight',
  'attn_v.weight': 'self_attn.v_proj.weight',
  'attn_output.weight': 'self_attn.o_proj.weight',
  'ffn_gate.weight': 'mlp.gate_proj.weight',
  'ffn_up.weight': 'mlp.up_proj.weight',
  'ffn_down.weight': 'mlp.down_proj.weight',
};

/** The Hugging Face name of a llama GGUF tensor, or null for one this importer does not know. */
function hfTensorName(ggufName: string): string | null {
  const g = GLOBAL_NAMES[ggufName];
  if (g) return g;
  const m = /^blk\.(\d+)\.(.+)$/.exec(ggufName);
  const local = m ? BLOCK_NAMES[m[2]!] : undefined;
  return local ? `model.layers.${m![1]}.${local}` : null;
}

/**
 * Undoes convert_hf_to_gguf's permute(w, n_head): there, the rows of each head, viewed as [2, headDim/2], are
 * transposed to [headDim/2, 2]; so Hugging Face row h*D + j*D/2 + i is GGUF row h*D + 2*i + j.
 */
function unpermuteRows(data: Float32Array, rows: number, cols: number, heads: number): Float32Array {
  if (rows % heads !== 0 || (rows / heads) % 2 !== 0) throw new RlstreamError('WEIGHTS_FORMAT', `cannot un-permute ${rows} rows into ${heads} heads of even size`);
  const D = rows / heads;
  const half = D / 2;
  const out = new Float32Array(data.length);
  for (let h = 0; h < heads; h++)
    for (let j = 0; j < 2; j++)
      for (let i = 0; i < half; i++) {
        const src = (h * D + 2 * i + j) * cols;
        out.set(data.subarray(src, src + cols), (h * D + j * half + i) * cols);
      }
  return out;
}

function requireInt(file: GgufFile, key: string): number {
  const v = file.get(key, 'number');
  if (v === undefined) fail(file.source, `metadata ${key} is missing`);
  if (!Number.isInteger(v) || v <= 0) fail(file.source, `metadata ${key} must be a positive integer, got ${v}`);
  return v;
}

/** config.json (Hugging Face LlamaConfig) from the llama.* metadata and the tensors present. */
function ggufLlamaConfig(file: GgufFile, tokenIds: { bos: number | null; eos: number | null; pad: number | null }): Record<string, unknown> {
  const arch = file.get('general.architecture', 'string');
  if (arch !== 'llama') fail(file.source, `general.architecture is ${JSON.stringify(arch ?? null)}; only "llama" models can be imported`);
  const hidden = requireInt(file, 'llama.embedding_length');
  const heads = requireInt(file, 'llama.attention.head_count');
  const kvHeads = file.get('llama.attention.head_count_kv', 'number') ?? heads;
  const headDim = hidden / heads;
  const ropeDim = file.get('llama.rope.dimension_count', 'number') ?? headDim;
  if (ropeDim !== headDim) fail(file.source, `llama.rope.dimension_count ${ropeDim} differs from the head size ${headDim}: partial rotary embeddings are not supported`);
  const scaling = file.get('llama.rope.scaling.type', 'string');
  if (scaling !== undefined && scaling !== 'none') fail(file.source, `llama.rope.scaling.type ${JSON.stringify(scaling)} is not supported (no rope scaling)`);
  if (file.tensor('rope_freqs.weight')) fail(file.source, 'rope_freqs.weight (llama-3 rope scaling) is not supported');
  const embd = file.tensor('token_embd.weight');
  if (!embd || embd.shape.length !== 2) fail(file.source, 'token_embd.weight is missing or not a matrix');
  const vocab = embd.shape[0]!;
  const metaVocab = file.get('llama.vocab_size', 'number');
  if (metaVocab !== undefined && metaVocab !== vocab) fail(file.source, `llama.vocab_size ${metaVocab} differs from token_embd.weight's ${vocab} rows`);
  const config: Record<string, unknown> = {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    hidden_act: 'silu',
    hidden_size: hidden,
    intermediate_size: requireInt(file, 'llama.feed_forward_length'),
    num_hidden_layers: requireInt(file, 'llama.block_count'),
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: headDim,
    vocab_size: vocab,
    max_position_embeddings: requireInt(file, 'llama.context_length'),
    rms_norm_eps: file.get('llama.attention.layer_norm_rms_epsilon', 'number') ?? 1e-5,
    rope_theta: file.get('llama.rope.freq_base', 'number') ?? 10000,
    rope_scaling: null,
    // A GGUF without output.weight reuses the embedding as the head (llama.cpp does the same).
    tie_word_embeddings: !file.tensor('output.weight'),
    attention_bias: false,
    mlp_bias: false,
    torch_dtype: 'float32',
  };
  if (tokenIds.bos !== null) config['bos_token_id'] = tokenIds.bos;
  if (tokenIds.eos !== null) config['eos_token_id'] = tokenIds.eos;
  if (tokenIds.pad !== null) config['pad_token_id'] = tokenIds.pad;
  return config;
}

/** The tensors of the model in Hugging Face names and layout, dequantized one at a time. */
function* hfTensors(file: GgufFile, config: Record<string, unknown>): Generator<[string, { shape: number[]; data: Float32Array }, GgufTensorInfo]> {
  const layers = config['num_hidden_layers'] as number;
  const heads = config['num_attention_heads'] as number;
  const kvHeads = config['num_key_value_heads'] as number;
  for (const info of file.tensors) {
    const name = hfTensorName(info.name);
    if (name === null) fail(file.source, `tensor ${info.name} is not part of a llama model this importer knows`);
    const layer = /^blk\.(\d+)\./.exec(info.name);
    if (layer && Number(layer[1]) >= layers) fail(file.source, `tensor ${info.name} lies beyond llama.block_count ${layers}`);
    let data = file.readTensor(info);
    const [rows, cols] = [info.shape[0]!, info.shape[1] ?? 1];
    if (info.name.endsWith('.attn_q.weight')) data = unpermuteRows(data, rows, cols, heads);
    else if (info.name.endsWith('.attn_k.weight')) data = unpermuteRows(data, rows, cols, kvHeads);
    yield [name, { shape: info.shape, data }, info];
  }
}

/** Hugging Face names of every tensor a llama model of this config has (lm_head only when untied). */
function expectedTensors(config: Record<string, unknown>): string[] {
  const names = ['model.embed_tokens.weight', 'model.norm.weight'];
  if (!config['tie_word_embeddings']) names.push('lm_head.weight');
  for (let l = 0; l < (config['num_hidden_layers'] as number); l++)
    for (const local of Object.values(BLOCK_NAMES)) names.push(`model.layers.${l}.${local}`);
  return names;
}

function writeJson(path: string, value: unknown): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, JSON.stringify(value, null, 2) + '\n');
  renameSync(tmp, path);
}

/** Imports a llama GGUF file into `outDir` as a Hugging Face model directory. */
export async function importGguf(path: string, outDir: string, options: { dtype?: ImportDtype } = {}): Promise<ImportSummary> {
  const dtype = options.dtype ?? 'F32';
  const file = GgufFile.open(path);
  try {
    const tok = ggufTokenizer(file, { modelMaxLength: file.get('llama.context_length', 'number') });
    const config = ggufLlamaConfig(file, { bos: tok.bosTokenId, eos: tok.eosTokenId, pad: tok.padTokenId });
    if (dtype === 'BF16') config['torch_dtype'] = 'bfloat16';
    const missing = expectedTensors(config).filter((n) => !file.tensors.some((t) => hfTensorName(t.name) === n));
    if (missing.length > 0) fail(path, `lacks tensor(s) of a llama model: ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ', ...' : ''}`);
    const sourceTypes: Record<string, number> = {};
    const tensors: [string, { shape: number[]; data: Float32Array }][] = [];
    let parameters = 0;
    for (const [name, t, info] of hfTensors(file, config)) {
      tensors.push([name, t]);
      parameters += t.data.length;
      sourceTypes[info.type.name] = (sourceTypes[info.type.name] ?? 0) + 1;
    }
    mkdirSync(outDir, { recursive: true });
    await writeSafetensors(join(outDir, 'model.safetensors'), tensors, { format: 'pt' }, dtype);
    writeJson(join(outDir, 'config.json'), config);
    writeJson(join(outDir, 'tokenizer.json'), tok.tokenizer);
    writeJson(join(outDir, 'tokenizer_config.json'), tok.config);
    const generation: Record<string, unknown> = {};
    if (tok.bosTokenId !== null) generation['bos_token_id'] = tok.bosTokenId;
    if (tok.eosTokenId !== null) generation['eos_token_id'] = tok.eosTokenId;
    if (tok.padTokenId !== null) generation['pad_token_id'] = tok.padTokenId;
    writeJson(join(outDir, 'generation_config.json'), generation);
    return {
      architecture: 'llama',
      tensors: tensors.length,
      parameters,
      sourceTypes,
      dtype,
      tieWordEmbeddings: config['tie_word_embeddings'] as boolean,
      vocabSize: config['vocab_size'] as number,
      chatTemplate: typeof tok.config['chat_template'] === 'string',
      duplicateTokens: tok.duplicateTokens,
      files: ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json', 'generation_config.json'],
    };
  } finally {
    file.close();
  }
}
