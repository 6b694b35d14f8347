// Error checks for the CUDA layer: every runtime and cuBLAS call and every launch goes through one of these, and a
// failure becomes a NativeError naming the call (never an abort).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "../src/errors.h"

namespace rls::cuda {

[[noreturn]] inline void fail(const char* what, const char* detail, const char* file, int line) {
  throw NativeError(ErrCode::InvalidArgument, std::string("CUDA: ") + what + " failed: " + detail + " (" + file + ":" +
                                                  std::to_string(line) + ")");
}

}  // namespace rls::cuda

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t err_ = (call);                                                             \
    if (err_ != cudaSuccess) ::rls::cuda::fail(#call, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: launch-configuration errors now, asynchronous faults at the next synchronizing call.
#define LAUNCH_CHECK(name)                                                                 \
  do {                                                                                     \
    cudaError_t err_ = cudaGetLastError();                                                 \
    if (err_ != cudaSuccess) ::rls::cuda::fail(name, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t st_ = (call);                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) ::rls::cuda::fail(#call, cublasGetStatusString(st_), __FILE__, __LINE__); \
  } while (0)
