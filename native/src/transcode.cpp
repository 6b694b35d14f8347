// Avro → RowBinary transcoding (see transcode.h). The rules mirror core/traces/rowbinary.ts for the values
// that need no conversion, byte for byte; everything else declines (test/traces/transcode.test.ts compares
// both paths on every planned event type).
#include "transcode.h"

#include <cmath>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "errors.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "RowBinary and Avro floats are little-endian");

namespace rls {
namespace {

struct Decline {};
[[noreturn]] inline void decline() { throw Decline{}; }

constexpr int64_t SAFE_MAX = (int64_t(1) << 53) - 1;  // JS numbers are exact up to here (avsc reads longs as numbers)
constexpr int MAX_LEAVES = 1024;
constexpr int MAX_DEPTH = 64;

struct Prog {
  const int32_t* nodes;
  int32_t node_count;
  const int32_t* refs;
  int32_t ref_count;
  const int32_t* leaves;
  int32_t leaf_count;
  const int32_t* cols;
  int32_t col_count;
  const int32_t* syms;
  int32_t sym_count;
  const uint8_t* sym_bytes;

  explicit Prog(const TcProgram& p)
      : nodes(p.words + p.words[TC_NODES]), node_count(p.words[TC_NODE_COUNT]),
        refs(p.words + p.words[TC_REFS]), ref_count(p.words[TC_REF_COUNT]),
        leaves(p.words + p.words[TC_LEAVES]), leaf_count(p.words[TC_LEAF_COUNT]),
        cols(p.words + p.words[TC_COLUMNS]), col_count(p.words[TC_COLUMN_COUNT]),
        syms(p.words + p.words[TC_SYMBOLS]), sym_count(p.words[TC_SYMBOL_COUNT]), sym_bytes(p.symbols) {}

  int32_t kind(int32_t n) const { return nodes[4 * n]; }
  int32_t a(int32_t n) const { return nodes[4 * n + 1]; }
  int32_t b(int32_t n) const { return nodes[4 * n + 2]; }
  int32_t c(int32_t n) const { return nodes[4 * n + 3]; }
};

// ---- Reading ----------------------------------------------------------------------------------------------

struct Cursor {
  const uint8_t* p;
  const uint8_t* end;

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) decline();
      const uint8_t byte = *p++;
      v |= uint64_t(byte & 0x7f) << shift;
      if (byte < 0x80) return v;
    }
    decline();  // more than 10 bytes
  }
  // A zig-zag long within JS's exact range (beyond it the general path's numbers differ).
  int64_t safe_long() {
    const uint64_t u = varint();
    const int64_t v = int64_t(u >> 1) ^ -int64_t(u & 1);
    if (v > SAFE_MAX || v < -SAFE_MAX) decline();
    return v;
  }
  int64_t length() {
    const int64_t n = safe_long();
    if (n < 0 || n > end - p) decline();
    return n;
  }
  void skip(int64_t n) {
    if (n < 0 || n > end - p) decline();
    p += n;
  }
  float f32() {
    if (end - p < 4) decline();
    float f;
    std::memcpy(&f, p, 4);
    p += 4;
    return f;
  }
  double f64() {
    if (end - p < 8) decline();
    double d;
    std::memcpy(&d, p, 8);
    p += 8;
    return d;
  }
  // Next array/map block's item count (a negative count carries the block's byte size after it); 0 ends.
  int64_t block() {
    int64_t n = safe_long();
    if (n < 0) {
      n = -n;
      safe_long();
    }
    return n;
  }
};

void skip(const Prog& g, int32_t n, Cursor& c, int depth);

// Skips `count` items of node `item`. Items of a primitive type in one tight loop: a call per item (the
// general case) costs more than the item itself for the token arrays that make most of the bytes.
void skip_items(const Prog& g, int32_t item, int64_t count, Cursor& c, int depth) {
  switch (g.kind(item)) {
    case K_INT:
    case K_LONG: {
      // A varint ends at its first byte below 0x80 (as avsc reads it).
      const uint8_t* p = c.p;
      const uint8_t* const end = c.end;
      if (count > end - p) decline();
      int64_t left = count;
#ifdef __AVX2__
      // 32 bytes a step while they hold fewer terminators than are left to find.
      while (left > 32 && end - p >= 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const int ends = __builtin_popcount(~uint32_t(_mm256_movemask_epi8(v)));
        if (ends >= left) break;
        left -= ends;
        p += 32;
      }
#endif
      for (; left > 0; p++) {
        if (p >= end) decline();
        left -= *p < 0x80;
      }
      c.p = p;
      return;
    }
    case K_BOOLEAN:
      return c.skip(count);
    case K_FLOAT:
      if (count > (c.end - c.p) / 4) decline();
      c.p += count * 4;
      return;
    case K_DOUBLE:
      if (count > (c.end - c.p) / 8) decline();
      c.p += count * 8;
      return;
    case K_NULL:
      return;
    default:
      if (count > c.end - c.p) decline();  // every other item takes at least one byte
      for (int64_t i = 0; i < count; i++) skip(g, item, c, depth + 1);
  }
}

void skip(const Prog& g, int32_t n, Cursor& c, int depth) {
  if (depth > MAX_DEPTH) decline();
  switch (g.kind(n)) {
    case K_NULL:
      return;
    case K_BOOLEAN:
      return c.skip(1);
    case K_INT:
    case K_LONG:
      c.varint();
      return;
    case K_ENUM: {
      const int64_t i = c.safe_long();
      if (i < 0 || i >= g.b(n)) decline();  // avsc rejects the record: so does the general path
      return;
    }
    case K_FLOAT:
      return c.skip(4);
    case K_DOUBLE:
      return c.skip(8);
    case K_STRING:
    case K_BYTES:
      return c.skip(c.length());
    case K_FIXED:
      return c.skip(g.a(n));
    case K_UNION: {
      const int64_t i = c.safe_long();
      if (i < 0 || i >= g.b(n)) decline();
      return skip(g, g.refs[g.a(n) + i], c, depth + 1);
    }
    case K_RECORD:
      for (int32_t f = 0; f < g.b(n); f++) skip(g, g.refs[g.a(n) + f], c, depth + 1);
      return;
    case K_ARRAY:
      for (int64_t count = c.block(); count != 0; count = c.block()) skip_items(g, g.a(n), count, c, depth);
      return;
    case K_MAP:
      for (int64_t count = c.block(); count != 0; count = c.block()) {
        if (count > c.end - c.p) decline();
        for (int64_t i = 0; i < count; i++) {
          c.skip(c.length());
          skip(g, g.a(n), c, depth + 1);
        }
      }
      return;
    default:
      decline();
  }
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): what decodes to a JS string and
// encodes back to the same bytes.
bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if ((w & 0x8080808080808080ULL) == 0) {
        i += 8;
        continue;
      }
    }
    const uint8_t c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
      return false;
    i += len;
  }
  return true;
}

// ---- Writing ----------------------------------------------------------------------------------------------

// Thrown when the output buffer lacks room for the record: the caller grows it and transcodes the record again.
struct NoRoom {};

struct Out {
  uint8_t* p;
  uint8_t* end;

  void need(size_t n) {
    if (size_t(end - p) < n) throw NoRoom{};
  }
  void varuint(uint64_t n) {
    need(10);
    while (n >= 0x80) {
      *p++ = uint8_t(n | 0x80);
      n >>= 7;
    }
    *p++ = uint8_t(n);
  }
  template <typename T>
  void put(T v) {
    need(sizeof v);
    std::memcpy(p, &v, sizeof v);
    p += sizeof v;
  }
  void bytes(const void* s, size_t n) {
    varuint(n);
    need(n);
    std::memcpy(p, s, n);
    p += n;
  }
};

// Integer v as a column of `target` (an integer, float or DateTime column); out of the type's range declines.
void write_integer(int32_t target, int64_t v, Out& o) {
  static const int64_t lo[] = {0, 0, -0x80, 0, -0x8000, 0, -0x80000000LL};
  static const int64_t hi[] = {0, 0xff, 0x7f, 0xffff, 0x7fff, 0xffffffffLL, 0x7fffffff};
  switch (target) {
    case T_U8:
    case T_I8:
    case T_U16:
    case T_I16:
    case T_U32:
    case T_I32:
      if (v < lo[target] || v > hi[target]) decline();
      if (target <= T_I8) return o.put(uint8_t(v));
      if (target <= T_I16) return o.put(uint16_t(v));
      return o.put(uint32_t(v));
    case T_I64:
    case T_U64:
      if (target == T_U64 && v < 0) decline();
      return o.put(v);
    case T_F32:
      return o.put(float(double(v)));
    case T_F64:
      return o.put(double(v));
    case T_DATETIME: {
      const double s = std::floor(double(v) / 1000.0);  // epoch ms → whole seconds, as the general path rounds
      if (s < 0 || s > 4294967295.0) decline();
      return o.put(uint32_t(s));
    }
    default:
      decline();
  }
}

void write_value(const Prog& g, int32_t n, int32_t target, Cursor& c, Out& o) {
  const int32_t k = g.kind(n);
  if (target == T_STRING) {
    if (k == K_STRING) {
      const int64_t len = c.length();
      if (!valid_utf8(c.p, size_t(len))) decline();
      o.bytes(c.p, size_t(len));
      c.p += len;
      return;
    }
    if (k == K_ENUM) {
      const int64_t i = c.safe_long();
      if (i < 0 || i >= g.b(n)) decline();
      const int32_t* s = g.syms + 2 * (g.a(n) + i);
      return o.bytes(g.sym_bytes + s[0], size_t(s[1]));
    }
    decline();
  }
  if (k == K_FLOAT || k == K_DOUBLE) {
    if (target != T_F32 && target != T_F64) decline();  // a float into an integer column: the general path's rules
    double x = k == K_FLOAT ? double(c.f32()) : c.f64();
    if (!std::isfinite(x)) decline();  // the general path writes 0 (or NULL) for these
    x += 0.0;                          // −0 becomes 0, as the general path (JSON's rule) writes it
    if (target == T_F32) return o.put(float(x));
    return o.put(x);
  }
  if (k == K_INT || k == K_LONG) return write_integer(target, c.safe_long(), o);
  if (k == K_BOOLEAN) {
    if (c.p >= c.end || *c.p > 1) decline();
    return write_integer(target, *c.p++, o);
  }
  decline();
}

// Float items into a Float32 column: the bytes as they are, but −0 → 0 and NaN/±Infinity decline.
void write_floats(Cursor& c, int64_t count, Out& o) {
  if (count > (c.end - c.p) / 4) decline();
  o.need(size_t(count) * 4);
  int64_t i = 0;
#ifdef __AVX2__
  // 8 at a time: any NaN/±Infinity declines, −0 (0x80000000) becomes 0.
  const __m256i exponent = _mm256_set1_epi32(0x7f800000), negative_zero = _mm256_set1_epi32(int(0x80000000u));
  for (; i + 8 <= count; i += 8, c.p += 32, o.p += 32) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.p));
    if (!_mm256_testz_si256(_mm256_cmpeq_epi32(_mm256_and_si256(v, exponent), exponent), _mm256_set1_epi32(-1))) decline();
    v = _mm256_andnot_si256(_mm256_cmpeq_epi32(v, negative_zero), v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.p), v);
  }
#endif
  for (; i < count; i++, c.p += 4) {
    uint32_t bits;
    std::memcpy(&bits, c.p, 4);
    if ((bits & 0x7f800000u) == 0x7f800000u) decline();
    if (bits == 0x80000000u) bits = 0;
    std::memcpy(o.p, &bits, 4);
    o.p += 4;
  }
}

// Int or long items into an integer column of type T: decoded, checked and written in one loop.
template <typename T, int64_t LO, int64_t HI>
void write_varints(Cursor& c, int64_t count, Out& o) {
  if (count > c.end - c.p) decline();  // every item takes at least a byte
  o.need(size_t(count) * sizeof(T));
  const uint8_t* p = c.p;
  const uint8_t* const end = c.end;
  uint8_t* q = o.p;
  for (int64_t i = 0; i < count; i++) {
    uint64_t u;
    if (p < end && *p < 0x80) {
      u = *p++;  // one byte: masks, versions, small ids
    } else {
      u = 0;
      for (int shift = 0;; shift += 7) {
        if (p >= end || shift >= 64) decline();
        const uint8_t byte = *p++;
        u |= uint64_t(byte & 0x7f) << shift;
        if (byte < 0x80) break;
      }
    }
    const int64_t v = int64_t(u >> 1) ^ -int64_t(u & 1);
    if (v < LO || v > HI) decline();
    const T x = T(v);
    std::memcpy(q, &x, sizeof x);
    q += sizeof x;
  }
  c.p = p;
  o.p = q;
}

// The tight loop for these items and this column, or null (then item by item through write_value).
using ItemLoop = void (*)(Cursor&, int64_t, Out&);
ItemLoop item_loop(int32_t item_kind, int32_t target) {
  if (item_kind == K_FLOAT && target == T_F32) return write_floats;
  if (item_kind != K_INT && item_kind != K_LONG) return nullptr;
  switch (target) {
    case T_U8: return write_varints<uint8_t, 0, 0xff>;
    case T_I8: return write_varints<int8_t, -0x80, 0x7f>;
    case T_U16: return write_varints<uint16_t, 0, 0xffff>;
    case T_I16: return write_varints<int16_t, -0x8000, 0x7fff>;
    case T_U32: return write_varints<uint32_t, 0, 0xffffffffLL>;
    case T_I32: return write_varints<int32_t, -0x80000000LL, 0x7fffffff>;
    case T_I64: return write_varints<int64_t, -SAFE_MAX, SAFE_MAX>;
    case T_U64: return write_varints<uint64_t, 0, SAFE_MAX>;
    default: return nullptr;
  }
}

void write_array(const Prog& g, int32_t n, int32_t target, int64_t total, Cursor& c, Out& o) {
  const int32_t item = g.a(n);
  o.varuint(uint64_t(total));
  const ItemLoop loop = item_loop(g.kind(item), target);
  for (int64_t count = c.block(); count != 0; count = c.block()) {
    if (loop) {
      loop(c, count, o);
      continue;
    }
    for (int64_t i = 0; i < count; i++) write_value(g, item, target, c, o);
  }
}

// One field of every record of the array at c, as an array column.
void write_each(const Prog& g, int32_t n, int32_t field, int32_t target, int64_t total, Cursor& c, Out& o) {
  const int32_t rec = g.a(n);
  if (g.kind(rec) != K_RECORD || field >= g.b(rec)) decline();
  o.varuint(uint64_t(total));
  for (int64_t count = c.block(); count != 0; count = c.block()) {
    for (int64_t i = 0; i < count; i++) {
      for (int32_t f = 0; f < g.b(rec); f++) {
        const int32_t fn = g.refs[g.a(rec) + f];
        if (f == field) write_value(g, fn, target, c, o);
        else skip(g, fn, c, 1);
      }
    }
  }
}

// The node a value takes at c: a union's branch is read from the bytes.
int32_t resolve(const Prog& g, int32_t n, Cursor& c) {
  for (int depth = 0; g.kind(n) == K_UNION; depth++) {
    const int64_t i = c.safe_long();
    if (i < 0 || i >= g.b(n) || depth > MAX_DEPTH) decline();
    n = g.refs[g.a(n) + i];
  }
  return n;
}

// ---- JSON (a column holding JSON.stringify of a field, as rowsOf writes tools_json) ----------------------------

const char HEX[] = "0123456789abcdef";

// A JSON string of UTF-8 bytes, escaped as JSON.stringify escapes it (the bytes were checked to be UTF-8).
void json_string(std::string& s, const uint8_t* p, size_t n) {
  s.push_back('"');
  size_t run = 0;  // start of the current run of bytes copied as they are
  for (size_t i = 0; i < n; i++) {
    const uint8_t ch = p[i];
    if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
    s.append(reinterpret_cast<const char*>(p + run), i - run);
    run = i + 1;
    switch (ch) {
      case '"': s += "\\\""; break;
      case '\\': s += "\\\\"; break;
      case '\b': s += "\\b"; break;
      case '\f': s += "\\f"; break;
      case '\n': s += "\\n"; break;
      case '\r': s += "\\r"; break;
      case '\t': s += "\\t"; break;
      default:
        s += "\\u00";
        s.push_back(HEX[ch >> 4]);
        s.push_back(HEX[ch & 15]);
    }
  }
  s.append(reinterpret_cast<const char*>(p + run), n - run);
  s.push_back('"');
}

// A finite double as JavaScript's Number.prototype.toString writes it: the shortest digits that read back to
// the same double (std::to_chars gives those), placed by the ECMAScript rules (plain up to 21 digits before
// the point and 6 zeros after it, exponent form beyond).
void json_number(std::string& s, double x) {
  if (!std::isfinite(x)) decline();  // JSON.stringify writes null: the general path's business
  if (x == 0) {
    s.push_back('0');  // −0 too
    return;
  }
  if (x < 0) {
    s.push_back('-');
    x = -x;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf - 1, x, std::chars_format::scientific);
  if (r.ec != std::errc()) decline();
  // buf holds d[.ddd]e±XX
  std::string digits;
  const char* q = buf;
  for (; q < r.ptr && *q != 'e'; q++)
    if (*q != '.') digits.push_back(*q);
  if (q >= r.ptr) decline();
  *r.ptr = '\0';
  const int e10 = std::atoi(q + 1);
  const int k = int(digits.size()), n = e10 + 1;
  if (k <= n && n <= 21) {
    s += digits;
    s.append(size_t(n - k), '0');
  } else if (0 < n && n <= 21) {
    s.append(digits, 0, size_t(n));
    s.push_back('.');
    s.append(digits, size_t(n), std::string::npos);
  } else if (-6 < n && n <= 0) {
    s += "0.";
    s.append(size_t(-n), '0');
    s += digits;
  } else {
    s.push_back(digits[0]);
    if (k > 1) {
      s.push_back('.');
      s.append(digits, 1, std::string::npos);
    }
    s.push_back('e');
    s.push_back(n - 1 < 0 ? '-' : '+');
    s += std::to_string(n - 1 < 0 ? 1 - n : n - 1);
  }
}

void json_value(const Prog& g, int32_t n, Cursor& c, std::string& s, int depth) {
  if (depth > MAX_DEPTH) decline();
  switch (g.kind(n)) {
    case K_NULL:
      s += "null";
      return;
    case K_BOOLEAN:
      if (c.p >= c.end || *c.p > 1) decline();
      s += *c.p++ ? "true" : "false";
      return;
    case K_INT:
    case K_LONG:
      s += std::to_string(c.safe_long());
      return;
    case K_FLOAT:
      return json_number(s, c.f32());
    case K_DOUBLE:
      return json_number(s, c.f64());
    case K_STRING: {
      const int64_t len = c.length();
      if (!valid_utf8(c.p, size_t(len))) decline();
      json_string(s, c.p, size_t(len));
      c.p += len;
      return;
    }
    case K_ENUM: {
      const int64_t i = c.safe_long();
      if (i < 0 || i >= g.b(n)) decline();
      const int32_t* sym = g.syms + 2 * (g.a(n) + i);
      return json_string(s, g.sym_bytes + sym[0], size_t(sym[1]));
    }
    case K_UNION:
      return json_value(g, resolve(g, n, c), c, s, depth + 1);
    case K_RECORD: {
      // Field names are symbols c.. of the program, in field order (the order avsc builds the object in).
      const int32_t names = g.c(n);
      if (names < 0) decline();
      s.push_back('{');
      for (int32_t f = 0; f < g.b(n); f++) {
        if (f > 0) s.push_back(',');
        const int32_t* sym = g.syms + 2 * (names + f);
        json_string(s, g.sym_bytes + sym[0], size_t(sym[1]));
        s.push_back(':');
        json_value(g, g.refs[g.a(n) + f], c, s, depth + 1);
      }
      s.push_back('}');
      return;
    }
    case K_ARRAY: {
      s.push_back('[');
      bool first = true;
      for (int64_t count = c.block(); count != 0; count = c.block()) {
        if (count > c.end - c.p && g.kind(g.a(n)) != K_NULL) decline();
        for (int64_t i = 0; i < count; i++) {
          if (!first) s.push_back(',');
          first = false;
          json_value(g, g.a(n), c, s, depth + 1);
        }
      }
      s.push_back(']');
      return;
    }
    default:
      decline();  // bytes, fixed, maps: JSON.stringify writes them in ways not worth copying here
  }
}

// A JSON column: the same Avro bytes as the memo's last for this column give the same JSON.
void write_json(const Prog& g, int32_t index, const uint8_t* from, const uint8_t* to, Out& o, TcJsonMemo* memo) {
  const size_t n = size_t(to - from);
  TcJsonMemo::Entry* hit = nullptr;
  if (memo) {
    for (auto& e : memo->entries)
      if (e.column == index) hit = &e;
    if (hit && hit->avro.size() == n && std::memcmp(hit->avro.data(), from, n) == 0) return o.bytes(hit->json.data(), hit->json.size());
  }
  static thread_local std::string json;
  json.clear();
  Cursor c{from, to};
  json_value(g, resolve(g, g.leaves[g.cols[5 * index + 1]], c), c, json, 1);
  if (memo) {
    if (!hit) hit = &memo->entries.emplace_back(TcJsonMemo::Entry{index, {}, {}});
    hit->avro.assign(reinterpret_cast<const char*>(from), n);
    hit->json = json;
  }
  o.bytes(json.data(), json.size());
}

void write_column(const Prog& g, int32_t index, const uint8_t* const* at, const int64_t* counts, const uint8_t* end, Out& o, TcJsonMemo* memo) {
  const int32_t* col = g.cols + 5 * index;
  const int32_t mode = col[0], leaf = col[1], target = col[2], flags = col[3], field = col[4];
  if (mode == M_JSON) return write_json(g, index, at[leaf], at[leaf + 1], o, memo);  // at[leaf + 1]: where the field ends
  Cursor c{at[leaf], end};
  const int32_t n = resolve(g, g.leaves[leaf], c);
  const bool is_null = g.kind(n) == K_NULL;
  if (mode == M_LENGTH) {
    if (is_null || g.kind(n) != K_ARRAY) decline();
    return write_integer(target, counts[leaf], o);  // the general path writes `array.length`
  }
  if (flags & F_ARRAY) {
    if (is_null) return o.varuint(0);  // a null array is written as [] (the general path's rule)
    if (g.kind(n) != K_ARRAY) decline();
    if (mode == M_EACH) return write_each(g, n, field, target, counts[leaf], c, o);
    return write_array(g, n, target, counts[leaf], c, o);
  }
  if (is_null) {
    if (flags & F_NULLABLE) return o.put(uint8_t(1));
    if (target == T_STRING) return o.varuint(0);  // null → '' (the general path's rule)
    decline();                                    // a null number: the general path writes the default
  }
  if (flags & F_NULLABLE) o.put(uint8_t(0));
  write_value(g, n, target, c, o);
}

}  // namespace

void tc_validate(const TcProgram& p) {
  const int32_t* w = p.words;
  if (p.length < TC_HEADER_WORDS || w[TC_MAGIC] != TC_MAGIC_VALUE) invalid("transcode: not a transcoder program");
  auto section = [&](int off, int count, int width, const char* what) {
    const int64_t o = w[off], n = w[count];
    if (o < TC_HEADER_WORDS || n < 0 || o + n * width > int64_t(p.length))
      invalid(std::string("transcode: program's ") + what + " section is out of range");
  };
  section(TC_NODES, TC_NODE_COUNT, 4, "nodes");
  section(TC_REFS, TC_REF_COUNT, 1, "refs");
  section(TC_LEAVES, TC_LEAF_COUNT, 1, "leaves");
  section(TC_COLUMNS, TC_COLUMN_COUNT, 5, "columns");
  section(TC_SYMBOLS, TC_SYMBOL_COUNT, 2, "symbols");
  const Prog g(p);
  if (g.leaf_count > MAX_LEAVES) invalid("transcode: too many leaves");
  for (int32_t n = 0; n < g.node_count; n++) {
    const int32_t k = g.kind(n), a = g.a(n), b = g.b(n);
    if (k < 0 || k >= K_KIND_COUNT) invalid("transcode: node " + std::to_string(n) + " has an unknown kind");
    const bool ok = (k == K_ARRAY || k == K_MAP)          ? a >= 0 && a < g.node_count
                    : k == K_RECORD                     ? a >= 0 && b >= 0 && int64_t(a) + b <= g.ref_count &&
                                                              (g.c(n) < 0 || int64_t(g.c(n)) + b <= g.sym_count)
                    : k == K_UNION                      ? a >= 0 && b >= 0 && int64_t(a) + b <= g.ref_count
                    : k == K_ENUM                       ? a >= 0 && b >= 0 && int64_t(a) + b <= g.sym_count
                    : k == K_FIXED                      ? a >= 0
                                                        : true;
    if (!ok) invalid("transcode: node " + std::to_string(n) + " refers outside the program");
  }
  for (int32_t i = 0; i < g.ref_count; i++)
    if (g.refs[i] < 0 || g.refs[i] >= g.node_count) invalid("transcode: a reference is out of range");
  for (int32_t i = 0; i < g.leaf_count; i++)
    if (g.leaves[i] < 0 || g.leaves[i] >= g.node_count) invalid("transcode: a leaf is out of range");
  for (int32_t i = 0; i < g.sym_count; i++)
    if (g.syms[2 * i] < 0 || g.syms[2 * i + 1] < 0 || int64_t(g.syms[2 * i]) + g.syms[2 * i + 1] > int64_t(p.symbols_length))
      invalid("transcode: a symbol is out of range");
  for (int32_t i = 0; i < g.col_count; i++) {
    const int32_t* c = g.cols + 5 * i;
    const bool ok = c[0] >= M_VALUE && c[0] <= M_JSON && c[1] >= 0 && c[1] < g.leaf_count && c[2] >= T_U8 &&
                    c[2] < T_TARGET_END && c[3] >= 0 && c[3] <= (F_NULLABLE | F_ARRAY) && c[4] >= 0 &&
                    !((c[3] & F_NULLABLE) && (c[3] & F_ARRAY)) && (c[0] != M_EACH || (c[3] & F_ARRAY)) &&
                    (c[0] != M_JSON || (c[2] == T_STRING && c[3] == 0));
    if (!ok) invalid("transcode: column op " + std::to_string(i) + " is invalid");
  }
}

int tc_transcode(const TcProgram& p, const uint8_t* record, size_t length, uint8_t* out, size_t capacity, size_t* pos,
                 TcJsonMemo* memo) {
  const Prog g(p);
  const uint8_t* at[MAX_LEAVES + 1];
  int64_t counts[MAX_LEAVES];
  Out o{out + *pos, out + capacity};
  try {
    Cursor c{record, record + length};
    for (int32_t i = 0; i < g.leaf_count; i++) {
      at[i] = c.p;
      // Arrays are counted on the way (their columns need the count before the items).
      const int32_t n = resolve(g, g.leaves[i], c);
      counts[i] = 0;
      if (g.kind(n) != K_ARRAY) {
        skip(g, n, c, 0);
        continue;
      }
      int64_t total = 0;
      for (int64_t count = c.block(); count != 0; count = c.block()) {
        total += count;
        skip_items(g, g.a(n), count, c, 0);
      }
      counts[i] = total;
    }
    if (c.p != c.end) decline();  // trailing bytes: not a record of this schema
    at[g.leaf_count] = c.end;
    for (int32_t i = 0; i < g.col_count; i++) write_column(g, i, at, counts, c.end, o, memo);
  } catch (const Decline&) {
    return 0;
  } catch (const NoRoom&) {
    return -1;
  }
  *pos = size_t(o.p - out);
  return 1;
}

}  // namespace rls
