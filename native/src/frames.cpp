// Frame checks of the embedded log (see frames.h), and a CRC-32 several times faster than zlib's table version:
// the CRC is most of what a log read costs.
#include "frames.h"

#include <zlib.h>

#if defined(__PCLMUL__) && defined(__SSE4_1__)
#include <immintrin.h>
#endif

namespace rls {

namespace {

#if defined(__PCLMUL__) && defined(__SSE4_1__)
// CRC-32 (zlib's polynomial) by carry-less multiplication, folding 64 bytes a step: the method of Intel's
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" with the constants of the reflected
// polynomial 0xEDB88320. Checked against zlib over every length (test/native).
// Works on the inverted CRC state; len >= 64 and a multiple of 16.
uint32_t crc32_fold(uint32_t crc, const uint8_t* buf, size_t len) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};
  auto load = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
  // x * k folded onto the next block: both 64-bit halves multiplied by their constant.
  auto fold = [](__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
  };
  __m128i x1 = _mm_xor_si128(load(buf), _mm_cvtsi32_si128(int(crc)));
  __m128i x2 = load(buf + 16), x3 = load(buf + 32), x4 = load(buf + 48);
  buf += 64;
  len -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  for (; len >= 64; buf += 64, len -= 64) {
    x1 = fold(x1, k, load(buf));
    x2 = fold(x2, k, load(buf + 16));
    x3 = fold(x3, k, load(buf + 32));
    x4 = fold(x4, k, load(buf + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  for (; len >= 16; buf += 16, len -= 16) x1 = fold(x1, k, load(buf));
  // 128 bits to 64.
  __m128i x = _mm_xor_si128(_mm_clmulepi64_si128(x1, k, 0x10), _mm_srli_si128(x1, 8));
  const __m128i mask = _mm_setr_epi32(~0, 0, ~0, 0);
  const __m128i k5 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x, mask), k5, 0x00), _mm_srli_si128(x, 4));
  // Barrett reduction to 32 bits.
  const __m128i p = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, mask), p, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask), p, 0x00);
  return uint32_t(_mm_extract_epi32(_mm_xor_si128(x, t), 1));
}
#endif

// Byte-at-a-time CRC-32 for the short head/tail the folding leaves (zlib's crc32 call cost more than these bytes).
struct CrcTable {
  uint32_t t[256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
  }
};
const CrcTable CRC_TABLE;

inline uint32_t crc32_bytes(uint32_t crc, const uint8_t* buf, size_t len) {
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = CRC_TABLE.t[(crc ^ buf[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

inline uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }
}  // namespace

uint32_t crc32_of(const uint8_t* buf, size_t len, uint32_t crc) {
#if defined(__PCLMUL__) && defined(__SSE4_1__)
  if (len >= 64) {
    const size_t bulk = len & ~size_t(15);
    crc = ~crc32_fold(~crc, buf, bulk);
    buf += bulk;
    len -= bulk;
  }
  return crc32_bytes(crc, buf, len);
#else
  return uint32_t(crc32(crc, buf, uInt(len)));
#endif
}

size_t check_frames(const uint8_t* buf, size_t from, size_t limit, size_t max_records, uint32_t min_body,
                    uint32_t max_body, size_t* records) {
  constexpr size_t FRAME = 8;
  size_t p = from, n = 0;
  while (p < limit && n < max_records) {
    if (limit - p < FRAME) break;
    const uint32_t len = be32(buf + p);
    if (len < min_body || len > max_body || limit - p - FRAME < len) break;
    if (crc32_of(buf + p + FRAME, len, 0) != be32(buf + p + 4)) break;
    p += FRAME + len;
    n++;
  }
  *records = n;
  return p;
}

uint32_t seal_frames(uint8_t* buf, size_t from, size_t limit) {
  constexpr size_t FRAME = 8;
  size_t p = from;
  while (limit - p >= FRAME) {
    const uint32_t len = be32(buf + p);
    if (limit - p - FRAME < len) break;
    const uint32_t crc = crc32_of(buf + p + FRAME, len, 0);
    buf[p + 4] = uint8_t(crc >> 24);
    buf[p + 5] = uint8_t(crc >> 16);
    buf[p + 6] = uint8_t(crc >> 8);
    buf[p + 7] = uint8_t(crc);
    p += FRAME + len;
  }
  if (p != limit) return 0;  // the caller checks the range first: not reached
  return crc32_of(buf + from, limit - from, 0);
}

}  // namespace rls
