// Vector loads and stores of fp32 and bf16 shared by the CUDA translation units (device code only).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace rls {

// Two floats as one bf16 pair (lo in the low half), as mma operands and 32-bit stores take them.
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// V consecutive floats or bf16 moved as one access (2 or 4 floats, up to 8 bf16: 16 bytes), so that memory-bound
// kernels move whole vectors; their callers take the widest V that divides the row length.
template <int V> struct Word16;  // V bf16 as one memory word
template <> struct Word16<1> { using T = unsigned short; };
template <> struct Word16<2> { using T = uint32_t; };
template <> struct Word16<4> { using T = uint2; };
template <> struct Word16<8> { using T = uint4; };
template <int V>
__device__ __forceinline__ void load_v(float* x, const float* p) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int e = 0; e < V; e += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + e);
      x[e] = v.x, x[e + 1] = v.y, x[e + 2] = v.z, x[e + 3] = v.w;
    }
  } else if constexpr (V == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  } else {
#pragma unroll
    for (int e = 0; e < V; e++) x[e] = p[e];
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, const float* x) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int e = 0; e < V; e += 4) *reinterpret_cast<float4*>(p + e) = make_float4(x[e], x[e + 1], x[e + 2], x[e + 3]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
  } else {
#pragma unroll
    for (int e = 0; e < V; e++) p[e] = x[e];
  }
}
template <int V>
__device__ __forceinline__ void load_v(float* x, const __nv_bfloat16* p) {
  const typename Word16<V>::T w = *reinterpret_cast<const typename Word16<V>::T*>(p);
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&w);
#pragma unroll
  for (int e = 0; e < V; e++) x[e] = __bfloat162float(h[e]);
}
template <int V>
__device__ __forceinline__ void store_v(__nv_bfloat16* p, const float* x) {
  typename Word16<V>::T w;
  __nv_bfloat16* h = reinterpret_cast<__nv_bfloat16*>(&w);
#pragma unroll
  for (int e = 0; e < V; e++) h[e] = __float2bfloat16(x[e]);
  *reinterpret_cast<typename Word16<V>::T*>(p) = w;
}

}  // namespace rls
