// CRC-32 (zlib's polynomial, as node:zlib's crc32) of a concatenation from the CRCs of its parts, without
// reading the bytes again: crc(A ‖ B) = crc(A) · x^(8·|B|) mod P  ⊕  crc(B). The embedded log checksums every
// record body when it encodes a batch, and the journal checksums the same bytes as part of a transaction's
// entry; combining lets the journal reuse the records' CRCs instead of making a second pass over every byte
// (the largest part of a transaction). The method is zlib's crc32_combine (multmodp / x2nmodp, zlib ≥ 1.2.12).

/** The reflected CRC-32 polynomial. */
const POLY = 0xedb88320;

/** a(x) · b(x) mod P(x), on reflected 32-bit values. */
function multModP(a: number, b: number): number {
  let m = 0x80000000;
  let p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) === 0) break;
    }
    m >>>= 1;
    b = b & 1 ? (b >>> 1) ^ POLY : b >>> 1;
  }
  return p >>> 0;
}

/** X2N[k] = x^(2^k) mod P. */
const X2N = new Uint32Array(32);
{
  let p = 0x40000000; // x^1
  X2N[0] = p;
  for (let k = 1; k < 32; k++) X2N[k] = p = multModP(p, p);
}

/** x^(n · 2^k) mod P. */
function x2nModP(n: number, k: number): number {
  let p = 0x80000000; // x^0
  while (n > 0) {
    if (n % 2 === 1) p = multModP(X2N[k & 31]!, p);
    n = Math.floor(n / 2);
    k++;
  }
  return p;
}

/** The CRC-32 of A ‖ B from crc(A), crc(B) and the length of B in bytes. */
export function crc32Combine(crcA: number, crcB: number, lengthB: number): number {
  return (multModP(x2nModP(lengthB, 3), crcA) ^ crcB) >>> 0;
}
