// Softmax over the vocabulary on the GPU, one block per row: the fused log-softmax with entropy and its backward
// (fp32 logits), the training step's loss head on bf16 logits (log-sum-exp, entropy, target log-prob, then dlogits
// in place), and softmax at a per-row temperature for sampling.
#include <cmath>
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

// ---------------------------------------------------------------------------------------------------------------
// log-softmax over the vocabulary, one block per row. The forward reads the row once for max, sum e^s and
// sum e^s s together (online rescaling), then writes z - logsumexp.

struct MSE {
  float m, s, e;  // running max, sum e^(z-m), sum e^(z-m) (z-m)
};
__device__ __forceinline__ MSE mse_merge(MSE a, MSE b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = fmaxf(a.m, b.m), fa = __expf(a.m - m), fb = __expf(b.m - m);
  return {m, a.s * fa + b.s * fb, fa * (a.e + (a.m - m) * a.s) + fb * (b.e + (b.m - m) * b.s)};
}
__device__ __forceinline__ MSE mse_add(MSE a, float z) {
  if (z > a.m) {
    const float f = __expf(a.m - z);  // a.m = -inf: f = 0
    const float e = a.m == -INFINITY ? 0.f : f * (a.e + (a.m - z) * a.s);
    return {z, a.s * f + 1.f, e};
  }
  const float d = z - a.m, x = __expf(d);
  return {a.m, a.s + x, a.e + x * d};
}

constexpr int LS_THREADS = 512;
__global__ void __launch_bounds__(LS_THREADS) k_logsoftmax_forward(float* logits, float* logp, float* ent,
                                                                   const int* targets, int V) {
  __shared__ MSE red[LS_THREADS / 32];
  __shared__ float zt;
  const size_t n = blockIdx.x;
  float* z = logits + n * V;
  const int tgt = targets[n];
  if (threadIdx.x == 0) zt = tgt >= 0 ? z[tgt] : 0.f;
  MSE a{-INFINITY, 0.f, 0.f};
  if ((V & 3) == 0) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 v = z4[i];
      a = mse_add(a, v.x);
      a = mse_add(a, v.y);
      a = mse_add(a, v.z);
      a = mse_add(a, v.w);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) a = mse_add(a, z[i]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    MSE b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o), __shfl_xor_sync(0xffffffffu, a.e, o)};
    a = mse_merge(a, b);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  MSE r = red[0];
  for (int i = 1; i < LS_THREADS / 32; i++) r = mse_merge(r, red[i]);
  const float lsum = logf(r.s), l = r.m + lsum;
  if (threadIdx.x == 0) {
    ent[n] = lsum - r.e / r.s;
    logp[n] = tgt >= 0 ? zt - l : 0.f;
  }
  if ((V & 3) == 0) {
    float4* z4 = reinterpret_cast<float4*>(z);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      float4 v = z4[i];
      v.x -= l, v.y -= l, v.z -= l, v.w -= l;
      z4[i] = v;
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) z[i] -= l;
  }
}

// dz_i = dlogp (1[i = target] - p_i) - dent p_i (log p_i + H)
__global__ void __launch_bounds__(LS_THREADS) k_logsoftmax_backward(float* lp, const float* dlogp, const float* dent,
                                                                    const float* ent, const int* targets, int V) {
  const size_t n = blockIdx.x;
  float* z = lp + n * V;
  const float a = dlogp[n], b = dent[n], H = ent[n];
  const int tgt = targets[n];
  if ((V & 3) == 0) {
    float4* z4 = reinterpret_cast<float4*>(z);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      float4 v = z4[i];
      float* e = &v.x;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const float p = __expf(e[u]);
        e[u] = -a * p - b * p * (e[u] + H) + (4 * i + u == tgt ? a : 0.f);
      }
      z4[i] = v;
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float p = __expf(z[i]);
      z[i] = -a * p - b * p * (z[i] + H) + (i == tgt ? a : 0.f);
    }
  }
}

// The training step's loss head on bf16 logits z16 (as autocast computes them): one read for the log-sum-exp,
// entropy and target log-prob of a row, and one for its dlogits, written over the logits in bf16 (nothing fp32 of
// size [N, V] is kept). V8 is V % 8 == 0 (16-byte loads of 8 logits).
template <bool V8>
__global__ void __launch_bounds__(LS_THREADS) k_logsoftmax16(const bf16* z16, float* lse, float* logp, float* ent,
                                                            const int* targets, int V) {
  __shared__ MSE red[LS_THREADS / 32];
  const size_t n = blockIdx.x;
  const bf16* z = z16 + n * V;
  const int tgt = targets[n];
  MSE a{-INFINITY, 0.f, 0.f};
  if constexpr (V8) {
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
      float v[8];
      load_v<8>(v, z + i);
#pragma unroll
      for (int u = 0; u < 8; u++) a = mse_add(a, v[u]);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) a = mse_add(a, __bfloat162float(z[i]));
  }
  for (int o = 16; o > 0; o >>= 1) {
    MSE b{__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o), __shfl_xor_sync(0xffffffffu, a.e, o)};
    a = mse_merge(a, b);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
  __syncthreads();
  if (threadIdx.x != 0) return;
  MSE r = red[0];
  for (int i = 1; i < LS_THREADS / 32; i++) r = mse_merge(r, red[i]);
  const float lsum = logf(r.s), l = r.m + lsum;
  lse[n] = l;
  ent[n] = lsum - r.e / r.s;
  logp[n] = tgt >= 0 ? __bfloat162float(z[tgt]) - l : 0.f;
}
// dz_i = dlogp (1[i = target] - p_i) - dent p_i (log p_i + H) with log p_i = z_i - lse, over z16 in place
template <bool V8>
__global__ void __launch_bounds__(LS_THREADS) k_dlogits16(bf16* z16, const float* lse, const float* dlogp,
                                                         const float* dent, const float* ent, const int* targets,
                                                         int V) {
  const size_t n = blockIdx.x;
  bf16* z = z16 + n * V;
  const float a = dlogp[n], b = dent[n], H = ent[n], l = lse[n];
  const int tgt = targets[n];
  if constexpr (V8) {
    for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
      float v[8];
      load_v<8>(v, z + i);
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const float lp = v[u] - l, p = __expf(lp);
        v[u] = -a * p - b * p * (lp + H) + (i + u == tgt ? a : 0.f);
      }
      store_v<8>(z + i, v);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float lp = __bfloat162float(z[i]) - l, p = __expf(lp);
      z[i] = __float2bfloat16(-a * p - b * p * (lp + H) + (i == tgt ? a : 0.f));
    }
  }
}

// softmax(x * inv_temp[row]) in place, one block per row: max, then sum of exp, then normalise.
__global__ void __launch_bounds__(LS_THREADS) k_softmax_rows(float* x, const float* inv_temp, int V) {
  __shared__ float red[LS_THREADS / 32];
  const size_t n = blockIdx.x;
  float* z = x + n * V;
  const float sc = inv_temp[n];
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, z[i] * sc);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = red[0];
  for (int i = 1; i < LS_THREADS / 32; i++) mx = fmaxf(mx, red[i]);
  __syncthreads();
  float sum = 0.f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float e = expf(z[i] * sc - mx);
    z[i] = e;
    sum += e;
  }
  sum = block_sum(sum, red);
  const float inv = 1.f / sum;
  for (int i = threadIdx.x; i < V; i += blockDim.x) z[i] *= inv;
}

}  // namespace

void logsoftmax_forward(float* logits, float* logp, float* ent, const int* targets, int N, int V, cudaStream_t st) {
  k_logsoftmax_forward<<<N, LS_THREADS, 0, st>>>(logits, logp, ent, targets, V);
  LAUNCH_CHECK("logsoftmax_forward");
}
void logsoftmax_backward(float* logprobs, const float* dlogp, const float* dent, const float* ent, const int* targets,
                         int N, int V, cudaStream_t st) {
  k_logsoftmax_backward<<<N, LS_THREADS, 0, st>>>(logprobs, dlogp, dent, ent, targets, V);
  LAUNCH_CHECK("logsoftmax_backward");
}
void logsoftmax16(const bf16* z16, float* lse, float* logp, float* ent, const int* targets, int N, int V,
                  cudaStream_t st) {
  if (V % 8 == 0) k_logsoftmax16<true><<<N, LS_THREADS, 0, st>>>(z16, lse, logp, ent, targets, V);
  else k_logsoftmax16<false><<<N, LS_THREADS, 0, st>>>(z16, lse, logp, ent, targets, V);
  LAUNCH_CHECK("logsoftmax16");
}
void dlogits16(bf16* dz, const float* lse, const float* dlogp, const float* dent, const float* ent, const int* targets,
               int N, int V, cudaStream_t st) {
  if (V % 8 == 0) k_dlogits16<true><<<N, LS_THREADS, 0, st>>>(dz, lse, dlogp, dent, ent, targets, V);
  else k_dlogits16<false><<<N, LS_THREADS, 0, st>>>(dz, lse, dlogp, dent, ent, targets, V);
  LAUNCH_CHECK("dlogits16");
}
void softmax_rows(float* x, const float* inv_temp, int N, int V, cudaStream_t st) {
  k_softmax_rows<<<N, LS_THREADS, 0, st>>>(x, inv_temp, V);
  LAUNCH_CHECK("softmax_rows");
}

}  // namespace rls::cuda
