// Elementwise CUDA ops: y += x, scaling, dropout (the CPU's mask bit for bit), fp32 -> bf16 conversion, bias rows,
// and the embedding lookup and its gradient.
#include <cmath>
#include "common.cuh"
#include "ops.cuh"

namespace rls::cuda {

namespace {

__global__ void k_add(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] += x[i];
}
__global__ void k_scale(float* x, size_t n, float s) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= s;
}
// Kernels::dropout: the CPU's mask bit for bit (the same hash of (seed, i))
__global__ void k_dropout(float* out, const float* x, size_t n, uint32_t cut, float keep_scale, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = (uint32_t)(z >> 40) >= cut ? x[i] * keep_scale : 0.f;
  }
}
__global__ void k_to_bf16(bf16* y, const float* x, size_t n) {
  const size_t n2 = n / 2;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n2; i += (size_t)gridDim.x * blockDim.x) {
    const float2 v = reinterpret_cast<const float2*>(x)[i];
    reinterpret_cast<__nv_bfloat162*>(y)[i] = __floats2bfloat162_rn(v.x, v.y);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && (n & 1)) y[n - 1] = __float2bfloat16(x[n - 1]);
}

__global__ void k_embedding_forward(float* out, const int* tokens, const float* wte, int T, int H) {
  const int t = blockIdx.x;
  const float* src = wte + (size_t)tokens[t] * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) out[(size_t)t * H + c] = src[c];
}
// Repeated ids add into one row: atomics (the only non-deterministic sum of the GPU path).
__global__ void k_embedding_backward(float* dwte, const float* dout, const int* tokens, int T, int H) {
  const int t = blockIdx.x;
  float* dst = dwte + (size_t)tokens[t] * H;
  for (int c = threadIdx.x; c < H; c += blockDim.x) atomicAdd(dst + c, dout[(size_t)t * H + c]);
}

__global__ void k_add_bias(float* out, const float* bias, int N, int OC) {
  const size_t n = (size_t)N * OC;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] += bias[i % OC];
}

}  // namespace

void add(float* y, const float* x, size_t n, cudaStream_t st) {
  k_add<<<blocks_for(n, 256), 256, 0, st>>>(y, x, n);
  LAUNCH_CHECK("add_inplace");
}
void scale(float* x, size_t n, float s, cudaStream_t st) {
  k_scale<<<blocks_for(n, 256), 256, 0, st>>>(x, n, s);
  LAUNCH_CHECK("scale");
}
void dropout(float* out, const float* x, size_t n, float p, uint64_t seed, cudaStream_t st) {
  const uint32_t cut = (uint32_t)std::ceil((double)p * 16777216.0);
  k_dropout<<<blocks_for(n, 256), 256, 0, st>>>(out, x, n, cut, 1.f / (1.f - p), seed);
  LAUNCH_CHECK("dropout");
}
void to_bf16(bf16* y, const float* x, size_t n, const char* what, cudaStream_t st) {
  k_to_bf16<<<blocks_for(n / 2 + 1, 256), 256, 0, st>>>(y, x, n);
  LAUNCH_CHECK(what);
}
void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t st) {
  k_add_bias<<<blocks_for((size_t)N * OC, 256), 256, 0, st>>>(out, bias, N, OC);
  LAUNCH_CHECK("matmul bias");
}
void embedding_forward(float* out, const int* tokens, const float* wte, int T, int H, cudaStream_t st) {
  k_embedding_forward<<<T, 256, 0, st>>>(out, tokens, wte, T, H);
  LAUNCH_CHECK("embedding_forward");
}
void embedding_backward(float* dwte, const float* dout, const int* tokens, int T, int H, cudaStream_t st) {
  k_embedding_backward<<<T, 256, 0, st>>>(dwte, dout, tokens, T, H);
  LAUNCH_CHECK("embedding_backward");
}

}  // namespace rls::cuda
