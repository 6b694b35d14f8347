// N-API glue for process-level helpers: the BLAS peak measurement used by the benchmark, CUDA availability,
// the embedded log's frame checks.
#include "glue_misc.h"

#include <algorithm>

#include "device.h"
#include "frames.h"
#include "glue.h"

namespace rls {

// sgemmGflops(n, iters, threads) -> GFLOP/s of C[n,n] = A*B through the BLAS with its own threading.
Napi::Value SgemmGflops(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const double n = num_arg(info[0], "n"), iters = num_arg(info[1], "iters"), threads = num_arg(info[2], "threads");
    if (n < 16 || n > 16384 || iters < 1 || threads < 1) invalid("sgemmGflops: need 16 <= n <= 16384, iters >= 1, threads >= 1");
    return Napi::Number::New(info.Env(), cpu_sgemm_gflops((int)n, (int)iters, (int)threads));
  });
}

// cudaAvailable() -> true when this build has the CUDA layer and a GPU is usable.
Napi::Value CudaAvailable(const Napi::CallbackInfo& info) {
#ifdef RLSTREAM_CUDA
  return Napi::Boolean::New(info.Env(), cuda_device_count() > 0);
#else
  return Napi::Boolean::New(info.Env(), false);
#endif
}

// cudaMemory() -> { free, total } bytes of the GPU the CUDA layer uses, or null without one.
Napi::Value CudaMemory(const Napi::CallbackInfo& info) {
#ifdef RLSTREAM_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  if (cuda_memory(&free_bytes, &total_bytes)) {
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("free", Napi::Number::New(info.Env(), (double)free_bytes));
    o.Set("total", Napi::Number::New(info.Env(), (double)total_bytes));
    return o;
  }
#endif
  return info.Env().Null();
}

// crc32(buf, crc) -> CRC-32 of buf continued from crc, as node:zlib's crc32 (the log's checksum).
Napi::Value Crc32(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const View<uint8_t> buf = u8_arg(info[0], "buf");
    const double crc = num_arg(info[1], "crc");
    if (!(crc >= 0 && crc <= 4294967295.0)) invalid("crc must be a uint32");
    return Napi::Number::New(info.Env(), double(crc32_of(buf.data, buf.length, uint32_t(crc))));
  });
}

// sealFrames(buf, from, limit) -> writes the body CRC of every frame of buf[from, limit) (lengths written) and
// returns the CRC-32 of the range afterwards.
Napi::Value SealFrames(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const View<uint8_t> buf = u8_arg(info[0], "buf");
    const double from = num_arg(info[1], "from"), limit = num_arg(info[2], "limit");
    if (!(from >= 0 && from <= limit && limit <= double(buf.length))) invalid("sealFrames: range out of bounds");
    // The frames must tile the range: walk their lengths first, so a bad layout is an error, not a wrong CRC.
    const uint8_t* d = buf.data;
    size_t p = size_t(from);
    while (p < size_t(limit)) {
      if (size_t(limit) - p < 8) invalid("sealFrames: frames do not tile the range");
      const size_t len = (size_t(d[p]) << 24) | (size_t(d[p + 1]) << 16) | (size_t(d[p + 2]) << 8) | d[p + 3];
      if (size_t(limit) - p - 8 < len) invalid("sealFrames: frames do not tile the range");
      p += 8 + len;
    }
    return Napi::Number::New(info.Env(), double(seal_frames(buf.data, size_t(from), size_t(limit))));
  });
}

// checkFrames(buf, from, limit, maxRecords, minBody, maxBody, state) -> the position after the last whole,
// CRC-valid frame of buf[from, limit) (at most maxRecords); state[0] = the frames checked.
Napi::Value CheckFrames(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const View<uint8_t> buf = u8_arg(info[0], "buf");
    const double from = num_arg(info[1], "from"), limit = num_arg(info[2], "limit");
    const double max_records = num_arg(info[3], "maxRecords"), min_body = num_arg(info[4], "minBody"), max_body = num_arg(info[5], "maxBody");
    if (!(from >= 0 && from <= limit && limit <= double(buf.length) && max_records >= 0 && min_body >= 0 &&
          max_body >= min_body && max_body <= 4294967295.0))
      invalid("checkFrames: arguments out of range");
    const View<double> state = f64_arg(info[6], "state");
    if (state.length < 1) invalid("state must be a Float64Array of 1");
    size_t records = 0;
    const size_t end = check_frames(buf.data, size_t(from), size_t(limit), size_t(std::min(max_records, 1e15)),
                                    uint32_t(min_body), uint32_t(max_body), &records);
    state.data[0] = double(records);
    return Napi::Number::New(info.Env(), double(end));
  });
}

}  // namespace rls
