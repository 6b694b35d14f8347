// RowBinary rows → one block of ClickHouse's Native format: the same values, laid out by column. The engine
// reads a Native column in bulk (an array column is its offsets and one run of items), where RowBinary makes it
// parse every row and every array item on its own, so the engine's insert CPU a row drops for every table, most
// for the wide array tables; the conversion runs off the sink's main thread (figures in docs/benchmarks.md).
// Pure compute, no N-API here.
//
// Native's layout, as ClickHouse reads it without a client revision (the Native input format): varuint
// column count, varuint row count, then each column: its name and type as strings, then its data. A String
// is varuint length + bytes (as in RowBinary); a Nullable column is one null-map byte a row, then the values
// (a type's default where null); an array column is its cumulative end offsets (UInt64 a row), then its items.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rls {

// One column's shape in RowBinary. kind: NB_FIXED (width bytes, little-endian) or NB_STRING. flags: NB_NULLABLE
// (a null-flag byte first), NB_ARRAY (varuint length, then the items). Arrays of Nullable are not supported.
enum NbKind : int32_t { NB_FIXED = 0, NB_STRING = 1 };
enum NbFlags : int32_t { NB_NULLABLE = 1, NB_ARRAY = 2 };

struct NbColumn {
  int32_t kind;
  int32_t width;  // bytes of a fixed value (1, 2, 4 or 8)
  int32_t flags;
  const uint8_t* head;  // the column's Native header: its name and type, each varuint length + bytes
  size_t head_length;
};

// A column of the table's sorting key, in key order: how its values compare. NB_KEY_BYTES: a String, by bytes
// then length (ClickHouse's order for String and LowCardinality(String)); NB_KEY_UNSIGNED / NB_KEY_SIGNED: a
// fixed-width integer (DateTime64 is signed). Key columns are neither Nullable nor arrays.
enum NbKeyKind : int32_t { NB_KEY_BYTES = 0, NB_KEY_UNSIGNED = 1, NB_KEY_SIGNED = 2 };
struct NbKey {
  int32_t column;
  int32_t kind;
};

// Where a block's parts lie: the data bytes of each column, and the block's size. With a sorting key, also
// where each row starts in the payload and the order to write them in.
struct NbPlan {
  size_t rows = 0;
  std::vector<size_t> data;
  size_t size = 0;
  std::vector<size_t> row_starts;  // rows + 1 entries when sorted, else empty
  std::vector<uint32_t> order;     // rows entries when sorted, else empty
};

// Pass 1: checks `rows` RowBinary rows in rb[0, length) and sizes their Native block. Throws NativeError
// naming the column and row when the rows do not fill rb exactly (truncated, trailing bytes, a null flag other
// than 0/1, an impossible length): the payload is the project's own output, so that is a bug to report, not a
// row to skip.
//
// With keys, the rows are also put in the order of the table's sorting key (stable: equal keys keep their
// order). The engine checks whether an inserted block is already in key order and, if so, skips sorting it and
// permuting every column: inserting a synthetic run cost 18.16's process 5.3 → 2.9 CPU-µs a row, and chDB's
// insert threads 2.7 → 1.6. Row order within one insert means nothing to the tables (ReplacingMergeTree by
// version; reads order explicitly).
NbPlan nb_plan(const std::vector<NbColumn>& columns, const std::vector<NbKey>& keys, const uint8_t* rb, size_t length,
               size_t rows);

// Pass 2: writes the block into out (plan.size bytes). Every write is bounded by its part, so rb changed since
// the plan throws instead of writing out of bounds.
void nb_fill(const std::vector<NbColumn>& columns, const uint8_t* rb, size_t length, const NbPlan& plan, uint8_t* out);

}  // namespace rls
