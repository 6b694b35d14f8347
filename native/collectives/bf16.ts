// bf16 as 16-bit patterns in a Uint16Array (the top half of an IEEE fp32): rounding to nearest, ties to even, as
// CUDA's __float2bfloat16 and PyTorch's .to(torch.bfloat16) round; NaN stays NaN (quiet).
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export function toBf16Bits(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  if ((u & 0x7f800000) === 0x7f800000 && (u & 0x007fffff) !== 0) return ((u >>> 16) | 0x0040) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function fromBf16Bits(b: number): number {
  u32[0] = (b & 0xffff) << 16;
  return f32[0]!;
}

export function toBf16(src: Float32Array, out: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  for (let i = 0; i < src.length; i++) out[i] = toBf16Bits(src[i]!);
  return out;
}

export function fromBf16(src: Uint16Array, out: Float32Array = new Float32Array(src.length)): Float32Array {
  for (let i = 0; i < src.length; i++) out[i] = fromBf16Bits(src[i]!);
  return out;
}
