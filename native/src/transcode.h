// Avro record bytes → ClickHouse RowBinary rows, driven by a program compiled in TypeScript
// (consumers/traces/transcode.ts): the trace sink's fast path. Pure compute, no N-API here.
//
// The program (int32 words) describes the writer schema as flat nodes, the record's leaf fields in encoding
// order (a record's nested records are inline in Avro, so their fields are leaves too), and one op per table
// column naming the leaf it reads and the column's type. A record is read once to find where every leaf
// starts, then the columns are written in table order from those positions. Anything the general path would
// convert (a null in a non-nullable number, a non-finite float, an integer out of range, invalid UTF-8) or a
// damaged record (truncated, trailing bytes, a bad union branch) declines the record: nothing is written
// and the caller takes the general path, which applies the rules or reports the record.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rls {

// Layout of the program header (word indices), shared with consumers/traces/transcode.ts.
enum TcHeader : int {
  TC_MAGIC = 0,       // TC_MAGIC_VALUE
  TC_NODES = 1,       // offset of the nodes (4 words each: kind, a, b, c)
  TC_NODE_COUNT = 2,
  TC_REFS = 3,        // offset of node references (union branches, record fields)
  TC_REF_COUNT = 4,
  TC_LEAVES = 5,      // offset of the leaf node indices, in encoding order
  TC_LEAF_COUNT = 6,
  TC_COLUMNS = 7,     // offset of the column ops (5 words each: mode, leaf, target, flags, field)
  TC_COLUMN_COUNT = 8,
  TC_SYMBOLS = 9,     // offset of symbols: enum symbols and record field names (2 words each: byte offset, length)
  TC_SYMBOL_COUNT = 10,
  TC_HEADER_WORDS = 11,
};
constexpr int32_t TC_MAGIC_VALUE = 0x52425431;  // "RBT1"

enum TcKind : int32_t {
  K_NULL = 0, K_BOOLEAN, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_STRING, K_BYTES, K_ENUM, K_FIXED,
  K_ARRAY,   // a = item node
  K_MAP,     // a = value node
  K_UNION,   // a = first ref, b = branch count
  K_RECORD,  // a = first ref, b = field count, c = first field-name symbol (-1: none)
  K_KIND_COUNT,
};

enum TcMode : int32_t { M_VALUE = 0, M_LENGTH = 1, M_EACH = 2, M_JSON = 3 };

enum TcTarget : int32_t {
  T_U8 = 1, T_I8, T_U16, T_I16, T_U32, T_I32, T_I64, T_U64, T_F32, T_F64, T_DATETIME, T_STRING, T_TARGET_END,
};

enum TcFlags : int32_t { F_NULLABLE = 1, F_ARRAY = 2 };

struct TcProgram {
  const int32_t* words;
  size_t length;
  const uint8_t* symbols;
  size_t symbols_length;
};

// Throws NativeError (invalid argument) naming the first inconsistency: every index in range, every column
// op of a supported shape. Run once per call, so a transcode never reads outside the program.
void tc_validate(const TcProgram& p);

// The JSON a program's columns wrote last, by the Avro bytes of their field: the records of a run repeat their
// tools and sampling settings, and formatting those again would make a TrajectoryStarted record cost several
// times a turn. Holds for one program only: make one per call.
struct TcJsonMemo {
  struct Entry {
    int32_t column;
    std::string avro, json;
  };
  std::vector<Entry> entries;
};

// Appends the row of one Avro record (body bytes) at out[*pos], out having `capacity` bytes. 1 and *pos
// advanced when written; 0 when the record declines, -1 when out lacks room (nothing written either way).
int tc_transcode(const TcProgram& p, const uint8_t* record, size_t length, uint8_t* out, size_t capacity, size_t* pos,
                 TcJsonMemo* memo = nullptr);

}  // namespace rls
