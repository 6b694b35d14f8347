// N-API glue for the trace sink's Avro → RowBinary transcoder: one call transcodes a batch of records, so the
// cost of crossing into C++ is paid per poll, not per record.
#include "glue_traces.h"

#include "glue.h"
#include "transcode.h"

namespace rls {


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

}  // namespace rls
