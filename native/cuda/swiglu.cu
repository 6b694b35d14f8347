// The SwiGLU activation on the GPU, silu(gate) * up: on separate fp32 gate and up tensors (the plain ops), on
// [gate | up] rows with a bf16 copy of the output (decode), and on bf16 [gate | up] rows (the fused training step).
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

__global__ void k_swiglu_forward(float* out, const float* gate, const float* up, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}
__global__ void k_swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                                  size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float g = gate[i], sg = 1.f / (1.f + expf(-g)), d = dout[i];
    dup[i] = d * g * sg;
    dgate[i] = d * up[i] * sg * (1.f + g * (1.f - sg));
  }
}

// out[T, I] = silu(gu[t, :I]) * gu[t, I:], and a bf16 copy of out
__global__ void k_swiglu_cat(float* out, bf16* out16, const float* gu, int T, int I) {
  const size_t n = (size_t)T * I;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / I, j = i % I;
    const float g = gu[t * 2 * I + j], u = gu[t * 2 * I + I + j];
    const float y = g / (1.f + expf(-g)) * u;
    out[i] = y;
    out16[i] = __float2bfloat16(y);
  }
}

// out16[T, I] = silu(gate) * up from gu16[T, 2I] = [gate | up], V columns per thread.
template <int V>
__global__ void k_swiglu16(bf16* out16, const bf16* gu, int T, int I) {
  const size_t IV = I / V, n = (size_t)T * IV;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / IV, j = (i - t * IV) * V;
    float g[V], u[V], y[V];
    load_v<V>(g, gu + t * 2 * I + j);
    load_v<V>(u, gu + t * 2 * I + I + j);
#pragma unroll
    for (int e = 0; e < V; e++) y[e] = g[e] / (1.f + expf(-g[e])) * u[e];
    store_v<V>(out16 + t * I + j, y);
  }
}
// dgu16[T, 2I] = [dgate | dup] as k_swiglu_backward given dout16[T, I], V columns per thread
template <int V>
__global__ void k_swiglu_back16(bf16* dgu16, const bf16* dout, const bf16* gu, int T, int I) {
  const size_t IV = I / V, n = (size_t)T * IV;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const size_t t = i / IV, j = (i - t * IV) * V;
    float g[V], u[V], d[V], dg[V], du[V];
    load_v<V>(g, gu + t * 2 * I + j);
    load_v<V>(u, gu + t * 2 * I + I + j);
    load_v<V>(d, dout + t * I + j);
#pragma unroll
    for (int e = 0; e < V; e++) {
      const float sg = 1.f / (1.f + expf(-g[e]));
      du[e] = d[e] * g[e] * sg;
      dg[e] = d[e] * u[e] * sg * (1.f + g[e] * (1.f - sg));
    }
    store_v<V>(dgu16 + t * 2 * I + j, dg);
    store_v<V>(dgu16 + t * 2 * I + I + j, du);
  }
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, size_t n, cudaStream_t st) {
  k_swiglu_forward<<<blocks_for(n, 256), 256, 0, st>>>(out, gate, up, n);
  LAUNCH_CHECK("swiglu_forward");
}
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n,
                     cudaStream_t st) {
  k_swiglu_backward<<<blocks_for(n, 256), 256, 0, st>>>(dgate, dup, dout, gate, up, n);
  LAUNCH_CHECK("swiglu_backward");
}
void swiglu_cat(float* out, bf16* out16, const float* gu, int T, int I, cudaStream_t st) {
  const size_t n = (size_t)T * I;
  k_swiglu_cat<<<blocks_for(n, 256), 256, 0, st>>>(out, out16, gu, T, I);
  LAUNCH_CHECK("swiglu_cat");
}
void swiglu16(bf16* out16, const bf16* gu, int T, int I, cudaStream_t st) {
  if (I % 8 == 0) k_swiglu16<8><<<blocks_for((size_t)T * I / 8, 256), 256, 0, st>>>(out16, gu, T, I);
  else k_swiglu16<1><<<blocks_for((size_t)T * I, 256), 256, 0, st>>>(out16, gu, T, I);
  LAUNCH_CHECK("swiglu16");
}
void swiglu_back16(bf16* dgu16, const bf16* dout, const bf16* gu, int T, int I, cudaStream_t st) {
  if (I % 8 == 0)
    k_swiglu_back16<8><<<blocks_for((size_t)T * I / 8, 256), 256, 0, st>>>(dgu16, dout, gu, T, I);
  else k_swiglu_back16<1><<<blocks_for((size_t)T * I, 256), 256, 0, st>>>(dgu16, dout, gu, T, I);
  LAUNCH_CHECK("swiglu_back16");
}

}  // namespace rls::cuda
