// N-API glue for the trace sink's Avro → RowBinary transcoder: one call transcodes a batch of records, so the
// cost of crossing into C++ is paid per poll, not per record.
#include "glue_traces.h"

#include "glue.h"
#include "transcode.h"

namespace rls {

namespace {
struct Bytes {
  const uint8_t* data;
  size_t length;
};

Bytes bytes_arg(const Napi::Value& v, const char* what) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    invalid(std::string(what) + " must be a Buffer or Uint8Array");
  auto a = v.As<Napi::Uint8Array>();
  return {a.Data(), a.ElementLength()};
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
    const Bytes symbols = bytes_arg(info[1], "symbols");
    const Bytes base = bytes_arg(info[2], "base");
    if (!info[3].IsTypedArray() || info[3].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
      invalid("starts must be a Float64Array");
    const Napi::Float64Array starts = info[3].As<Napi::Float64Array>();
    const View<int32_t> lengths = i32_arg(info[4], "lengths");
    const double from = num_arg(info[5], "from"), to = num_arg(info[6], "to"), header = num_arg(info[7], "headerBytes");
    const Bytes out = bytes_arg(info[8], "out");
    if (!info[9].IsTypedArray() || info[9].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array ||
        info[9].As<Napi::TypedArray>().ElementLength() < 2)
      invalid("state must be a Float64Array of 2");
    double* state = info[9].As<Napi::Float64Array>().Data();
    const Bytes status_bytes = bytes_arg(info[10], "status");
    uint8_t* status = const_cast<uint8_t*>(status_bytes.data);
    if (!(from >= 0 && from <= to && to <= double(starts.ElementLength()) && to <= double(lengths.length) &&
          to <= double(status_bytes.length) && header >= 0))
      invalid("transcode: from/to/headerBytes out of range for starts, lengths and status");
    if (state[0] < 0 || state[0] > double(out.length)) invalid("state[0] (the output position) is out of range");

    const TcProgram program{words.data, words.length, symbols.data, symbols.length};
    tc_validate(program);
    uint8_t* dst = const_cast<uint8_t*>(out.data);
    size_t pos = size_t(state[0]);
    double rows = state[1];
    size_t i = size_t(from);
    for (; i < size_t(to); i++) {
      status[i] = 0;
      const double start = starts[i];
      const int32_t len = lengths.data[i];
      if (!(start >= 0 && len >= 0 && start + len <= double(base.length))) invalid("transcode: a record lies outside base");
      if (size_t(len) < size_t(header)) continue;
      const int r = tc_transcode(program, base.data + size_t(start) + size_t(header), size_t(len) - size_t(header), dst, out.length, &pos);
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

}  // namespace rls
