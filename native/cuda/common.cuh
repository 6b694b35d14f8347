// What the CUDA op families (the .cu files beside this one) share: the bf16 type, the grid of a grid-stride launch,
// a block-wide sum, and the growable device buffer the launchers that need scratch take from the kernels object.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "check.cuh"

namespace rls::cuda {

using bf16 = __nv_bfloat16;

inline unsigned blocks_for(size_t n, int per) { return (unsigned)std::min<size_t>((n + per - 1) / per, 1u << 30); }

__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < nw; i++) s += red[i];
  return s;
}

// A growable device buffer (grows only; freed with the kernels object). A reallocation bumps *gen (where set), so
// that CUDA graphs captured over the old address are dropped.
struct Scratch {
  void* p = nullptr;
  size_t bytes = 0;
  uint64_t* gen = nullptr;
  void* get(size_t want) {
    if (want > bytes) {
      if (gen) ++*gen;
      if (p) CUDA_CHECK(cudaFree(p));
      p = nullptr;
      bytes = 0;
      CUDA_CHECK(cudaMalloc(&p, want));
      bytes = want;
    }
    return p;
  }
  ~Scratch() {
    if (p) cudaFree(p);
  }
};

}  // namespace rls::cuda
