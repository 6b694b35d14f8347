// RowBinary → Native block (see native_block.h).
#include "native_block.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "errors.h"

namespace rls {
namespace {

struct Malformed {
  const char* what;
};

struct Reader {
  const uint8_t* p;
  const uint8_t* end;

  uint64_t varuint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) throw Malformed{"a length runs past the end"};
      const uint8_t b = *p++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw Malformed{"a length is longer than 10 bytes"};
  }
  const uint8_t* take(uint64_t n) {
    if (n > uint64_t(end - p)) throw Malformed{"a value runs past the end"};
    const uint8_t* r = p;
    p += n;
    return r;
  }
  // One String (varuint length + bytes): its whole encoding, which is the same in Native.
  void skip_string() { take(varuint()); }
};

// Pass 1 (plan): where each column's parts will lie in the block, from checking every value of every row.
// Pass 2 (fill): the values copied there, a row at a time (each column's parts are filled front to back, so
// the block is written in ~40 sequential streams rather than gathered column by column from the payload).
// Sizing first lets the block be filled in place, in one buffer of its exact size: per-column vectors grown for
// each block and then joined cost markedly more a row, much of it system time (page faults).
struct Part {
  size_t nulls = 0, offsets = 0, data = 0;  // byte positions in the block (pass 2: write cursors)
};

void put_varuint(uint8_t*& o, uint64_t n) {
  while (n >= 0x80) {
    *o++ = uint8_t(n | 0x80);
    n >>= 7;
  }
  *o++ = uint8_t(n);
}

size_t varuint_size(uint64_t n) {
  size_t k = 1;
  while (n >= 0x80) n >>= 7, k++;
  return k;
}

// The column's name, read back from its header, for error messages.
std::string name_of(const NbColumn& c) {
  Reader r{c.head, c.head + c.head_length};
  try {
    const uint64_t n = r.varuint();
    return std::string(reinterpret_cast<const char*>(r.take(n)), size_t(n));
  } catch (const Malformed&) {
    return "?";
  }
}

// The bytes of one value (after its null flag) starting at r.p; advances r past them.
size_t value_extent(const NbColumn& c, Reader& r, uint64_t* items) {
  const uint8_t* start = r.p;
  if (c.flags & NB_ARRAY) {
    const uint64_t n = r.varuint();
    *items = n;
    start = r.p;
    if (c.kind == NB_STRING) {
      for (uint64_t i = 0; i < n; i++) r.skip_string();
    } else {
      if (n > uint64_t(r.end - r.p) / uint64_t(c.width)) throw Malformed{"an array runs past the end"};
      r.take(n * uint64_t(c.width));
    }
  } else if (c.kind == NB_STRING) {
    r.skip_string();
  } else {
    r.take(uint64_t(c.width));
  }
  return size_t(r.p - start);
}

void check_columns(const std::vector<NbColumn>& columns) {
  for (const NbColumn& c : columns) {
    if (c.kind != NB_FIXED && c.kind != NB_STRING) invalid("native block: a column kind is neither fixed nor string");
    if (c.kind == NB_FIXED && c.width != 1 && c.width != 2 && c.width != 4 && c.width != 8)
      invalid("native block: a fixed column's width must be 1, 2, 4 or 8");
    if ((c.flags & NB_NULLABLE) && (c.flags & NB_ARRAY)) invalid("native block: arrays of Nullable are not supported");
  }
}

size_t default_size(const NbColumn& c) { return c.kind == NB_STRING ? 1 : size_t(c.width); }

void check_keys(const std::vector<NbColumn>& columns, const std::vector<NbKey>& keys) {
  for (const NbKey& k : keys) {
    if (k.column < 0 || size_t(k.column) >= columns.size()) invalid("native block: a key column is out of range");
    const NbColumn& c = columns[size_t(k.column)];
    if (c.flags != 0) invalid("native block: a key column is Nullable or an array");
    const bool ok = k.kind == NB_KEY_BYTES ? c.kind == NB_STRING
                                           : (k.kind == NB_KEY_UNSIGNED || k.kind == NB_KEY_SIGNED) && c.kind == NB_FIXED;
    if (!ok) invalid("native block: a key's kind does not fit its column");
  }
}

// A fixed-width little-endian integer as int64 (signed) or uint64 (unsigned) bits.
uint64_t load_key(const uint8_t* p, int32_t width, bool is_signed) {
  uint64_t v = 0;
  std::memcpy(&v, p, size_t(width));  // little-endian host (x86-64, arm64)
  if (is_signed && width < 8 && (v >> (8 * width - 1)) & 1) v |= ~uint64_t(0) << (8 * width);
  return v;
}

// The rows' order by the sorting key (see nb_plan), or empty when every key column is constant in the batch.
// key_at, key_len: where key k of row r lies in rb (at r * keys + k), and a string's length.
std::vector<uint32_t> key_order(const std::vector<NbColumn>& columns, const std::vector<NbKey>& keys, const uint8_t* rb,
                                const std::vector<size_t>& key_at, const std::vector<uint32_t>& key_len, size_t rows) {
  const size_t nk = keys.size();
  // Key k of rows a and b: <0, 0, >0.
  auto compare = [&](size_t k, uint32_t a, uint32_t b) -> int {
    const uint8_t* pa = rb + key_at[size_t(a) * nk + k];
    const uint8_t* pb = rb + key_at[size_t(b) * nk + k];
    if (keys[k].kind == NB_KEY_BYTES) {
      const uint32_t la = key_len[size_t(a) * nk + k], lb = key_len[size_t(b) * nk + k];
      const int c = std::memcmp(pa, pb, std::min(la, lb));
      return c != 0 ? c : (la < lb ? -1 : la > lb ? 1 : 0);
    }
    const int32_t w = columns[size_t(keys[k].column)].width;
    const bool is_signed = keys[k].kind == NB_KEY_SIGNED;
    const uint64_t va = load_key(pa, w, is_signed), vb = load_key(pb, w, is_signed);
    if (va == vb) return 0;
    return (is_signed ? int64_t(va) < int64_t(vb) : va < vb) ? -1 : 1;
  };
  // Leading key columns with one value in the whole batch (a run's id) order nothing: skip them.
  size_t k0 = 0;
  while (k0 < nk) {
    bool same = true;
    for (uint32_t r = 1; r < rows && same; r++) same = compare(k0, 0, r) == 0;
    if (!same) break;
    k0++;
  }
  if (k0 == nk) return {};
  // Sort on an 8-byte prefix of the first varying key (a string's first bytes, big-endian; an integer's value,
  // signed ones with the sign bit flipped), in one contiguous array; only runs with equal prefixes are compared
  // in full. Comparing in full from the start cost ~1 CPU-µs a row (the keys lie all over the payload), more
  // than the engine saved.
  const int32_t kind = keys[k0].kind;
  const int32_t w = columns[size_t(keys[k0].column)].width;
  std::vector<std::pair<uint64_t, uint32_t>> pre(rows);
  for (uint32_t r = 0; r < rows; r++) {
    const uint8_t* p = rb + key_at[size_t(r) * nk + k0];
    uint64_t v = 0;
    if (kind == NB_KEY_BYTES) {
      const uint32_t len = std::min<uint32_t>(key_len[size_t(r) * nk + k0], 8);
      for (uint32_t i = 0; i < len; i++) v |= uint64_t(p[i]) << (56 - 8 * i);
    } else {
      v = load_key(p, w, kind == NB_KEY_SIGNED);
      if (kind == NB_KEY_SIGNED) v ^= uint64_t(1) << 63;
    }
    pre[r] = {v, r};
  }
  std::sort(pre.begin(), pre.end());
  std::vector<uint32_t> order(rows);
  for (uint32_t r = 0; r < rows; r++) order[r] = pre[r].second;
  const auto full = [&](uint32_t a, uint32_t b) {
    for (size_t k = k0; k < nk; k++) {
      const int c = compare(k, a, b);
      if (c != 0) return c < 0;
    }
    return false;
  };
  // Within a run of equal prefixes the rows are in arrival order (the pair's second half), so a stable sort
  // keeps equal keys in arrival order.
  for (size_t i = 0; i < rows;) {
    size_t j = i + 1;
    while (j < rows && pre[j].first == pre[i].first) j++;
    if (j - i > 1) std::stable_sort(order.begin() + long(i), order.begin() + long(j), full);
    i = j;
  }
  return order;
}

}  // namespace

NbPlan nb_plan(const std::vector<NbColumn>& columns, const std::vector<NbKey>& keys, const uint8_t* rb, size_t length,
               size_t rows) {
  check_columns(columns);
  check_keys(columns, keys);
  if (rows > UINT32_MAX) invalid("native block: too many rows");
  std::vector<size_t> data(columns.size(), 0);
  // With a key: where each row starts, and where each key value's bytes start (and, for strings, their length).
  const bool sorted = !keys.empty() && rows > 1;
  std::vector<size_t> row_starts, key_at;
  std::vector<uint32_t> key_len;
  std::vector<int32_t> key_slot(columns.size(), -1);
  if (sorted) {
    row_starts.reserve(rows + 1);
    key_at.resize(rows * keys.size());
    key_len.resize(rows * keys.size());
    for (size_t k = 0; k < keys.size(); k++) key_slot[size_t(keys[k].column)] = int32_t(k);
  }
  Reader r{rb, rb + length};
  uint64_t items = 0;
  for (size_t row = 0; row < rows; row++) {
    if (sorted) row_starts.push_back(size_t(r.p - rb));
    for (size_t i = 0; i < columns.size(); i++) {
      const NbColumn& c = columns[i];
      try {
        if (sorted && key_slot[i] >= 0) {
          const size_t at = row * keys.size() + size_t(key_slot[i]);
          Reader k = r;
          const uint64_t n = c.kind == NB_STRING ? k.varuint() : uint64_t(c.width);
          key_at[at] = size_t(k.p - rb);
          key_len[at] = uint32_t(std::min<uint64_t>(n, UINT32_MAX));
        }
        if (c.flags & NB_NULLABLE) {
          const uint8_t flag = *r.take(1);
          if (flag > 1) throw Malformed{"a null flag is neither 0 nor 1"};
          if (flag) {
            data[i] += default_size(c);
            continue;
          }
        }
        data[i] += value_extent(c, r, &items);
      } catch (const Malformed& m) {
        invalid("RowBinary → Native: column " + name_of(c) + " of row " + std::to_string(row) + " of " +
                std::to_string(rows) + ": " + m.what);
      }
    }
  }
  if (r.p != r.end)
    invalid("RowBinary → Native: " + std::to_string(r.end - r.p) + " bytes left after " + std::to_string(rows) +
            " rows");
  NbPlan plan;
  plan.rows = rows;
  plan.data = std::move(data);
  // No order when every key is constant in the batch: the fill reads the rows in sequence.
  if (sorted) plan.order = key_order(columns, keys, rb, key_at, key_len, rows);
  if (!plan.order.empty()) {
    row_starts.push_back(length);
    plan.row_starts = std::move(row_starts);
  }
  plan.size = varuint_size(columns.size()) + varuint_size(rows);
  for (size_t i = 0; i < columns.size(); i++) {
    const NbColumn& c = columns[i];
    plan.size += c.head_length + plan.data[i];
    if (c.flags & NB_NULLABLE) plan.size += rows;
    if (c.flags & NB_ARRAY) plan.size += rows * 8;
  }
  return plan;
}

void nb_fill(const std::vector<NbColumn>& columns, const uint8_t* rb, size_t length, const NbPlan& plan, uint8_t* out) {
  check_columns(columns);
  if (plan.data.size() != columns.size()) invalid("native block: the plan is for other columns");
  // The block's frame and each column's header, and where its parts start.
  std::vector<Part> parts(columns.size());
  std::vector<size_t> ends(columns.size());
  uint8_t* o = out;
  put_varuint(o, columns.size());
  put_varuint(o, plan.rows);
  size_t at = size_t(o - out);
  for (size_t i = 0; i < columns.size(); i++) {
    const NbColumn& c = columns[i];
    std::memcpy(out + at, c.head, c.head_length);
    at += c.head_length;
    parts[i].nulls = at;
    if (c.flags & NB_NULLABLE) at += plan.rows;
    parts[i].offsets = at;
    if (c.flags & NB_ARRAY) at += plan.rows * 8;
    parts[i].data = at;
    at += plan.data[i];
    ends[i] = at;
  }
  if (at != plan.size) invalid("native block: the plan's size does not add up");
  // The payload was checked by nb_plan; it is read again with the same checks, and every write is bounded by
  // its column's end, so a payload changed in between (a bug) fails here instead of writing out of bounds.
  const bool sorted = !plan.order.empty();
  if (sorted && (plan.order.size() != plan.rows || plan.row_starts.size() != plan.rows + 1 || plan.row_starts.back() != length))
    invalid("native block: the plan's row order does not fit the payload");
  Reader r{rb, rb + length};
  std::vector<uint64_t> running(columns.size(), 0);
  uint64_t items = 0;
  try {
    for (size_t row = 0; row < plan.rows; row++) {
      if (sorted) {
        // The row's own bytes, wherever the order puts it.
        const uint32_t from = plan.order[row];
        if (from >= plan.rows || plan.row_starts[from] > plan.row_starts[from + 1]) throw Malformed{"changed while converted"};
        r = Reader{rb + plan.row_starts[from], rb + plan.row_starts[from + 1]};
      }
      for (size_t i = 0; i < columns.size(); i++) {
        const NbColumn& c = columns[i];
        Part& p = parts[i];
        if (c.flags & NB_NULLABLE) {
          const uint8_t flag = *r.take(1);
          out[p.nulls++] = flag;
          if (flag) {
            const size_t n = default_size(c);
            if (n > ends[i] - p.data) throw Malformed{"changed while converted"};
            std::memset(out + p.data, 0, n);
            p.data += n;
            continue;
          }
        }
        const size_t n = value_extent(c, r, &items);
        const uint8_t* from = r.p - n;
        if (c.flags & NB_ARRAY) {
          running[i] += items;
          std::memcpy(out + p.offsets, &running[i], 8);  // UInt64 little-endian, as this host stores it
          p.offsets += 8;
        }
        if (n > ends[i] - p.data) throw Malformed{"changed while converted"};
        switch (n) {  // most values are one fixed-width number: a constant-size copy
          case 1: out[p.data] = *from; break;
          case 4: std::memcpy(out + p.data, from, 4); break;
          case 8: std::memcpy(out + p.data, from, 8); break;
          default: std::memcpy(out + p.data, from, n);
        }
        p.data += n;
      }
      if (sorted && r.p != r.end) throw Malformed{"changed while converted"};
    }
  } catch (const Malformed& m) {
    invalid(std::string("RowBinary → Native: the payload ") + m.what);
  }
  for (size_t i = 0; i < columns.size(); i++)
    if (parts[i].data != ends[i]) invalid("RowBinary → Native: the payload changed while converted");
}

}  // namespace rls
