// Test fixtures for the GGUF reader and importer: a small GGUF writer (the format as llama.cpp's gguf-py writes
// it), block packers for each quant type that build blocks from chosen scales and integer codes (so the
// expected values follow from the format's definition), and a tiny llama model with a byte-level BPE vocab.
import { rng } from '../../core/random.ts';

export type ScalarKind = 'u8' | 'i8' | 'u16' | 'i16' | 'u32' | 'i32' | 'f32' | 'bool' | 'str' | 'u64' | 'i64' | 'f64';
export type MetaEntry =
  | { key: string; kind: ScalarKind; value: number | bigint | boolean | string }
  | { key: string; kind: 'arr'; elem: ScalarKind; value: (number | bigint | boolean | string)[] };

export interface RawTensor {
  name: string;
  /** ggml type id */
  type: number;
  /** row-major shape (written reversed, as ggml's ne) */
  shape: number[];
  data: Uint8Array;
}

const KIND_ID: Record<ScalarKind, number> = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, u64: 10, i64: 11, f64: 12 };
export const GGML = { F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q8_0: 8, Q4_K: 12, Q5_K: 13, Q6_K: 14, BF16: 30 } as const;

class Bytes {
  private chunks: Uint8Array[] = [];
  length = 0;
  push(b: Uint8Array): void {
    this.chunks.push(b);
    this.length += b.length;
  }
  num(kind: ScalarKind, v: number | bigint | boolean): void {
    const width = { u8: 1, i8: 1, u16: 2, i16: 2, u32: 4, i32: 4, f32: 4, bool: 1, u64: 8, i64: 8, f64: 8, str: 0 }[kind];
    const dv = new DataView(new ArrayBuffer(width));
    if (kind === 'u8' || kind === 'bool') dv.setUint8(0, Number(v));
    else if (kind === 'i8') dv.setInt8(0, Number(v));
    else if (kind === 'u16') dv.setUint16(0, Number(v), true);
    else if (kind === 'i16') dv.setInt16(0, Number(v), true);
    else if (kind === 'u32') dv.setUint32(0, Number(v), true);
    else if (kind === 'i32') dv.setInt32(0, Number(v), true);
    else if (kind === 'f32') dv.setFloat32(0, Number(v), true);
    else if (kind === 'f64') dv.setFloat64(0, Number(v), true);
    else if (kind === 'u64') dv.setBigUint64(0, BigInt(v), true);
    else if (kind === 'i64') dv.setBigInt64(0, BigInt(v), true);
    this.push(new Uint8Array(dv.buffer));
  }
  str(s: string): void {
    const b = new TextEncoder().encode(s);
    this.num('u64', b.length);
    this.push(b);
  }
  value(kind: ScalarKind, v: number | bigint | boolean | string): void {
    if (kind === 'str') this.str(v as string);
    else this.num(kind, v as number);
  }
  concat(): Uint8Array {
    const out = new Uint8Array(this.length);
    let at = 0;
    for (const c of this.chunks) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  }
}

/** GGUF bytes: header, metadata, tensor infos, data aligned to `alignment` (written as general.alignment when not 32). */
export function writeGguf(o: { metadata: MetaEntry[]; tensors: RawTensor[]; alignment?: number; version?: number; magic?: string }): Uint8Array {
  const align = o.alignment ?? 32;
  const meta = align === 32 ? o.metadata : [...o.metadata, { key: 'general.alignment', kind: 'u32' as const, value: align }];
  const b = new Bytes();
  b.push(new TextEncoder().encode(o.magic ?? 'GGUF'));
  b.num('u32', o.version ?? 3);
  b.num('u64', o.tensors.length);
  b.num('u64', meta.length);
  for (const m of meta) {
    b.str(m.key);
    if (m.kind === 'arr') {
      b.num('u32', 9);
      b.num('u32', KIND_ID[m.elem]);
      b.num('u64', m.value.length);
      for (const v of m.value) b.value(m.elem, v);
    } else {
      b.num('u32', KIND_ID[m.kind]);
      b.value(m.kind, m.value);
    }
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of o.tensors) {
    b.str(t.name);
    b.num('u32', t.shape.length);
    for (const d of [...t.shape].reverse()) b.num('u64', d);
    b.num('u32', t.type);
    b.num('u64', offset);
    offsets.push(offset);
    offset += Math.ceil(t.data.length / align) * align;
  }
  b.push(new Uint8Array((align - (b.length % align)) % align));
  const dataStart = b.length;
  const out = new Uint8Array(dataStart + offset);
  out.set(b.concat());
  o.tensors.forEach((t, i) => out.set(t.data, dataStart + offsets[i]!));
  return out;
}

/** IEEE half bits of a value that a half represents exactly (the fixtures choose such values). */
export function f16Bits(x: number): number {
  if (x === 0) return Object.is(x, -0) ? 0x8000 : 0;
  const sign = x < 0 ? 0x8000 : 0;
  const a = Math.abs(x);
  const e = Math.floor(Math.log2(a));
  if (e < -14) {
    const frac = a / 2 ** -24;
    if (!Number.isInteger(frac)) throw new Error(`${x} is not a half`);
    return sign | frac;
  }
  const mant = (a / 2 ** e - 1) * 1024;
  if (!Number.isInteger(mant) || e > 15) throw new Error(`${x} is not a half`);
  return sign | ((e + 15) << 10) | mant;
}

function putF16(out: Uint8Array, at: number, x: number): void {
  const h = f16Bits(x);
  out[at] = h & 0xff;
  out[at + 1] = h >> 8;
}

export function packF32(values: number[] | Float32Array): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

export function packF16(values: number[]): Uint8Array {
  const out = new Uint8Array(values.length * 2);
  values.forEach((v, i) => putF16(out, i * 2, v));
  return out;
}

/** One Q8_0 block: scale d, 32 int8 codes. Element i = d * q[i]. */
export function packQ8_0(d: number, q: number[]): Uint8Array {
  const out = new Uint8Array(34);
  putF16(out, 0, d);
  q.forEach((v, i) => (out[2 + i] = v & 0xff));
  return out;
}

/** One Q4_0 block: element i = d * (q[i] - 8), q in 0..15. */
export function packQ4_0(d: number, q: number[]): Uint8Array {
  const out = new Uint8Array(18);
  putF16(out, 0, d);
  for (let i = 0; i < 16; i++) out[2 + i] = q[i]! | (q[i + 16]! << 4);
  return out;
}

/** One Q4_1 block: element i = d * q[i] + m, q in 0..15. */
export function packQ4_1(d: number, m: number, q: number[]): Uint8Array {
  const out = new Uint8Array(20);
  putF16(out, 0, d);
  putF16(out, 2, m);
  for (let i = 0; i < 16; i++) out[4 + i] = q[i]! | (q[i + 16]! << 4);
  return out;
}

/**
 * One Q4_K super-block: 8 sub-blocks of 32; element e = d * sc[e/32] * q[e] - dmin * mn[e/32], with 6-bit
 * sc, mn and 4-bit q. Sub-blocks 2c and 2c+1 share the 32 bytes of chunk c (low, high nibbles); the 6-bit
 * scales and mins of sub-blocks 4..7 are split into a low nibble (bytes 8..11) and two high bits (bytes 0..7).
 */
export function packQ4_K(d: number, dmin: number, sc: number[], mn: number[], q: number[]): Uint8Array {
  const out = new Uint8Array(144);
  putF16(out, 0, d);
  putF16(out, 2, dmin);
  const s = out.subarray(4, 16);
  for (let j = 0; j < 4; j++) {
    s[j] = sc[j]! | ((sc[j + 4]! >> 4) << 6);
    s[j + 4] = mn[j]! | ((mn[j + 4]! >> 4) << 6);
    s[j + 8] = (sc[j + 4]! & 0xf) | ((mn[j + 4]! & 0xf) << 4);
  }
  for (let c = 0; c < 4; c++) for (let l = 0; l < 32; l++) out[16 + 32 * c + l] = q[64 * c + l]! | (q[64 * c + 32 + l]! << 4);
  return out;
}

/**
 * One Q6_K super-block: element e = d * sc[e/16] * (q[e] - 32), q in 0..63, sc int8. Element 128n + 32k + l
 * keeps its low 4 bits in ql[64n + l + 32(k&1)] (low nibble for k < 2, high for k >= 2) and its top 2 bits in
 * bits 2k..2k+1 of qh[32n + l].
 */
export function packQ6_K(d: number, sc: number[], q: number[]): Uint8Array {
  const out = new Uint8Array(210);
  for (let n = 0; n < 2; n++)
    for (let k = 0; k < 4; k++)
      for (let l = 0; l < 32; l++) {
        const v = q[128 * n + 32 * k + l]!;
        out[64 * n + l + 32 * (k & 1)]! |= (v & 0xf) << (k >= 2 ? 4 : 0);
        out[128 + 32 * n + l]! |= (v >> 4) << (2 * k);
      }
  sc.forEach((v, i) => (out[192 + i] = v & 0xff));
  putF16(out, 208, d);
  return out;
}

export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** GPT-2's byte → printable unicode map (the alphabet of byte-level BPE vocabularies). */
export function byteLevelAlphabet(): string[] {
  const bs: number[] = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const map = new Array<string>(256);
  for (const b of bs) map[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; b++) if (map[b] === undefined) map[b] = String.fromCodePoint(256 + n++);
  return map;
}

/** convert_hf_to_gguf's permute for q/k rows: per head, [2, D/2] rows become [D/2, 2]. */
export function permuteRows(w: Float32Array, rows: number, cols: number, heads: number): Float32Array {
  const D = rows / heads;
  const out = new Float32Array(w.length);
  for (let h = 0; h < heads; h++)
    for (let j = 0; j < 2; j++)
      for (let i = 0; i < D / 2; i++) out.set(w.subarray((h * D + j * (D / 2) + i) * cols, (h * D + j * (D / 2) + i + 1) * cols), (h * D + 2 * i + j) * cols);
  return out;
}

export const CHATML =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** Merges of the tiny vocabulary, in rank order; "1 2" must never apply (the digit split comes first). */
export const TINY_MERGES = ['h e', 'l l', 'he ll', 'hell o', 'Ġ w', 'o r', 'Ġw or', 'l d', 'Ġwor ld', '1 2'];
export const SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];

export interface TinyLlama {
  bytes: Uint8Array;
  /** Hugging Face tensors the file stands for (q/k before llama.cpp's permutation). */
  hf: Map<string, { shape: number[]; data: Float32Array }>;
  tokens: string[];
  config: { hidden: number; layers: number; heads: number; kvHeads: number; ff: number; vocab: number };
}

/**
 * A 2-layer llama GGUF as llama.cpp's converter lays it out: F32 norms and q/k (rows permuted), F16 v, Q4_0
 * o_proj, Q4_1 MLP, Q8_0 embedding, tied head; a byte-level BPE vocabulary (3 specials, 256 byte tokens, the
 * merges' results) with the smollm pre-tokenizer and a ChatML template. Quantized tensors are built from codes,
 * so the Hugging Face values are exact. `edit` changes the metadata or tensors before writing.
 */
export function tinyLlama(seed = 7, edit: (m: MetaEntry[], t: RawTensor[]) => void = () => undefined): TinyLlama {
  const r = rng(seed);
  const int = (lo: number, hi: number): number => lo + Math.floor(r() * (hi - lo + 1));
  const alphabet = byteLevelAlphabet();
  const tokens = [...SPECIALS, ...alphabet, ...TINY_MERGES.map((m) => m.replace(' ', ''))];
  const cfg = { hidden: 32, layers: 2, heads: 4, kvHeads: 2, ff: 64, vocab: tokens.length };
  const hf = new Map<string, { shape: number[]; data: Float32Array }>();
  const tensors: RawTensor[] = [];
  const add = (gguf: string, name: string, shape: number[], kind: 'f32' | 'f16' | 'q8_0' | 'q4_0' | 'q4_1' | 'norm', heads = 0): void => {
    const [rows, cols] = [shape[0]!, shape[1] ?? 1];
    const n = rows * cols;
    const vals = new Float32Array(n);
    const blocks: Uint8Array[] = [];
    if (kind === 'norm') for (let i = 0; i < n; i++) vals[i] = 1 + (r() - 0.5) * 0.2;
    else if (kind === 'f32') for (let i = 0; i < n; i++) vals[i] = (r() - 0.5) * 0.5;
    else if (kind === 'f16') for (let i = 0; i < n; i++) vals[i] = int(-64, 64) / 256;
    else
      for (let b = 0; b < n / 32; b++) {
        const d = [0.0078125, 0.015625, 0.03125][int(0, 2)]!;
        if (kind === 'q8_0') {
          const q = Array.from({ length: 32 }, () => int(-127, 127));
          q.forEach((v, i) => (vals[b * 32 + i] = d * v));
          blocks.push(packQ8_0(d, q));
        } else if (kind === 'q4_0') {
          const q = Array.from({ length: 32 }, () => int(0, 15));
          q.forEach((v, i) => (vals[b * 32 + i] = d * (v - 8)));
          blocks.push(packQ4_0(d, q));
        } else {
          const m = -0.0625 * int(0, 4);
          const q = Array.from({ length: 32 }, () => int(0, 15));
          q.forEach((v, i) => (vals[b * 32 + i] = Math.fround(d * v + m)));
          blocks.push(packQ4_1(d, m, q));
        }
      }
    hf.set(name, { shape, data: vals });
    const stored = heads ? permuteRows(vals, rows, cols, heads) : vals;
    const type = { f32: GGML.F32, norm: GGML.F32, f16: GGML.F16, q8_0: GGML.Q8_0, q4_0: GGML.Q4_0, q4_1: GGML.Q4_1 }[kind];
    const data = kind === 'f32' || kind === 'norm' ? packF32(stored) : kind === 'f16' ? packF16([...stored]) : concat(blocks);
    tensors.push({ name: gguf, type, shape, data });
  };
  const { hidden: H, ff: F, heads, kvHeads } = cfg;
  const kvDim = (H / heads) * kvHeads;
  add('token_embd.weight', 'model.embed_tokens.weight', [cfg.vocab, H], 'q8_0');
  add('output_norm.weight', 'model.norm.weight', [H], 'norm');
  for (let l = 0; l < cfg.layers; l++) {
    const p = `model.layers.${l}.`;
    add(`blk.${l}.attn_norm.weight`, `${p}input_layernorm.weight`, [H], 'norm');
    add(`blk.${l}.attn_q.weight`, `${p}self_attn.q_proj.weight`, [H, H], 'f32', heads);
    add(`blk.${l}.attn_k.weight`, `${p}self_attn.k_proj.weight`, [kvDim, H], 'f32', kvHeads);
    add(`blk.${l}.attn_v.weight`, `${p}self_attn.v_proj.weight`, [kvDim, H], 'f16');
    add(`blk.${l}.attn_output.weight`, `${p}self_attn.o_proj.weight`, [H, H], 'q4_0');
    add(`blk.${l}.ffn_norm.weight`, `${p}post_attention_layernorm.weight`, [H], 'norm');
    add(`blk.${l}.ffn_gate.weight`, `${p}mlp.gate_proj.weight`, [F, H], 'q4_1');
    add(`blk.${l}.ffn_up.weight`, `${p}mlp.up_proj.weight`, [F, H], 'q4_1');
    // ffn_down's rows are F = 64 long: two Q4_1 blocks per row.
    add(`blk.${l}.ffn_down.weight`, `${p}mlp.down_proj.weight`, [H, F], 'q4_1');
  }
  const meta: MetaEntry[] = [
    { key: 'general.architecture', kind: 'str', value: 'llama' },
    { key: 'general.name', kind: 'str', value: 'tiny' },
    { key: 'llama.block_count', kind: 'u32', value: cfg.layers },
    { key: 'llama.context_length', kind: 'u32', value: 64 },
    { key: 'llama.embedding_length', kind: 'u32', value: H },
    { key: 'llama.feed_forward_length', kind: 'u32', value: F },
    { key: 'llama.attention.head_count', kind: 'u32', value: heads },
    { key: 'llama.attention.head_count_kv', kind: 'u32', value: kvHeads },
    { key: 'llama.rope.freq_base', kind: 'f32', value: 10000 },
    { key: 'llama.attention.layer_norm_rms_epsilon', kind: 'f32', value: 1e-5 },
    { key: 'llama.vocab_size', kind: 'u32', value: cfg.vocab },
    { key: 'llama.rope.dimension_count', kind: 'u32', value: H / heads },
    { key: 'tokenizer.ggml.model', kind: 'str', value: 'gpt2' },
    { key: 'tokenizer.ggml.pre', kind: 'str', value: 'smollm' },
    { key: 'tokenizer.ggml.tokens', kind: 'arr', elem: 'str', value: tokens },
    { key: 'tokenizer.ggml.token_type', kind: 'arr', elem: 'i32', value: tokens.map((_, i) => (i < SPECIALS.length ? 3 : 1)) },
    { key: 'tokenizer.ggml.merges', kind: 'arr', elem: 'str', value: TINY_MERGES },
    { key: 'tokenizer.ggml.bos_token_id', kind: 'u32', value: 1 },
    { key: 'tokenizer.ggml.eos_token_id', kind: 'u32', value: 2 },
    { key: 'tokenizer.ggml.unknown_token_id', kind: 'u32', value: 0 },
    { key: 'tokenizer.ggml.padding_token_id', kind: 'u32', value: 2 },
    { key: 'tokenizer.ggml.add_bos_token', kind: 'bool', value: false },
    { key: 'tokenizer.chat_template', kind: 'str', value: CHATML },
  ];
  edit(meta, tensors);
  return { bytes: writeGguf({ metadata: meta, tensors }), hf, tokens, config: cfg };
}
