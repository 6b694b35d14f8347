// N-API glue for process-level helpers: the BLAS peak measurement used by the benchmark, CUDA availability.
#include "glue_misc.h"

#include "device.h"
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

}  // namespace rls
