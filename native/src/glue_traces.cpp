// N-API glue for the trace sink: the Avro → RowBinary transcoder, where one call transcodes a batch of records so the
// cost of crossing into C++ is paid per poll, not per record.
#include "glue_traces.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "glue.h"
#include "native_block.h"
#include "transcode.h"

namespace rls {
namespace {

// Creates (or truncates) path and writes bytes to it; throws naming the path and the system's reason.
void write_file(const std::string& path, const uint8_t* bytes, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) invalid("cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd, bytes + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      invalid("cannot write " + path + ": " + why);
    }
    done += size_t(w);
  }
  if (::close(fd) != 0) invalid("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace


// transcode(program, symbols, base, starts, lengths, from, to, headerBytes, out, state, status) -> index of the
// first record not handled. Records from..to-1 lie in `base` (a view of their whole ArrayBuffer): record i at
// byte starts[i], lengths[i] bytes; its Avro body after `headerBytes` is transcoded into out at state[0]
// (advanced); status[i] = 1 when written (state[1] counts them), 0 when it declined. Stops early, returning that
// index, when out lacks room for the next record: the caller grows out and calls again from there.
// Records are passed as positions, not Buffer objects: reading each object through N-API cost more than
// transcoding it.
Napi::Value Transcode(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const View<int32_t> words = i32_arg(info[0], "program");
    const View<uint8_t> symbols = u8_arg(info[1], "symbols");
    const View<uint8_t> base = u8_arg(info[2], "base");
    const View<double> starts = f64_arg(info[3], "starts");
    const View<int32_t> lengths = i32_arg(info[4], "lengths");
    const double from = num_arg(info[5], "from"), to = num_arg(info[6], "to"), header = num_arg(info[7], "headerBytes");
    const View<uint8_t> out = u8_arg(info[8], "out");
    const View<double> state_view = f64_arg(info[9], "state");
    if (state_view.length < 2) invalid("state must be a Float64Array of 2");
    double* state = state_view.data;
    const View<uint8_t> status_view = u8_arg(info[10], "status");
    uint8_t* status = status_view.data;
    if (!(from >= 0 && from <= to && to <= double(starts.length) && to <= double(lengths.length) &&
          to <= double(status_view.length) && header >= 0))
      invalid("transcode: from/to/headerBytes out of range for starts, lengths and status");
    if (state[0] < 0 || state[0] > double(out.length)) invalid("state[0] (the output position) is out of range");

    const TcProgram program{words.data, words.length, symbols.data, symbols.length};
    tc_validate(program);
    uint8_t* dst = out.data;
    size_t pos = size_t(state[0]);
    double rows = state[1];
    size_t i = size_t(from);
    TcJsonMemo memo;
    for (; i < size_t(to); i++) {
      status[i] = 0;
      const double start = starts.data[i];
      const int32_t len = lengths.data[i];
      if (!(start >= 0 && len >= 0 && start + len <= double(base.length))) invalid("transcode: a record lies outside base");
      if (size_t(len) < size_t(header)) continue;
      const int r = tc_transcode(program, base.data + size_t(start) + size_t(header), size_t(len) - size_t(header), dst, out.length, &pos, &memo);
      if (r < 0) break;  // out is full: the caller grows it and calls again from this record
      if (r > 0) {
        status[i] = 1;
        rows++;
      }
    }
    state[0] = double(pos);
    state[1] = rows;
    return Napi::Number::New(info.Env(), double(i));
  });
}

// The arguments of a RowBinary → Native call, from info[first]: payload, rows, layout, heads, headEnds, keys.
// layout has 3 words a column (kind, width, flags); column i's Native header (name and type strings) is
// heads[headEnds[i-1], headEnds[i]); keys has 2 words a sorting-key column (column index, NbKeyKind), in key
// order, and may be empty (the rows keep their order).
struct BlockArgs {
  View<uint8_t> payload;
  size_t rows = 0;
  std::vector<NbColumn> columns;
  std::vector<NbKey> keys;
  Napi::Value heads;
};

BlockArgs block_args(const Napi::CallbackInfo& info, size_t first) {
  BlockArgs a;
  a.payload = u8_arg(info[first], "payload");
  const double rows = num_arg(info[first + 1], "rows");
  const View<int32_t> layout = i32_arg(info[first + 2], "layout");
  const View<uint8_t> heads = u8_arg(info[first + 3], "heads");
  const View<int32_t> head_ends = i32_arg(info[first + 4], "headEnds");
  if (!(rows >= 0 && rows <= 9007199254740991.0 && rows == double(size_t(rows)))) invalid("rows must be a count");
  if (layout.length % 3 != 0 || layout.length / 3 != head_ends.length)
    invalid("layout must have 3 words for each entry of headEnds");
  a.rows = size_t(rows);
  a.columns.resize(head_ends.length);
  int32_t prev = 0;
  for (size_t i = 0; i < a.columns.size(); i++) {
    const int32_t end = head_ends.data[i];
    if (end < prev || size_t(end) > heads.length) invalid("headEnds must rise within heads");
    a.columns[i] = NbColumn{layout.data[3 * i], layout.data[3 * i + 1], layout.data[3 * i + 2], heads.data + prev,
                            size_t(end - prev)};
    prev = end;
  }
  const View<int32_t> keys = i32_arg(info[first + 5], "keys");
  if (keys.length % 2 != 0) invalid("keys must have 2 words a key column");
  for (size_t k = 0; k + 1 < keys.length; k += 2) a.keys.push_back(NbKey{keys.data[k], keys.data[k + 1]});
  a.heads = info[first + 3];
  return a;
}

// Queues job on the libuv pool (a batch is tens of MB, and the sink's main thread is its bottleneck), keeping
// the payload and the headers alive until it settles.
Napi::Value queue_block_job(Napi::Env env, const BlockArgs& a, std::function<void()> job,
                            std::function<Napi::Value(Napi::Env)> done) {
  auto* w = new JobWorker(env, std::move(job), std::move(done), [] {}, {a.payload.holder, a.heads});
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

// nativeBlock(payload, rows, layout, heads, headEnds, keys) -> Promise<Buffer>: the Native block of `rows` RowBinary
// rows (native_block.h), for a request body. Sized first, then filled in place: one allocation of the exact
// size, which the Buffer then owns.
Napi::Value NativeBlock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    const BlockArgs a = block_args(info, 0);
    struct Block {
      uint8_t* bytes = nullptr;
      size_t size = 0;
      ~Block() { delete[] bytes; }  // a block never handed over (the promise settled otherwise)
    };
    auto out = std::make_shared<Block>();
    auto job = [out, columns = a.columns, keys = a.keys, rb = a.payload.data, length = a.payload.length, n = a.rows] {
      const NbPlan plan = nb_plan(columns, keys, rb, length, n);
      std::unique_ptr<uint8_t[]> bytes(new uint8_t[plan.size]);
      nb_fill(columns, rb, length, plan, bytes.get());
      out->bytes = bytes.release();
      out->size = plan.size;
    };
    auto done = [out](Napi::Env e) -> Napi::Value {
      uint8_t* bytes = std::exchange(out->bytes, nullptr);
      return Napi::Buffer<uint8_t>::New(e, bytes, out->size, [](Napi::Env, uint8_t* b) { delete[] b; });
    };
    return queue_block_job(env, a, std::move(job), std::move(done));
  });
}

// writeNativeBlock(path, payload, rows, layout, heads, headEnds, keys) -> Promise<number>: writes the Native block of
// `rows` RowBinary rows to a new file at path, and resolves with its size. Through a buffer each pool thread
// keeps (up to 256 MiB), so a batch's block is not faulted into fresh pages each time (nativeBlock's Buffers
// are).
Napi::Value WriteNativeBlock(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    if (!info[0].IsString()) invalid("path must be a string");
    std::string path = info[0].As<Napi::String>().Utf8Value();
    const BlockArgs a = block_args(info, 1);
    auto size = std::make_shared<size_t>(0);
    auto job = [size, path, columns = a.columns, keys = a.keys, rb = a.payload.data, length = a.payload.length, n = a.rows] {
      thread_local std::vector<uint8_t> block;
      const NbPlan plan = nb_plan(columns, keys, rb, length, n);
      if (block.size() < plan.size) block.resize(plan.size);
      nb_fill(columns, rb, length, plan, block.data());
      write_file(path, block.data(), plan.size);
      *size = plan.size;
      // Kept for the next block, unless this one was exceptional.
      if (block.size() > (size_t(256) << 20)) std::vector<uint8_t>().swap(block);
    };
    auto done = [size](Napi::Env e) -> Napi::Value { return Napi::Number::New(e, double(*size)); };
    return queue_block_job(env, a, std::move(job), std::move(done));
  });
}

}  // namespace rls
