// Test fixtures for the GGUF reader and importer: a small GGUF writer (the format as llama.cpp's gguf-py writes
// it), block packers for each quant type that build blocks from chosen scales and integer codes (so the
// expected values follow from the format's definition), and a tiny llama model with a byte-level BPE vocab.
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
