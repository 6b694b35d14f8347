// ggml tensor types of GGUF files: their ids, block layouts, and dequantization to float32.
// Layouts follow ggml's block structs (ggml-common.h); each dequantizer computes what ggml's dequantize_row_*
// computes, in the same order, so the float32 results are bit-identical (each value is rounded to float32 once
// on both sides: the products are exact in a double, and one sum is rounded at the store).

export interface GgmlType {
  id: number;
  name: string;
  /** Elements per block. */
  blockSize: number;
  /** Bytes per block. */
  blockBytes: number;
  /** Decodes `count` elements (a multiple of blockSize) from `src` into `out`; null: not readable here. */
  dequantize: ((src: Uint8Array, out: Float32Array, count: number) => void) | null;
}

const QK = 32; // block size of the legacy quants (Q4_0, Q4_1, Q8_0)
const QK_K = 256; // super-block size of the k-quants

const f16Table = (() => {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1;
    const exp = (h >> 10) & 0x1f;
    const frac = h & 0x3ff;
    if (exp === 0) t[h] = sign * frac * 2 ** -24;
    else if (exp === 0x1f) t[h] = frac ? NaN : sign * Infinity;
    else t[h] = sign * (1 + frac / 1024) * 2 ** (exp - 15);
  }
  return t;
})();

function f16(src: Uint8Array, at: number): number {
  return f16Table[src[at]! | (src[at + 1]! << 8)]!;
}

function f32(src: Uint8Array, out: Float32Array, count: number): void {
  const view = new DataView(src.buffer, src.byteOffset, src.byteLength);
  for (let i = 0; i < count; i++) out[i] = view.getFloat32(i * 4, true);
}

function f16Row(src: Uint8Array, out: Float32Array, count: number): void {
  for (let i = 0; i < count; i++) out[i] = f16(src, i * 2);
}

function bf16(src: Uint8Array, out: Float32Array, count: number): void {
  const u = new Uint32Array(out.buffer, out.byteOffset, count);
  for (let i = 0; i < count; i++) u[i] = (src[i * 2]! | (src[i * 2 + 1]! << 8)) << 16;
}

/** block_q8_0 { f16 d; int8 qs[32] }: x = d * q. */
function q8_0(src: Uint8Array, out: Float32Array, count: number): void {
  for (let b = 0, o = 0; o < count; b += 34, o += QK) {
    const d = f16(src, b);
    for (let i = 0; i < QK; i++) out[o + i] = d * ((src[b + 2 + i]! << 24) >> 24);
  }
}

/** block_q4_0 { f16 d; u8 qs[16] }: low nibbles are elements 0..15, high nibbles 16..31; x = d * (q - 8). */
function q4_0(src: Uint8Array, out: Float32Array, count: number): void {
  for (let b = 0, o = 0; o < count; b += 18, o += QK) {
    const d = f16(src, b);
    for (let i = 0; i < QK / 2; i++) {
      const q = src[b + 2 + i]!;
      out[o + i] = d * ((q & 0xf) - 8);
      out[o + i + QK / 2] = d * ((q >> 4) - 8);
    }
  }
}

/** block_q4_1 { f16 d; f16 m; u8 qs[16] }: nibbles as Q4_0; x = d * q + m. */
function q4_1(src: Uint8Array, out: Float32Array, count: number): void {
  for (let b = 0, o = 0; o < count; b += 20, o += QK) {
    const d = f16(src, b);
    const m = f16(src, b + 2);
    for (let i = 0; i < QK / 2; i++) {
      const q = src[b + 4 + i]!;
      out[o + i] = d * (q & 0xf) + m;
      out[o + i + QK / 2] = d * (q >> 4) + m;
    }
  }
}

/**
 * block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }: 8 sub-blocks of 32 with 6-bit scales and mins
 * packed into `scales` (ggml's get_scale_min_k4); x = d * sc * q - dmin * m.
 */
function q4_K(src: Uint8Array, out: Float32Array, count: number): void {
  for (let b = 0, o = 0; o < count; b += 144, o += QK_K) {
    const d = f16(src, b);
    const dmin = f16(src, b + 2);
    const sc = b + 4;
    const scaleMin = (j: number): [number, number] =>
      j < 4
        ? [src[sc + j]! & 63, src[sc + j + 4]! & 63]
        : [(src[sc + j + 4]! & 0xf) | ((src[sc + j - 4]! >> 6) << 4), (src[sc + j + 4]! >> 4) | ((src[sc + j]! >> 6) << 4)];
    let q = b + 16;
    let y = o;
    for (let j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
      const [s1, m1] = scaleMin(is);
      const [s2, m2] = scaleMin(is + 1);
      // float32 products as ggml forms them (exact: 11-bit times 6-bit), subtracted with one rounding.
      const d1 = d * s1, n1 = dmin * m1, d2 = d * s2, n2 = dmin * m2;
      for (let l = 0; l < 32; l++) out[y++] = d1 * (src[q + l]! & 0xf) - n1;
      for (let l = 0; l < 32; l++) out[y++] = d2 * (src[q + l]! >> 4) - n2;
    }
  }
}

/**
 * block_q6_K { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d }: 6-bit values (4 low bits in ql, 2 high bits in
 * qh) minus 32, 16 sub-blocks of 16 with int8 scales; x = d * scale * q.
 */
function q6_K(src: Uint8Array, out: Float32Array, count: number): void {
  for (let b = 0, o = 0; o < count; b += 210, o += QK_K) {
    const d = f16(src, b + 208);
    let ql = b, qh = b + 128, sc = b + 192, y = o;
    for (let n = 0; n < QK_K; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
      for (let l = 0; l < 32; l++) {
        const is = l >> 4;
        const h = src[qh + l]!;
        const q1 = ((src[ql + l]! & 0xf) | ((h & 3) << 4)) - 32;
        const q2 = ((src[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
        const q3 = ((src[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
        const q4 = ((src[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
        const s = (k: number): number => (src[sc + is + k]! << 24) >> 24;
        out[y + l] = d * s(0) * q1;
        out[y + l + 32] = d * s(2) * q2;
        out[y + l + 64] = d * s(4) * q3;
        out[y + l + 96] = d * s(6) * q4;
      }
    }
  }
}

// ggml_type ids (ggml.h). Types listed without a dequantizer are named in errors but not read.
const TYPES: GgmlType[] = [
  { id: 0, name: 'F32', blockSize: 1, blockBytes: 4, dequantize: f32 },
  { id: 1, name: 'F16', blockSize: 1, blockBytes: 2, dequantize: f16Row },
  { id: 2, name: 'Q4_0', blockSize: QK, blockBytes: 18, dequantize: q4_0 },
  { id: 3, name: 'Q4_1', blockSize: QK, blockBytes: 20, dequantize: q4_1 },
  { id: 6, name: 'Q5_0', blockSize: QK, blockBytes: 22, dequantize: null },
  { id: 7, name: 'Q5_1', blockSize: QK, blockBytes: 24, dequantize: null },
  { id: 8, name: 'Q8_0', blockSize: QK, blockBytes: 34, dequantize: q8_0 },
  { id: 9, name: 'Q8_1', blockSize: QK, blockBytes: 36, dequantize: null },
  { id: 10, name: 'Q2_K', blockSize: QK_K, blockBytes: 84, dequantize: null },
  { id: 11, name: 'Q3_K', blockSize: QK_K, blockBytes: 110, dequantize: null },
  { id: 12, name: 'Q4_K', blockSize: QK_K, blockBytes: 144, dequantize: q4_K },
  { id: 13, name: 'Q5_K', blockSize: QK_K, blockBytes: 176, dequantize: null },
  { id: 14, name: 'Q6_K', blockSize: QK_K, blockBytes: 210, dequantize: q6_K },
  { id: 15, name: 'Q8_K', blockSize: QK_K, blockBytes: 292, dequantize: null },
  { id: 24, name: 'I8', blockSize: 1, blockBytes: 1, dequantize: null },
  { id: 25, name: 'I16', blockSize: 1, blockBytes: 2, dequantize: null },
  { id: 26, name: 'I32', blockSize: 1, blockBytes: 4, dequantize: null },
  { id: 27, name: 'I64', blockSize: 1, blockBytes: 8, dequantize: null },
  { id: 28, name: 'F64', blockSize: 1, blockBytes: 8, dequantize: null },
  { id: 30, name: 'BF16', blockSize: 1, blockBytes: 2, dequantize: bf16 },
];

const BY_ID = new Map(TYPES.map((t) => [t.id, t]));

/** The type with this ggml id, or undefined for an id this table does not know (its size is then unknown too). */
export function ggmlType(id: number): GgmlType | undefined {
  return BY_ID.get(id);
}

/** Names of the types that can be dequantized, for error messages. */
export const READABLE_TYPES: readonly string[] = TYPES.filter((t) => t.dequantize !== null).map((t) => t.name);
