// The CUDA implementation of the kernel interface (src/device.h): activations, master weights, gradients and AdamW
// state in device memory; matrix products through cuBLAS on bf16 operands with fp32 accumulation (the recipe of
// autocast training); softmax, norms, rotary, SwiGLU and the optimizer compute in fp32. The plain ops keep fp32
// activations; the fused training ops keep in bf16 what autocast keeps in bf16 (products' operands, gate|up, the
// logits, some input gradients). Every runtime call and every launch is checked (check.cuh). Validated kernel by
// kernel against cpu_kernels.cpp (test/gpu/driver.cpp) and step by step against PyTorch (test/gpu/torch_ref.py).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "../src/device.h"
#include "attention.cuh"
#include "check.cuh"
#include "vec.cuh"

namespace rls {

namespace {

using bf16 = __nv_bfloat16;

// Whether a switch of the environment is set to `value` (RLSTREAM_CUDA_FUSED=0, RLSTREAM_CUDA_SYNC=1 and the like).
bool env_is(const char* name, char value) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == value;
}
bool env_off(const char* name) { return env_is(name, '0'); }

unsigned blocks_for(size_t n, int per) { return (unsigned)std::min<size_t>((n + per - 1) / per, 1u << 30); }

// ---------------------------------------------------------------------------------------------------------------
// elementwise



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

// Fixed grid, double partials per block, summed in block order on the host: deterministic.
constexpr int SS_BLOCKS = 1024, SS_THREADS = 256;
__global__ void k_sum_squares(double* part, const float* x, size_t n) {
  __shared__ double red[SS_THREADS];
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    s += (double)x[i] * x[i];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = SS_THREADS / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = red[0];
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

// one block per row
__global__ void k_rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int C, float eps) {
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const float* x = inp + t * C;
  float ss = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / C + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  for (int c = threadIdx.x; c < C; c += blockDim.x) out[t * C + c] = w[c] * (x[c] * r);
}
// dinp += the row's rmsnorm backward; dinp16 (where set) = bf16 of the updated dinp
__global__ void k_rmsnorm_backward_dx(float* dinp, bf16* dinp16, const float* dout, const float* inp, const float* w,
                                      const float* rstd, int C) {
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const float* x = inp + t * C;
  const float* dy = dout + t * C;
  const float r = rstd[t];
  float m = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) m += dy[c] * w[c] * x[c] * r;
  m = block_sum(m, red) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float y = dinp[t * C + c] + r * (dy[c] * w[c] - x[c] * r * m);
    dinp[t * C + c] = y;
    if (dinp16) dinp16[t * C + c] = __float2bfloat16(y);
  }
}
// Column sums in two deterministic stages: part[chunk][c] over a range of rows, then dst[c] += sum over chunks.
constexpr int COL_CHUNKS = 64;
__global__ void k_colsum_partial(float* part, const float* a, const float* b, const float* rowscale, int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
  if (c >= C) return;
  const int t0 = (int)((long)T * ch / COL_CHUNKS), t1 = (int)((long)T * (ch + 1) / COL_CHUNKS);
  float s = 0.f;
  for (int t = t0; t < t1; t++) {
    float v = a[(size_t)t * C + c];
    if (b) v *= b[(size_t)t * C + c];
    if (rowscale) v *= rowscale[t];
    s += v;
  }
  part[(size_t)ch * C + c] = s;
}
// dst[c] += the sum of part[0..chunks)[c]: a block of 32 columns x 8 rows of threads, each row of threads summing
// every 8th chunk, then those 8 sums in order (a fixed order: deterministic)
constexpr int CF_COLS = 32, CF_ROWS = 8;
__global__ void k_colsum_finish(float* dst, const float* part, int C, int chunks) {
  __shared__ float red[CF_ROWS][CF_COLS];
  const int c = blockIdx.x * CF_COLS + threadIdx.x;
  float s = 0.f;
  if (c < C)
    for (int ch = threadIdx.y; ch < chunks; ch += CF_ROWS) s += part[(size_t)ch * C + c];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int r = 1; r < CF_ROWS; r++) s += red[r][threadIdx.x];
  dst[c] += s;
}

__global__ void k_add_bias(float* out, const float* bias, int N, int OC) {
  const size_t n = (size_t)N * OC;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] += bias[i % OC];
}

__global__ void k_rope_table(float* cosb, float* sinb, const int* pos, const float* inv, int T, int half) {
  const size_t n = (size_t)T * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(i / half), j = (int)(i % half);
    const float ang = (float)pos[t] * inv[j];  // rounded to float like HF, then cos/sin in double like the CPU
    cosb[i] = (float)cos((double)ang);
    sinb[i] = (float)sin((double)ang);
  }
}
// Per-head RMSNorm (q_norm / k_norm), one warp per head row (t, h) of rows with a stride of ld floats
__global__ void k_head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd,
                               float eps) {
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= (long)T * nh) return;
  float* v = x + (size_t)(row / nh) * ld + (size_t)(row % nh) * hd;
  float ss = 0.f;
  for (int i = lane; i < hd; i += 32) {
    const float a = v[i];
    ss += a * a;
    if (saved) saved[(size_t)row * hd + i] = a;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float r = rsqrtf(ss / hd + eps);
  if (lane == 0) rstd[row] = r;
  for (int i = lane; i < hd; i += 32) v[i] = w[i] * (v[i] * r);
}
// its input gradient in place (the weight's gradient is a column sum, taken before)
__global__ void k_head_rmsnorm_back(float* dx, int ld, const float* saved, const float* w, const float* rstd, int T,
                                    int nh, int hd) {
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= (long)T * nh) return;
  float* dy = dx + (size_t)(row / nh) * ld + (size_t)(row % nh) * hd;
  const float* xs = saved + (size_t)row * hd;
  const float r = rstd[row];
  float m = 0.f;
  for (int i = lane; i < hd; i += 32) m += dy[i] * w[i] * xs[i] * r;
  for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
  m /= hd;
  for (int i = lane; i < hd; i += 32) dy[i] = r * (dy[i] * w[i] - xs[i] * r * m);
}

template <bool INVERSE>
__global__ void k_rope(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) {
  const int half = hd / 2;
  const size_t n = (size_t)T * nh * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int j = (int)(i % half);
    const size_t th = i / half;
    const int t = (int)(th / nh);
    float* v = x + th * hd;
    const float c = cosb[(size_t)t * half + j], s = sinb[(size_t)t * half + j], a = v[j], b = v[j + half];
    if (INVERSE) {
      v[j] = a * c + b * s;
      v[j + half] = b * c - a * s;
    } else {
      v[j] = a * c - b * s;
      v[j + half] = b * c + a * s;
    }
  }
}

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

// ---------------------------------------------------------------------------------------------------------------
// Decoding over the slot KV cache.

__global__ void k_kv_store(bf16* kc, bf16* vc, const float* k, const float* v, const int* slot, const int* pos,
                           int T, int KD, int max_len) {
  const size_t n = (size_t)T * KD;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(i / KD), c = (int)(i % KD);
    const size_t at = ((size_t)slot[t] * max_len + pos[t]) * KD + c;
    kc[at] = __float2bfloat16(k[i]);
    vc[at] = __float2bfloat16(v[i]);
  }
}

// An online softmax's partial result for one query head and dim: the running max, the sum of exp(score - m) and
// the values weighted by them (unnormalised).
struct SoftmaxPart {
  float m, s, o;
};
// Reads a partial result another block wrote past L1 (GLOBAL), or one in this block's shared memory.
template <bool GLOBAL>
__device__ __forceinline__ float ld_part(const float* p) {
  if constexpr (GLOBAL) return __ldcg(p);
  else return *p;
}
// The merge of n partial results of query head g at dim c, each laid out as m[G], s[G], acc[G][HD] (G * (HD + 2)
// floats apart): the warps' in shared memory, or the blocks' of a split row. A part that saw no key (m = -inf)
// contributes nothing.
template <int G, int HD, bool GLOBAL>
__device__ __forceinline__ SoftmaxPart merge_parts(const float* p, int n, int g, int c) {
  constexpr int stride = G * (HD + 2);
  float M = -INFINITY;
  for (int z = 0; z < n; z++) M = fmaxf(M, ld_part<GLOBAL>(p + (size_t)z * stride + g));
  float S = 0.f, o = 0.f;
  for (int z = 0; z < n; z++) {
    const float* x = p + (size_t)z * stride;
    const float mz = ld_part<GLOBAL>(x + g);
    const float f = mz == -INFINITY ? 0.f : __expf(mz - M);
    S += ld_part<GLOBAL>(x + G + g) * f;
    o += ld_part<GLOBAL>(x + 2 * G + g * HD + c) * f;
  }
  return {M, S, o};
}

// Decode attention where the head dim is 8 * LPK (32, 64 or 128) and a key head serves at most G query heads: one
// block per (query token, key head) scores all of that head's query heads, so each cached key and value is read
// once. LPK lanes hold one key's row, 8 dims each as one 16-byte load, so a warp reads 32 / LPK whole rows per load
// with no lane idle; each such lane group runs its own online softmax over the keys it visits (the dot products
// reduced over LPK lanes only), and the groups and then the warps merge once at the end. U keys a group are loaded
// together so a warp waits on memory once per U keys. out16, where given, receives a bf16 copy of out.
// Where (token, key head) pairs are too few to fill the multiprocessors, blockIdx.z splits each row's keys over
// gridDim.z blocks: each writes its unnormalised result (max, sum, weighted values) to part, and the last of them to
// finish (counted in cnt, which it sets back to 0 for the next call) merges them.
template <int LPK, int G>
__global__ void __launch_bounds__(G >= 8 ? 256 : 512)
    k_attention_cached16(float* out, bf16* out16, const float* q, const bf16* kc, const bf16* vc, const int* slot,
                         const int* pos, int NH, int NKV, int max_len, float scale, float* part, int* cnt) {
  constexpr int HD = 8 * LPK, KPW = 32 / LPK, U = G >= 8 ? 2 : 4;
  extern __shared__ float sm[];  // per warp: m[G], s[G], acc[G][HD]
  __shared__ bool last;
  const int warps = blockDim.x >> 5, t = blockIdx.x, kh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gq = NH / NKV, sub = lane / LPK, part_ = lane % LPK, QD = NH * HD, KD = NKV * HD, ns = gridDim.z;
  // this block's keys [lo, n): a share of the row's pos[t] + 1, in whole rounds of the block's loads
  const int keys = pos[t] + 1, step = warps * KPW * U, share = ((keys + ns - 1) / ns + step - 1) / step * step;
  const int lo = blockIdx.z * share, n = min(keys, lo + share);
  float qr[G][8], acc[G][8], m[G], s[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (g < gq) {
      load_v<4>(qr[g], q + (size_t)t * QD + (size_t)(kh * gq + g) * HD + part_ * 8);
      load_v<4>(qr[g] + 4, q + (size_t)t * QD + (size_t)(kh * gq + g) * HD + part_ * 8 + 4);
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
      qr[g][e] = g < gq ? qr[g][e] * scale : 0.f;
      acc[g][e] = 0.f;
    }
    m[g] = -INFINITY;
    s[g] = 0.f;
  }
  const bf16* kb = kc + (size_t)slot[t] * max_len * KD + (size_t)kh * HD + part_ * 8;
  const bf16* vb = vc + (size_t)slot[t] * max_len * KD + (size_t)kh * HD + part_ * 8;
  for (int j0 = lo + warp * KPW * U; j0 < n; j0 += step) {
    uint4 kw[U], vw[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int j = j0 + u * KPW + sub;
      kw[u] = j < n ? *reinterpret_cast<const uint4*>(kb + (size_t)j * KD) : make_uint4(0, 0, 0, 0);
      vw[u] = j < n ? *reinterpret_cast<const uint4*>(vb + (size_t)j * KD) : make_uint4(0, 0, 0, 0);
    }
    float d[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8];
      load_v<8>(kf, reinterpret_cast<const bf16*>(&kw[u]));
#pragma unroll
      for (int g = 0; g < G; g++) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) x += qr[g][e] * kf[e];
        d[u][g] = x;
      }
    }
#pragma unroll
    for (int o = LPK / 2; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int g = 0; g < G; g++) d[u][g] += __shfl_xor_sync(0xffffffffu, d[u][g], o);
    float vf[U][8];
#pragma unroll
    for (int u = 0; u < U; u++) load_v<8>(vf[u], reinterpret_cast<const bf16*>(&vw[u]));
#pragma unroll
    for (int g = 0; g < G; g++) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (j0 + u * KPW + sub < n) mn = fmaxf(mn, d[u][g]);
      if (mn == -INFINITY) continue;  // this group has no key in this round (nor before)
      const float f = __expf(m[g] - mn);  // m = -inf: f = 0
      s[g] *= f;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] *= f;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const float p = j0 + u * KPW + sub < n ? __expf(d[u][g] - mn) : 0.f;
        s[g] += p;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] += p * vf[u][e];
      }
      m[g] = mn;
    }
  }
  // the warp's lane groups into the first (lanes 0..LPK-1)
#pragma unroll
  for (int o = LPK; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; g++) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), so = __shfl_xor_sync(0xffffffffu, s[g], o);
      const float M = fmaxf(m[g], mo);
      const float fa = m[g] == -INFINITY ? 0.f : __expf(m[g] - M), fb = mo == -INFINITY ? 0.f : __expf(mo - M);
      s[g] = s[g] * fa + so * fb;
#pragma unroll
      for (int e = 0; e < 8; e++) acc[g][e] = acc[g][e] * fa + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * fb;
      m[g] = M;
    }
  float* wm = sm + (size_t)warp * G * (HD + 2);
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      if (part_ == 0) wm[g] = m[g], wm[G + g] = s[g];
#pragma unroll
      for (int e = 0; e < 8; e++) wm[2 * G + g * HD + part_ * 8 + e] = acc[g][e];
    }
  }
  __syncthreads();
  // the warps' results merged; with one block a row, normalised into out, else into this block's part
  const size_t row = (size_t)t * NKV + kh;
  float* mine = ns > 1 ? part + (row * ns + blockIdx.z) * G * (HD + 2) : nullptr;
  const auto put = [&](int g, int c, const SoftmaxPart& r) {
    const size_t at = (size_t)t * QD + (size_t)(kh * gq + g) * HD + c;
    out[at] = r.o / r.s;
    if (out16) out16[at] = __float2bfloat16(r.o / r.s);
  };
  for (int i = threadIdx.x; i < gq * HD; i += blockDim.x) {
    const int g = i / HD, c = i % HD;
    const SoftmaxPart r = merge_parts<G, HD, false>(sm, warps, g, c);
    if (!mine) {
      put(g, c, r);
      continue;
    }
    if (c == 0) mine[g] = r.m, mine[G + g] = r.s;
    mine[2 * G + g * HD + c] = r.o;
  }
  if (!mine) return;
  __threadfence();  // this block's part is visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(cnt + row, 1) == ns - 1;
    if (last) cnt[row] = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* all = part + row * ns * G * (HD + 2);
  for (int i = threadIdx.x; i < gq * HD; i += blockDim.x) {
    const int g = i / HD, c = i % HD;
    put(g, c, merge_parts<G, HD, true>(all, ns, g, c));
  }
}

// One block per (query token, head); each warp walks every AC_WARPS-th group of AC_KEYS keys of the slot with an
// online softmax (lane i holds dims i, i+32, ... of q and of its value accumulator); the group's loads are issued
// together so a warp waits on memory once per group, not once per key. The warps' partial (max, sum, acc) then
// merge in shared memory. D = ceil(hd / 32) dims per lane; the head dims k_attention_cached16 does not take.
// AC_WARPS warps a block where there are many blocks (prefill), AC_WARPS_FEW where there are few (a decode step of
// a small batch: one block per head and row, so more warps share each row's keys). out16, where given, receives a
// bf16 copy of out (the next product's operand).
constexpr int AC_WARPS = 4, AC_WARPS_FEW = 16, AC_KEYS = 4;
template <int D, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) k_attention_cached(float* out, bf16* out16, const float* q,
                                                                    const bf16* kc, const bf16* vc, const int* slot,
                                                                    const int* pos, int NH, int NKV, int hd,
                                                                    int max_len, float scale) {
  __shared__ float sm_m[WARPS], sm_s[WARPS], sm_acc[WARPS][D * 32];
  const int t = blockIdx.x, h = blockIdx.y, kh = h / (NH / NKV), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int QD = NH * hd, KD = NKV * hd, n = pos[t] + 1;
  float qr[D], acc[D];
#pragma unroll
  for (int i = 0; i < D; i++) {
    const int c = lane + 32 * i;
    qr[i] = c < hd ? q[(size_t)t * QD + (size_t)h * hd + c] * scale : 0.f;
    acc[i] = 0.f;
  }
  const size_t base = (size_t)slot[t] * max_len * KD + (size_t)kh * hd;
  float m = -INFINITY, s = 0.f;
  for (int j0 = warp * AC_KEYS; j0 < n; j0 += WARPS * AC_KEYS) {
    float kr[AC_KEYS][D], vr[AC_KEYS][D], d[AC_KEYS];
#pragma unroll
    for (int u = 0; u < AC_KEYS; u++) {
      const bool ok = j0 + u < n;
      const bf16* kj = kc + base + (size_t)(j0 + u) * KD;
      const bf16* vj = vc + base + (size_t)(j0 + u) * KD;
#pragma unroll
      for (int i = 0; i < D; i++) {
        const int c = lane + 32 * i;
        kr[u][i] = ok && c < hd ? __bfloat162float(kj[c]) : 0.f;
        vr[u][i] = ok && c < hd ? __bfloat162float(vj[c]) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < AC_KEYS; u++) {
      d[u] = 0.f;
#pragma unroll
      for (int i = 0; i < D; i++) d[u] += qr[i] * kr[u][i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int u = 0; u < AC_KEYS; u++) d[u] += __shfl_xor_sync(0xffffffffu, d[u], o);
    float mn = m;
#pragma unroll
    for (int u = 0; u < AC_KEYS; u++)
      if (j0 + u < n) mn = fmaxf(mn, d[u]);
    const float f = expf(m - mn);  // m = -inf: f = 0
    s *= f;
#pragma unroll
    for (int i = 0; i < D; i++) acc[i] *= f;
#pragma unroll
    for (int u = 0; u < AC_KEYS; u++) {
      const float p = j0 + u < n ? expf(d[u] - mn) : 0.f;
      s += p;
#pragma unroll
      for (int i = 0; i < D; i++) acc[i] += p * vr[u][i];
    }
    m = mn;
  }
  if (lane == 0) {
    sm_m[warp] = m;
    sm_s[warp] = s;
  }
#pragma unroll
  for (int i = 0; i < D; i++) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm_m[w]);
  float S = 0.f, o[D];
#pragma unroll
  for (int i = 0; i < D; i++) o[i] = 0.f;
  for (int w = 0; w < WARPS; w++) {
    const float f = sm_m[w] == -INFINITY ? 0.f : expf(sm_m[w] - M);  // a warp that saw no key contributes nothing
    S += sm_s[w] * f;
#pragma unroll
    for (int i = 0; i < D; i++) o[i] += sm_acc[w][lane + 32 * i] * f;
  }
#pragma unroll
  for (int i = 0; i < D; i++) {
    const int c = lane + 32 * i;
    if (c < hd) {
      const float y = o[i] / S;
      out[(size_t)t * QD + (size_t)h * hd + c] = y;
      if (out16) out16[(size_t)t * QD + (size_t)h * hd + c] = __float2bfloat16(y);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Fused ops of the decode path (Kernels::fused_decode).

// x = a + b (b null: x = a), out = rmsnorm(x) as k_rmsnorm_forward (out null: not written), and a bf16 copy of
// out; one block per row.
__global__ void k_add_rmsnorm(float* x, float* out, bf16* out16, float* rstd, const float* a, const float* b,
                              const float* w, int C, float eps) {
  __shared__ float red[32];
  const size_t t = blockIdx.x;
  const float* xa = a + t * C;
  const float* xb = b ? b + t * C : nullptr;
  float* xx = x + t * C;
  const bool write = xb != nullptr || xx != xa;
  float ss = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = xb ? xa[c] + xb[c] : xa[c];
    if (write) xx[c] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / C + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  const float* src = write ? xx : xa;  // this thread's own entries, written above
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float y = w[c] * (src[c] * r);
    if (out) out[t * C + c] = y;
    out16[t * C + c] = __float2bfloat16(y);
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

// ---------------------------------------------------------------------------------------------------------------
// Fused ops of the training step (Kernels::fused_train).

// The rotary kernels take a token row per block (blocks_for rows, then grid-stride), its threads P adjacent items
// each (P = 2 where hd % 4 == 0: 8-byte accesses), with no 64-bit division per element. A row of q|k|v is walked
// as NH * half rotation pairs of q, NKV * half of k, then KD columns of v (qkv_item).
constexpr int ROPE_THREADS = 128;

struct QkvItem {
  int part, c, j;  // part 0 q, 1 k: the pair (c, c + half), table index j; part 2 v: column c
};
__device__ __forceinline__ QkvItem qkv_item(int r, int nq, int nk, int half, int hd) {
  if (r >= nq + nk) return {2, r - nq - nk, 0};
  const int part = r < nq ? 0 : 1;
  if (part) r -= nq;
  const int j = r % half;
  return {part, (r / half) * hd + j, j};
}
// (x, y) = the pair (a, b) rotated by the table's (cos, sin), or back (BACK)
template <int P, bool BACK>
__device__ __forceinline__ void rotate(float* x, float* y, const float* a, const float* b, const float* cosb,
                                       const float* sinb) {
  float cs[P], sn[P];
  load_v<P>(cs, cosb);
  load_v<P>(sn, sinb);
#pragma unroll
  for (int e = 0; e < P; e++) {
    x[e] = BACK ? a[e] * cs[e] + b[e] * sn[e] : a[e] * cs[e] - b[e] * sn[e];
    y[e] = BACK ? b[e] * cs[e] - a[e] * sn[e] : b[e] * cs[e] + a[e] * sn[e];
  }
}

// qkv[T, QD + 2 KD] (+ biases) -> q[T, QD] rotated, and k rotated and v at row t of k, v [T, KD] (fp32) or, with
// slot set (the decode path), at (slot[t], pos[t]) of the caches k, v [slots, max_len, KD] (bf16)
template <int P, typename KV>
__global__ void k_qkv_rope_split(float* q, KV* k, KV* v, const float* qkv, const float* qb, const float* kb,
                                 const float* vb, const float* cosb, const float* sinb, const int* slot, const int* pos,
                                 int max_len, int T, int NH, int NKV, int hd) {
  const int half = hd / 2, QD = NH * hd, KD = NKV * hd, W = QD + 2 * KD;
  const int nq = NH * half, nk = NKV * half, per = (nq + nk + KD) / P;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    const float* row = qkv + (size_t)t * W;
    const size_t kv = (slot ? (size_t)slot[t] * max_len + pos[t] : (size_t)t) * KD;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
      const QkvItem it = qkv_item(i * P, nq, nk, half, hd);
      const int c = it.c;
      if (it.part == 2) {
        float x[P];
        load_v<P>(x, row + QD + KD + c);
#pragma unroll
        for (int e = 0; e < P; e++)
          if (vb) x[e] += vb[c + e];
        store_v<P>(v + kv + c, x);
        continue;
      }
      const float* src = it.part ? row + QD : row;
      const float* bias = it.part ? kb : qb;
      float a[P], b[P], x[P], y[P];
      load_v<P>(a, src + c);
      load_v<P>(b, src + c + half);
#pragma unroll
      for (int e = 0; e < P; e++)
        if (bias) a[e] += bias[c + e], b[e] += bias[c + half + e];
      rotate<P, false>(x, y, a, b, cosb + (size_t)t * half + it.j, sinb + (size_t)t * half + it.j);
      if (it.part) {
        store_v<P>(k + kv + c, x);
        store_v<P>(k + kv + c + half, y);
      } else {
        store_v<P>(q + (size_t)t * QD + c, x);
        store_v<P>(q + (size_t)t * QD + c + half, y);
      }
    }
  }
}

// dq, dk rotated back in place (WRITE: only where their bias gradients need them), dqkv16 = bf16 [dq | dk | dv]
template <int P, bool WRITE>
__global__ void k_qkv_rope_back16(bf16* dqkv16, float* dq, float* dk, const float* dv, const float* cosb,
                                  const float* sinb, int T, int NH, int NKV, int hd) {
  const int half = hd / 2, QD = NH * hd, KD = NKV * hd, W = QD + 2 * KD;
  const int nq = NH * half, nk = NKV * half, per = (nq + nk + KD) / P;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    bf16* row = dqkv16 + (size_t)t * W;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
      const QkvItem it = qkv_item(i * P, nq, nk, half, hd);
      const int c = it.c;
      if (it.part == 2) {
        float x[P];
        load_v<P>(x, dv + (size_t)t * KD + c);
        store_v<P>(row + QD + KD + c, x);
        continue;
      }
      float* src = it.part ? dk + (size_t)t * KD : dq + (size_t)t * QD;
      float a[P], b[P], x[P], y[P];
      load_v<P>(a, src + c);
      load_v<P>(b, src + c + half);
      if (cosb) {
        rotate<P, true>(x, y, a, b, cosb + (size_t)t * half + it.j, sinb + (size_t)t * half + it.j);
      } else {  // rotated back already (q/k norms between)
#pragma unroll
        for (int e = 0; e < P; e++) x[e] = a[e], y[e] = b[e];
      }
      if (WRITE) {
        store_v<P>(src + c, x);
        store_v<P>(src + c + half, y);
      }
      bf16* dst = it.part ? row + QD : row;
      store_v<P>(dst + c, x);
      store_v<P>(dst + c + half, y);
    }
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

// Row kernels for rows of C floats with C % 4 == 0 and C <= 128 K (every model shape here): one warp per row, lane l
// holding columns 4 (32 k + l) .. 4 (32 k + l) + 3 in registers, no block-wide synchronisation per row. Other rows
// take the one-block-per-row kernels (k_add_rmsnorm, k_rmsnorm_backward_dx).
constexpr int ROW_WARPS = 8, ROW_K_MAX = 8;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// k_add_rmsnorm, a warp per row
template <int K>
__global__ void __launch_bounds__(ROW_WARPS * 32) k_add_rmsnorm_rows(float* x, float* out, bf16* out16, float* rstd,
                                                                    const float* a, const float* b, const float* w,
                                                                    int T, int C, float eps) {
  const int lane = threadIdx.x & 31, t = blockIdx.x * ROW_WARPS + (threadIdx.x >> 5);
  if (t >= T) return;
  const size_t o = (size_t)t * C;
  const bool write = b != nullptr || x != a;
  float v[K][4];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c = (k * 32 + lane) * 4;
    if (c >= C) continue;
    load_v<4>(v[k], a + o + c);
    if (b) {
      float e[4];
      load_v<4>(e, b + o + c);
#pragma unroll
      for (int i = 0; i < 4; i++) v[k][i] += e[i];
    }
    if (write) store_v<4>(x + o + c, v[k]);
#pragma unroll
    for (int i = 0; i < 4; i++) ss += v[k][i] * v[k][i];
  }
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  if (lane == 0) rstd[t] = r;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int c = (k * 32 + lane) * 4;
    if (c >= C) continue;
    float wv[4], y[4];
    load_v<4>(wv, w + c);
#pragma unroll
    for (int i = 0; i < 4; i++) y[i] = wv[i] * (v[k][i] * r);
    if (out) store_v<4>(out + o + c, y);
    store_v<4>(out16 + o + c, y);
  }
}

// k_rmsnorm_backward_dx over warps of rows, and the weight gradient's partial column sums in the same pass:
// part[blockIdx.x][c] = sum over the block's rows of dout * inp * rstd (k_colsum_finish adds the blocks up). Each
// block takes a fixed range of rows and its warps the rows within it in a fixed order: deterministic sums.
template <int K>
__global__ void __launch_bounds__(ROW_WARPS * 32) k_rmsnorm_back_rows(float* dinp, bf16* dinp16, float* part,
                                                                     const float* dout, const float* inp,
                                                                     const float* w, const float* rstd, int T, int C) {
  __shared__ float red[ROW_WARPS][K * 128];
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int t0 = (int)((long)T * blockIdx.x / gridDim.x), t1 = (int)((long)T * (blockIdx.x + 1) / gridDim.x);
  float acc[K][4];
#pragma unroll
  for (int k = 0; k < K; k++)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[k][i] = 0.f;
  for (int t = t0 + wi; t < t1; t += ROW_WARPS) {
    const size_t o = (size_t)t * C;
    const float r = rstd[t];
    float x[K][4], dy[K][4];
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
      const int c = (k * 32 + lane) * 4;
      if (c >= C) continue;
      float wv[4];
      load_v<4>(x[k], inp + o + c);
      load_v<4>(dy[k], dout + o + c);
      load_v<4>(wv, w + c);
#pragma unroll
      for (int i = 0; i < 4; i++) m += dy[k][i] * wv[i] * x[k][i] * r;
    }
    m = warp_sum(m) / C;
#pragma unroll
    for (int k = 0; k < K; k++) {
      const int c = (k * 32 + lane) * 4;
      if (c >= C) continue;
      float wv[4], d[4];
      load_v<4>(wv, w + c);
      load_v<4>(d, dinp + o + c);
#pragma unroll
      for (int i = 0; i < 4; i++) {
        d[i] += r * (dy[k][i] * wv[i] - x[k][i] * r * m);
        acc[k][i] += dy[k][i] * x[k][i] * r;
      }
      store_v<4>(dinp + o + c, d);
      if (dinp16) store_v<4>(dinp16 + o + c, d);
    }
  }
#pragma unroll
  for (int k = 0; k < K; k++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[wi][(k * 32 + lane) * 4 + i] = acc[k][i];
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float sum = 0.f;
    for (int j = 0; j < ROW_WARPS; j++) sum += red[j][c];
    part[(size_t)blockIdx.x * C + c] = sum;
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

// One block (SR_THREADS) per row. Arg-max: (value, lowest index) reduced over the block. Draw: each thread sums a
// contiguous chunk in double, a block scan gives each chunk's start, and the thread whose chunk holds u walks it
// as the CPU does; if rounding leaves u past every chunk, the last index with mass.
constexpr int SR_THREADS = 512;
__global__ void __launch_bounds__(SR_THREADS) k_sample_rows(const float* x, const double* u, int V, int* token,
                                                            float* logp) {
  __shared__ double scan[SR_THREADS];
  __shared__ float bv[SR_THREADS];
  __shared__ int bi[SR_THREADS];
  __shared__ int found;
  const size_t n = blockIdx.x;
  const float* z = x + n * V;
  const double un = u[n];
  const int tid = threadIdx.x;
  if (tid == 0) found = -1;
  if (un < 0) {
    float best = -1.f;
    int at = V;
    for (int i = tid; i < V; i += SR_THREADS)
      if (z[i] > best) best = z[i], at = i;
    bv[tid] = best;
    bi[tid] = at;
    __syncthreads();
    for (int o = SR_THREADS / 2; o > 0; o >>= 1) {
      if (tid < o && (bv[tid + o] > bv[tid] || (bv[tid + o] == bv[tid] && bi[tid + o] < bi[tid])))
        bv[tid] = bv[tid + o], bi[tid] = bi[tid + o];
      __syncthreads();
    }
    if (tid == 0) found = bi[0];
  } else {
    const int chunk = (V + SR_THREADS - 1) / SR_THREADS, a = min(V, tid * chunk), b = min(V, a + chunk);
    double sum = 0.0;
    for (int i = a; i < b; i++) sum += z[i];
    scan[tid] = sum;
    __syncthreads();
    for (int o = 1; o < SR_THREADS; o <<= 1) {  // inclusive Hillis-Steele scan
      const double add = tid >= o ? scan[tid - o] : 0.0;
      __syncthreads();
      scan[tid] += add;
      __syncthreads();
    }
    const double start = scan[tid] - sum;
    if (a < b && start <= un && un < scan[tid]) {
      double left = un - start;
      int pick = b - 1;
      for (int i = a; i < b; i++) {
        left -= z[i];
        if (left < 0) {
          pick = i;
          break;
        }
      }
      found = pick;
    }
    __syncthreads();
    if (tid == 0 && found < 0) {
      int i = V - 1;
      while (i > 0 && z[i] == 0.f) i--;
      found = i;
    }
  }
  __syncthreads();
  if (tid == 0) {
    token[n] = found;
    logp[n] = (float)log((double)z[found]);
  }
}

__global__ void k_adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                        float eps, float decay, float step, float sbc2) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (sqrtf(vi) / sbc2 + eps);
  }
}

// ---------------------------------------------------------------------------------------------------------------

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

// Host int arrays staged to the device, re-sent only when their contents change (tokens and seq_starts are used by
// several kernels of one step).
struct IntStage {
  Scratch dev;
  std::vector<int32_t> last;
  const int* put(const int32_t* host, size_t n) {
    if (last.size() == n && std::memcmp(last.data(), host, n * sizeof(int32_t)) == 0) return (const int*)dev.p;
    int* d = (int*)dev.get(std::max<size_t>(n, 1) * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpy(d, host, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    last.assign(host, host + n);
    return d;
  }
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      invalid("device 'cuda': no CUDA GPU is usable on this machine");
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUBLAS_CHECK(cublasCreate(&blas_));
    // cuBLAS on Hopper wants a workspace of 32 MiB for its fastest kernels.
    CUBLAS_CHECK(cublasSetWorkspace(blas_, ws_.get(32u << 20), 32u << 20));
    CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    for (Scratch* s : {&ws_, &ss_, &act_a_, &act_b_, &inv_, &att_, &colp_, &invt_, &samp_, &shadow_, &att_part_, &att_cnt_, &tokens_.dev,
                       &pos_.dev, &seqs_.dev, &targets_.dev, &slot_.dev})
      s->gen = &gen_;
  }
  ~CudaKernels() override {
    graphs_.clear();
    cap_.reset();
    if (cap_stream_) cudaStreamDestroy(cap_stream_);
    for (auto& e : wcache_) cudaFree(e.second.p);
    for (auto& e : wcat_) cudaFree(e.second.p);
    if (blas_) cublasDestroy(blas_);
  }
  const char* name() const override { return "cuda"; }
  void set_threads(int) override {}
  bool host_visible() const override { return false; }

  float* alloc(size_t n) override {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 255) / 256 * 256);
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t freeb = 0, total = 0;
      cudaMemGetInfo(&freeb, &total);
      invalid("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory (" +
              std::to_string(freeb >> 20) + " MiB free of " + std::to_string(total >> 20) + "): " + cudaGetErrorString(e));
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    sizes_[static_cast<float*>(p)] = n;
    return static_cast<float*>(p);
  }
  void release(float* p) override {
    ++gen_;  // graphs may have captured this address
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      evict(p, it->second, true);
      sizes_.erase(it);
    }
    cudaFree(p);
  }
  void zero(float* p, size_t n) override {
    evict(p, n);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  }
  void copy(float* dst, const float* src, size_t n) override {
    evict(dst, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void to_host(float* host_dst, const float* src, size_t n) override {
    CUDA_CHECK(cudaMemcpy(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  void from_host(float* dst, const float* host_src, size_t n) override {
    evict(dst, n);
    CUDA_CHECK(cudaMemcpy(dst, host_src, n * sizeof(float), cudaMemcpyHostToDevice));
  }
  void add_inplace(float* y, const float* x, size_t n) override {
    evict(y, n);
    k_add<<<blocks_for(n, 256), 256, 0, stream_>>>(y, x, n);
    LAUNCH_CHECK("add_inplace");
  }
  void dropout(float* out, const float* x, size_t n, float p, uint64_t seed) override {
    evict(out, n);
    const uint32_t cut = (uint32_t)std::ceil((double)p * 16777216.0);
    k_dropout<<<blocks_for(n, 256), 256, 0, stream_>>>(out, x, n, cut, 1.f / (1.f - p), seed);
    LAUNCH_CHECK("dropout");
  }
  void scale(float* x, size_t n, float s) override {
    evict(x, n);
    k_scale<<<blocks_for(n, 256), 256, 0, stream_>>>(x, n, s);
    LAUNCH_CHECK("scale");
  }
  double sum_squares(const float* x, size_t n) override {
    double* part = (double*)ss_.get(SS_BLOCKS * sizeof(double));
    k_sum_squares<<<SS_BLOCKS, SS_THREADS, 0, stream_>>>(part, x, n);
    LAUNCH_CHECK("sum_squares");
    double h[SS_BLOCKS];
    CUDA_CHECK(cudaMemcpy(h, part, sizeof h, cudaMemcpyDeviceToHost));
    double total = 0.0;
    for (double v : h) total += v;
    return total;
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int H) override {
    const int* d = ints(tokens_, tokens, (size_t)T);
    k_embedding_forward<<<T, 256, 0, stream_>>>(out, d, wte, T, H);
    LAUNCH_CHECK("embedding_forward");
    settle();
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int H) override {
    const int* d = tokens_.put(tokens, (size_t)T);
    k_embedding_backward<<<T, 256, 0, stream_>>>(dwte, dout, d, T, H);
    LAUNCH_CHECK("embedding_backward");
    settle();
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps) override {
    k_rmsnorm_forward<<<T, row_threads(C), 0, stream_>>>(out, rstd, inp, w, C, eps);
    LAUNCH_CHECK("rmsnorm_forward");
    settle();
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int T, int C) override {
    rmsnorm_back(dinp, nullptr, dw, dout, inp, w, rstd, T, C);
    settle();
  }

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                      bool accumulate) override {
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    const bf16* W = weight_bf16(w, (size_t)OC * C);
    evict(out, (size_t)N * OC);
    // row-major out[N,OC] = inp[N,C] w[OC,C]^T  <=>  column-major out^T = w^T-view(T) * inp-view
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, A, C, accumulate ? 1.f : 0.f, out, OC);
    if (bias) {
      k_add_bias<<<blocks_for((size_t)N * OC, 256), 256, 0, stream_>>>(out, bias, N, OC);
      LAUNCH_CHECK("matmul bias");
    }
    settle();
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int N,
                       int C, int OC) override {
    const bf16* dO = to_bf16(act_b_, dout, (size_t)N * OC);
    if (dinp) {
      const bf16* W = weight_bf16(w, (size_t)OC * C);
      // dinp[N,C] += dout[N,OC] w[OC,C]
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 1.f, dinp, C);
    }
    if (dw) {  // (null: a frozen weight)
      const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
      // dw[OC,C] += dout^T[OC,N] inp[N,C]
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, A, C, dO, OC, 1.f, dw, C);
    }
    if (dbias) colsum(dbias, dout, nullptr, nullptr, N, OC);
    settle();
  }

  void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd,
                    float eps) override {
    const long rows = (long)T * nh;
    k_head_rmsnorm<<<blocks_for((size_t)rows * 32, 256), 256, 0, stream_>>>(x, ld, saved, rstd, w, T, nh, hd, eps);
    LAUNCH_CHECK("head_rmsnorm");
    settle();
  }
  void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w, const float* rstd,
                             int T, int nh, int hd) override {
    // the weight's gradient from d out (rows of hd floats one after the other: ld must be nh * hd here)
    if (ld != nh * hd) invalid("head_rmsnorm_backward: the CUDA layer takes d out as contiguous heads");
    colsum(dw, dx, saved, rstd, T * nh, hd);
    const long rows = (long)T * nh;
    k_head_rmsnorm_back<<<blocks_for((size_t)rows * 32, 256), 256, 0, stream_>>>(dx, ld, saved, w, rstd, T, nh, hd);
    LAUNCH_CHECK("head_rmsnorm_backward");
    settle();
  }

  void rope_table(float* cosb, float* sinb, const int32_t* pos, int T, int hd, const float* inv_freq) override {
    const int half = hd / 2;
    std::vector<float> inv(inv_freq, inv_freq + half);
    float* dinv = (float*)inv_.get(half * sizeof(float));
    if (inv != inv_host_) {  // the same table every step of a model: sent once
      CUDA_CHECK(cudaMemcpy(dinv, inv.data(), half * sizeof(float), cudaMemcpyHostToDevice));
      inv_host_ = inv;
    }
    const int* dpos = ints(pos_, pos, (size_t)T);
    k_rope_table<<<blocks_for((size_t)T * half, 256), 256, 0, stream_>>>(cosb, sinb, dpos, dinv, T, half);
    LAUNCH_CHECK("rope_table");
  }
  void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    k_rope<false><<<blocks_for((size_t)T * nh * hd / 2, 256), 256, 0, stream_>>>(x, cosb, sinb, T, nh, hd);
    LAUNCH_CHECK("rope_forward");
    settle();
  }
  void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    k_rope<true><<<blocks_for((size_t)T * nh * hd / 2, 256), 256, 0, stream_>>>(dx, cosb, sinb, T, nh, hd);
    LAUNCH_CHECK("rope_backward");
    settle();
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    attention_forward16(out, nullptr, lse, q, k, v, seq_starts, S, T, NH, NKV, hd);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const int32_t* seq_starts, int S, int T,
                          int NH, int NKV, int hd) override {
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = std::max(max_len, seq_starts[s + 1] - seq_starts[s]);
    const int* d = seqs_.put(seq_starts, (size_t)S + 1);
    float* scratch = (float*)att_.get(cuda::attention_backward_scratch(T, NH) * sizeof(float));
    cuda::attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, d, S, max_len, T, NH, NKV, hd, 0);
    settle();
  }

  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    k_swiglu_forward<<<blocks_for(n, 256), 256, 0, stream_>>>(out, gate, up, n);
    LAUNCH_CHECK("swiglu_forward");
    settle();
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       size_t n) override {
    k_swiglu_backward<<<blocks_for(n, 256), 256, 0, stream_>>>(dgate, dup, dout, gate, up, n);
    LAUNCH_CHECK("swiglu_backward");
    settle();
  }

  void logsoftmax_forward(float* logits, float* logp, float* ent, const int32_t* targets, int N, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    k_logsoftmax_forward<<<N, LS_THREADS, 0, stream_>>>(logits, logp, ent, d, V);
    LAUNCH_CHECK("logsoftmax_forward");
    settle();
  }
  void logsoftmax_backward(float* logprobs, const float* dlogp, const float* dent, const float* ent,
                           const int32_t* targets, int N, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    k_logsoftmax_backward<<<N, LS_THREADS, 0, stream_>>>(logprobs, dlogp, dent, ent, d, V);
    LAUNCH_CHECK("logsoftmax_backward");
    settle();
  }

  size_t kv_elem_bytes() const override { return sizeof(bf16); }
  void kv_store(void* kc, void* vc, const float* k, const float* v, const int32_t* slot, const int32_t* pos, int T,
                int KD, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    k_kv_store<<<blocks_for((size_t)T * KD, 256), 256, 0, stream_>>>((bf16*)kc, (bf16*)vc, k, v, ds, dp, T, KD,
                                                                     max_len);
    LAUNCH_CHECK("kv_store");
    settle();
  }
  void attention_cached(float* out, const float* q, const void* kcache, const void* vcache, const int32_t* slot,
                        const int32_t* pos, int T, int NH, int NKV, int hd, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    const bf16 *kc = (const bf16*)kcache, *vc = (const bf16*)vcache;
    const float sc = 1.0f / std::sqrt((float)hd);
    bf16* o16 = nullptr;
    if (fused_) {  // the o-projection's operand, picked up by matmul_cat(fresh)
      o16 = (bf16*)shadow_.get(std::max<size_t>((size_t)T * NH * hd, 1) * sizeof(bf16));
      shadow_src_ = out;
      shadow_n_ = (size_t)T * NH * hd;
    }
    const int gq = NH / NKV, lpk = hd == 32 ? 4 : hd == 64 ? 8 : hd == 128 ? 16 : 0;
    if (lpk && gq <= 8) {
      // Warps a block: many where there are few blocks (a decode step of a small batch, so more warps share each
      // row's keys), fewer as the blocks fill the multiprocessors.
      const long rows = (long)T * NKV;
      const int G = gq <= 1 ? 1 : gq <= 2 ? 2 : gq <= 4 ? 4 : 8;
      // 8 warps a block; 4 where the blocks are many (a prefill). A step of fewer than 16 rows (a decode step of a
      // batch of a few) also splits each row's keys over up to 4 blocks, but never below one round of a block's
      // loads; the split depends on max_len, not on the lengths, so a captured graph stays right as they grow. The
      // choice is measured in test/gpu/RESULTS.md ("A bf16 KV cache and a decode attention ...").
      int warps = rows <= 8L * sms() ? 8 : 4, ns = 1;
      if (rows < 16) {
        const int round = warps * (32 / lpk) * (G >= 8 ? 2 : 4);
        ns = (int)std::max<long>(1, std::min<long>({(16 + rows - 1) / rows, 4L, (max_len + round - 1) / round}));
      }
      if (G == 8) warps = std::min(warps, 8);
      float* part = nullptr;
      int* cnt = nullptr;
      if (ns > 1) {
        part = (float*)att_part_.get((size_t)rows * ns * G * (hd + 2) * sizeof(float));
        const size_t had = att_cnt_.bytes;  // a new allocation (which may reuse the old address) starts at 0
        cnt = (int*)att_cnt_.get((size_t)rows * sizeof(int));
        if (att_cnt_.bytes != had) CUDA_CHECK(cudaMemsetAsync(cnt, 0, att_cnt_.bytes, stream_));
      }
      const size_t smem = (size_t)warps * G * (hd + 2) * sizeof(float);
      const dim3 grid(T, NKV, ns);
#define RLS_AC16(L, GG) \
  k_attention_cached16<L, GG><<<grid, warps * 32, smem, stream_>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, max_len, sc, part, cnt)
#define RLS_AC16_G(L)                    \
  switch (G) {                           \
    case 1: RLS_AC16(L, 1); break;       \
    case 2: RLS_AC16(L, 2); break;       \
    case 4: RLS_AC16(L, 4); break;       \
    default: RLS_AC16(L, 8); break;      \
  }
      switch (lpk) {
        case 4: RLS_AC16_G(4) break;
        case 8: RLS_AC16_G(8) break;
        default: RLS_AC16_G(16) break;
      }
#undef RLS_AC16_G
#undef RLS_AC16
      LAUNCH_CHECK("attention_cached");
      settle();
      return;
    }
    const dim3 grid(T, NH);
    const bool few = (long)T * NH < 2L * sms();
#define RLS_AC(D)                                                                                                   \
  if (few)                                                                                                          \
    k_attention_cached<D, AC_WARPS_FEW><<<grid, AC_WARPS_FEW * 32, 0, stream_>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, hd, max_len, sc); \
  else                                                                                                              \
    k_attention_cached<D, AC_WARPS><<<grid, AC_WARPS * 32, 0, stream_>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, hd, max_len, sc);
    switch ((hd + 31) / 32) {
      case 1: RLS_AC(1) break;
      case 2: RLS_AC(2) break;
      case 3: RLS_AC(3) break;
      case 4: RLS_AC(4) break;
      case 5: case 6: case 7: case 8: RLS_AC(8) break;
      default: invalid("attention_cached: head dim " + std::to_string(hd) + " > 256 is not supported on cuda");
    }
#undef RLS_AC
    LAUNCH_CHECK("attention_cached");
    settle();
  }
  void softmax_rows(float* x, const float* inv_temp, int N, int V) override {
    const float* d;
    if (cap_) {
      d = (const float*)stage_in(inv_temp, (size_t)N * sizeof(float));
    } else {
      float* dd = (float*)invt_.get(std::max(N, 1) * sizeof(float));
      CUDA_CHECK(cudaMemcpy(dd, inv_temp, N * sizeof(float), cudaMemcpyHostToDevice));
      d = dd;
    }
    k_softmax_rows<<<N, LS_THREADS, 0, stream_>>>(x, d, V);
    LAUNCH_CHECK("softmax_rows");
    settle();
  }

  void sample_rows(const float* x, const double* u, int N, int V, int32_t* token, float* logp) override {
    char* buf = (char*)samp_.get((size_t)N * (sizeof(double) + sizeof(int) + sizeof(float)));
    double* du = (double*)buf;
    int* dt = (int*)(du + N);
    float* dl = (float*)(dt + N);
    if (cap_) {
      const double* su = (const double*)stage_in(u, (size_t)N * sizeof(double));
      k_sample_rows<<<N, SR_THREADS, 0, stream_>>>(x, su, V, dt, dl);
      LAUNCH_CHECK("sample_rows");
      stage_out(token, dt, (size_t)N * sizeof(int));
      stage_out(logp, dl, (size_t)N * sizeof(float));
      return;
    }
    CUDA_CHECK(cudaMemcpy(du, u, (size_t)N * sizeof(double), cudaMemcpyHostToDevice));
    k_sample_rows<<<N, SR_THREADS, 0, stream_>>>(x, du, V, dt, dl);
    LAUNCH_CHECK("sample_rows");
    CUDA_CHECK(cudaMemcpy(token, dt, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(logp, dl, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost));
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
             float wd, float bc1, float bc2) override {
    evict(p, n);
    k_adamw<<<blocks_for(n, 256), 256, 0, stream_>>>(p, g, m, v, n, lr, beta1, beta2, eps, 1.f - lr * wd, lr / bc1, std::sqrt(bc2));
    LAUNCH_CHECK("adamw");
    settle();
  }

  // Fused decode ops (device.h). The producers (add_rmsnorm, swiglu_cat, attention_cached) leave a bf16 copy of
  // their output in shadow_, which matmul_cat(fresh) takes as its operand instead of converting the fp32 one.
  bool fused_decode() const override { return fused_; }
  void add_rmsnorm(float* x, float* out, float* rstd, const float* a, const float* b, const float* w, int T, int C,
                   float eps) override {
    bf16* o16 = (bf16*)shadow_.get(std::max<size_t>((size_t)T * C, 1) * sizeof(bf16));
    shadow_src_ = out;
    shadow_n_ = (size_t)T * C;
    add_rmsnorm_any(x, out, o16, rstd, a, b, w, T, C, eps);
    settle();
  }
  void matmul_cat(float* out, const float* inp, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                  int oc2, int N, int C, bool fresh) override {
    const size_t nin = (size_t)N * C;
    const bf16* A = fresh && inp == shadow_src_ && nin == shadow_n_ ? (const bf16*)shadow_.p : to_bf16(act_a_, inp, nin);
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = oc1 || oc2 ? weight_cat(w0, (size_t)oc0 * C, w1, (size_t)oc1 * C, w2, (size_t)oc2 * C)
                               : weight_bf16(w0, (size_t)oc0 * C);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, A, C, 0.f, out, OC);
    settle();
  }
  void qkv_rope_store(float* q, void* kc, void* vc, const float* qkv, const float* qb, const float* kb,
                      const float* vb, const float* cosb, const float* sinb, const int32_t* slot, const int32_t* pos,
                      int T, int NH, int NKV, int hd, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    qkv_rope(q, (bf16*)kc, (bf16*)vc, qkv, qb, kb, vb, cosb, sinb, ds, dp, max_len, T, NH, NKV, hd);
    settle();
  }
  void swiglu_cat(float* out, const float* gu, int T, int I) override {
    const size_t n = (size_t)T * I;
    bf16* o16 = (bf16*)shadow_.get(std::max<size_t>(n, 1) * sizeof(bf16));
    shadow_src_ = out;
    shadow_n_ = n;
    k_swiglu_cat<<<blocks_for(n, 256), 256, 0, stream_>>>(out, o16, gu, T, I);
    LAUNCH_CHECK("swiglu_cat");
    settle();
  }

  // Fused training ops (device.h): every bf16 operand is written by its producer, q|k|v and gate|up are one
  // product each, forward and backward, on the stacked bf16 weights the decode path uses too.
  bool fused_train() const override { return fused_; }
  void add_rmsnorm16(float* x, uint16_t* out16, float* rstd, const float* a, const float* b, const float* w, int T,
                     int C, float eps) override {
    add_rmsnorm_any(x, nullptr, (bf16*)out16, rstd, a, b, w, T, C, eps);
    settle();
  }
  const bf16* stacked(const float* w0, int oc0, const float* w1, int oc1, const float* w2, int oc2, int C) {
    return oc1 || oc2 ? weight_cat(w0, (size_t)oc0 * C, w1, (size_t)oc1 * C, w2, (size_t)oc2 * C)
                      : weight_bf16(w0, (size_t)oc0 * C);
  }
  void matmul16(float* out, const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                int oc2, int N, int C, bool accumulate) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = stacked(w0, oc0, w1, oc1, w2, oc2, C);
    evict(out, (size_t)N * OC);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, (const bf16*)inp16, C, accumulate ? 1.f : 0.f, out, OC);
    settle();
  }
  void matmul16_to16(uint16_t* out16, const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1,
                     const float* w2, int oc2, int N, int C) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = stacked(w0, oc0, w1, oc1, w2, oc2, C);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, (const bf16*)inp16, C, 0.f, out16, OC, CUDA_R_16BF);
    settle();
  }
  void matmul16_backward(float* dinp, uint16_t* dinp16, float* dw0, float* dw1, float* dw2, const uint16_t* dout16,
                         const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                         int oc2, int N, int C) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* dO = (const bf16*)dout16;
    const bf16* A = (const bf16*)inp16;
    if (dinp || dinp16) {
      const bf16* W = stacked(w0, oc0, w1, oc1, w2, oc2, C);
      if (dinp) {
        evict(dinp, (size_t)N * C);
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 0.f, dinp, C);
      } else {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 0.f, dinp16, C, CUDA_R_16BF);
      }
    }
    // dw_i[oc_i, C] += dout[:, cols of i]^T inp: one product where the gradients lie one after the other
    const bool contiguous = (!oc1 || dw1 == dw0 + (size_t)oc0 * C) && (!oc2 || dw2 == dw1 + (size_t)oc1 * C);
    if (contiguous) {
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, A, C, dO, OC, 1.f, dw0, C);
    } else {
      float* dw[3] = {dw0, dw1, dw2};
      const int oc[3] = {oc0, oc1, oc2};
      for (int i = 0, off = 0; i < 3; off += oc[i], i++)
        if (oc[i]) gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, oc[i], N, A, C, dO + off, OC, 1.f, dw[i], C);
    }
    settle();
  }
  void qkv_rope_split(float* q, float* k, float* v, const float* qkv, const float* qb, const float* kb,
                      const float* vb, const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) override {
    qkv_rope(q, k, v, qkv, qb, kb, vb, cosb, sinb, nullptr, nullptr, 0, T, NH, NKV, hd);
    settle();
  }
  void qkv_rope_back16(uint16_t* dqkv16, float* dq, float* dk, const float* dv, float* dqb, float* dkb, float* dvb,
                       const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) override {
    const unsigned grid = blocks_for(T, 1);
#define RLS_BACK(P, W) \
  k_qkv_rope_back16<P, W><<<grid, ROPE_THREADS, 0, stream_>>>((bf16*)dqkv16, dq, dk, dv, cosb, sinb, T, NH, NKV, hd)
    const bool write = dqb || dkb;
    if (hd % 4 == 0) {
      if (write) RLS_BACK(2, true);
      else RLS_BACK(2, false);
    } else {
      if (write) RLS_BACK(1, true);
      else RLS_BACK(1, false);
    }
#undef RLS_BACK
    LAUNCH_CHECK("qkv_rope_back16");
    if (dqb) colsum(dqb, dq, nullptr, nullptr, T, NH * hd);
    if (dkb) colsum(dkb, dk, nullptr, nullptr, T, NKV * hd);
    if (dvb) colsum(dvb, dv, nullptr, nullptr, T, NKV * hd);
    settle();
  }
  void swiglu16(uint16_t* out16, const uint16_t* gu16, int T, int I) override {
    const bf16* gu = (const bf16*)gu16;
    if (I % 8 == 0) k_swiglu16<8><<<blocks_for((size_t)T * I / 8, 256), 256, 0, stream_>>>((bf16*)out16, gu, T, I);
    else k_swiglu16<1><<<blocks_for((size_t)T * I, 256), 256, 0, stream_>>>((bf16*)out16, gu, T, I);
    LAUNCH_CHECK("swiglu16");
    settle();
  }
  void swiglu_back16(uint16_t* dgu16, const uint16_t* dout16, const uint16_t* gu16, int T, int I) override {
    const bf16 *d = (const bf16*)dout16, *gu = (const bf16*)gu16;
    if (I % 8 == 0)
      k_swiglu_back16<8><<<blocks_for((size_t)T * I / 8, 256), 256, 0, stream_>>>((bf16*)dgu16, d, gu, T, I);
    else k_swiglu_back16<1><<<blocks_for((size_t)T * I, 256), 256, 0, stream_>>>((bf16*)dgu16, d, gu, T, I);
    LAUNCH_CHECK("swiglu_back16");
    settle();
  }
  void rmsnorm_backward16(float* dinp, uint16_t* dinp16, float* dw, const float* dout, const float* inp, const float* w,
                          const float* rstd, int T, int C) override {
    rmsnorm_back(dinp, (bf16*)dinp16, dw, dout, inp, w, rstd, T, C);
    settle();
  }
  void logits16_forward(uint16_t* z16, float* lse, float* logp, float* ent, const float* inp, const float* w,
                        const int32_t* targets, int N, int C, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    const bf16* W = weight_bf16(w, (size_t)V * C);
    // row-major z16[N, V] = inp[N, C] w[V, C]^T
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, W, C, A, C, 0.f, z16, V, CUDA_R_16BF);
    if (V % 8 == 0) k_logsoftmax16<true><<<N, LS_THREADS, 0, stream_>>>((const bf16*)z16, lse, logp, ent, d, V);
    else k_logsoftmax16<false><<<N, LS_THREADS, 0, stream_>>>((const bf16*)z16, lse, logp, ent, d, V);
    LAUNCH_CHECK("logsoftmax16");
    settle();
  }
  void logits16_backward(float* dinp, float* dw, uint16_t* z16, const float* lse, const float* dlogp,
                         const float* dent, const float* ent, const int32_t* targets, const float* inp, const float* w,
                         int N, int C, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    bf16* dz = (bf16*)z16;
    if (V % 8 == 0) k_dlogits16<true><<<N, LS_THREADS, 0, stream_>>>(dz, lse, dlogp, dent, ent, d, V);
    else k_dlogits16<false><<<N, LS_THREADS, 0, stream_>>>(dz, lse, dlogp, dent, ent, d, V);
    LAUNCH_CHECK("dlogits16");
    const bf16* W = weight_bf16(w, (size_t)V * C);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, W, C, dz, V, 1.f, dinp, C);
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, A, C, dz, V, 1.f, dw, C);
    settle();
  }
  void attention_forward16(float* out, uint16_t* out16, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = std::max(max_len, seq_starts[s + 1] - seq_starts[s]);
    const int* d = seqs_.put(seq_starts, (size_t)S + 1);
    if (!cuda::attention_forward(out, (bf16*)out16, lse, q, k, v, d, S, max_len, T, NH, NKV, hd, 0) && out16) {
      const size_t n = (size_t)T * NH * hd;
      k_to_bf16<<<blocks_for(n / 2 + 1, 256), 256, 0, stream_>>>((bf16*)out16, out, n);
      LAUNCH_CHECK("attention output -> bf16");
    }
    settle();
  }

  // CUDA graphs (device.h). A capture runs on a stream of its own (non-blocking, so that work other threads queue
  // on the legacy stream meanwhile neither joins nor breaks it); replays are launched on the legacy stream, in order
  // with every other call of this object. Host inputs the captured kernels take are copied by memcpy nodes from
  // pinned staging, refilled from the same host addresses before each replay; host outputs likewise after it.
  bool graphs() const override { return graphs_on_ && !sync_; }
  bool graph_ready(int id) override {
    sync_gen();
    return graphs_.count(id) != 0;
  }
  void capture_begin(size_t stage_bytes) override {
    if (cap_) invalid("CUDA graph: a capture is already in progress");
    sync_gen();
    if (!cap_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&cap_stream_, cudaStreamNonBlocking));
    auto g = std::make_unique<Graph>();
    g->cap = std::max<size_t>(256, (stage_bytes + 255) / 256 * 256);
    CUDA_CHECK(cudaHostAlloc((void**)&g->pin, g->cap, cudaHostAllocDefault));
    CUDA_CHECK(cudaMalloc((void**)&g->dev, g->cap));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    refresh_weights();  // the graph must find every bf16 weight copy valid (none re-made inside it)
    cap_used_ = 0;
    cap_gen_ = gen_;
    use_stream(cap_stream_);
    const cudaError_t e = cudaStreamBeginCapture(cap_stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      use_stream(nullptr);
      cudaGetLastError();
      ::rls::cuda::fail("cudaStreamBeginCapture", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    cap_ = std::move(g);
  }
  void capture_end(int id) override {
    if (!cap_) invalid("CUDA graph: no capture in progress");
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(cap_stream_, &graph);
    use_stream(nullptr);
    std::unique_ptr<Graph> g = std::move(cap_);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      ::rls::cuda::fail("cudaStreamEndCapture", cudaGetErrorString(e), __FILE__, __LINE__);
    }
    if (gen_ != cap_gen_) {  // something was reallocated while capturing: the graph may hold a freed address
      cudaGraphDestroy(graph);
      invalid("CUDA graph: a buffer was reallocated during the capture");
    }
    const cudaError_t ie = cudaGraphInstantiateWithFlags(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ie != cudaSuccess) {
      g->exec = nullptr;
      cudaGetLastError();
      ::rls::cuda::fail("cudaGraphInstantiate", cudaGetErrorString(ie), __FILE__, __LINE__);
    }
    graphs_[id] = std::move(g);
  }
  void capture_abort() override {
    if (!cap_) return;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(cap_stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    use_stream(nullptr);
    cap_.reset();
  }
  void replay(int id) override {
    auto it = graphs_.find(id);
    if (it == graphs_.end() || gen_ != graphs_gen_) invalid("CUDA graph: replay of a graph that is not ready");
    Graph& g = *it->second;
    CUDA_CHECK(cudaEventSynchronize(g.done));  // the last replay no longer reads or writes the pinned staging
    refresh_weights();
    for (const Xfer& x : g.in) std::memcpy(g.pin + x.off, x.host, x.bytes);
    CUDA_CHECK(cudaGraphLaunch(g.exec, 0));
    CUDA_CHECK(cudaEventRecord(g.done, 0));
    if (!g.out.empty()) {
      CUDA_CHECK(cudaEventSynchronize(g.done));
      for (const Xfer& x : g.out) std::memcpy(x.host, g.pin + x.off, x.bytes);
    }
  }

 private:
  // RLSTREAM_CUDA_SYNC=1 waits for every kernel to finish, so that the model's wall-clock profile (profile())
  // measures GPU time per kind of kernel; off by default (launches stay asynchronous).
  void settle() {
    if (sync_) CUDA_CHECK(cudaDeviceSynchronize());
  }
  const bool sync_ = env_is("RLSTREAM_CUDA_SYNC", '1');

  static int row_threads(int C) { return C >= 1024 ? 512 : C >= 256 ? 256 : 128; }
  int sms() {
    if (sms_ == 0) CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0));
    return sms_;
  }
  int sms_ = 0;  // multiprocessors of the device

  // k_qkv_rope_split: k and v into rows t of [T, KD] (slot null) or into the caches at (slot[t], pos[t])
  template <typename KV>
  void qkv_rope(float* q, KV* k, KV* v, const float* qkv, const float* qb, const float* kb, const float* vb,
                const float* cosb, const float* sinb, const int* slot, const int* pos, int max_len, int T, int NH,
                int NKV, int hd) {
    const unsigned grid = blocks_for(T, 1);
    if (hd % 4 == 0)
      k_qkv_rope_split<2, KV><<<grid, ROPE_THREADS, 0, stream_>>>(q, k, v, qkv, qb, kb, vb, cosb, sinb, slot, pos, max_len,
                                                              T, NH, NKV, hd);
    else
      k_qkv_rope_split<1, KV><<<grid, ROPE_THREADS, 0, stream_>>>(q, k, v, qkv, qb, kb, vb, cosb, sinb, slot, pos, max_len,
                                                              T, NH, NKV, hd);
    LAUNCH_CHECK("qkv rotary split");
  }
  // partial column sums: COL_CHUNKS x C floats for colsum, ROW_BLOCKS x C for the rmsnorm backward
  float* col_partials(int C) {
    return (float*)colp_.get(std::max<size_t>((size_t)ROW_BLOCKS, COL_CHUNKS) * C * sizeof(float));
  }
  // K of the warp-per-row kernels for rows of C floats (columns per lane / 4, rounded up to an instantiated one),
  // 0 where they do not apply
  static int row_k(int C) {
    if (C % 4 != 0 || C > 128 * ROW_K_MAX) return 0;
    const int k = (C + 127) / 128;
    return k <= 2 ? k : k <= 4 ? 4 : k <= 6 ? 6 : 8;
  }
  // blocks of the rmsnorm backward over rows: its weight gradient's partial sums are ROW_BLOCKS x C floats
  static constexpr int ROW_BLOCKS = 512;

  void add_rmsnorm_any(float* x, float* out, bf16* out16, float* rstd, const float* a, const float* b, const float* w,
                       int T, int C, float eps) {
    const unsigned grid = (unsigned)((T + ROW_WARPS - 1) / ROW_WARPS);
#define RLS_ROWS(K) \
  k_add_rmsnorm_rows<K><<<grid, ROW_WARPS * 32, 0, stream_>>>(x, out, out16, rstd, a, b, w, T, C, eps)
    switch (row_k(C)) {
      case 1: RLS_ROWS(1); break;
      case 2: RLS_ROWS(2); break;
      case 4: RLS_ROWS(4); break;
      case 6: RLS_ROWS(6); break;
      case 8: RLS_ROWS(8); break;
      default: k_add_rmsnorm<<<T, row_threads(C), 0, stream_>>>(x, out, out16, rstd, a, b, w, C, eps);
    }
#undef RLS_ROWS
    LAUNCH_CHECK("add_rmsnorm");
  }
  // dinp += rmsnorm backward (dinp16, where set: its bf16), dw += column sums of dout * inp * rstd
  void rmsnorm_back(float* dinp, bf16* dinp16, float* dw, const float* dout, const float* inp, const float* w,
                    const float* rstd, int T, int C) {
    const int k = row_k(C);
    if (k == 0) {
      k_rmsnorm_backward_dx<<<T, row_threads(C), 0, stream_>>>(dinp, dinp16, dout, inp, w, rstd, C);
      LAUNCH_CHECK("rmsnorm_backward dx");
      colsum(dw, dout, inp, rstd, T, C);
      return;
    }
    float* part = col_partials(C);
#define RLS_ROWS(K) \
  k_rmsnorm_back_rows<K><<<ROW_BLOCKS, ROW_WARPS * 32, 0, stream_>>>(dinp, dinp16, part, dout, inp, w, rstd, T, C)
    switch (k) {
      case 1: RLS_ROWS(1); break;
      case 2: RLS_ROWS(2); break;
      case 4: RLS_ROWS(4); break;
      case 6: RLS_ROWS(6); break;
      default: RLS_ROWS(8); break;
    }
#undef RLS_ROWS
    LAUNCH_CHECK("rmsnorm backward rows");
    colsum_finish(dw, part, C, ROW_BLOCKS);
  }

  // C (column-major, fp32 or bf16 by ctype) = A * B + beta C, bf16 operands, fp32 accumulation
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16* A, int lda, const bf16* B,
            int ldb, float beta, void* C, int ldc, cudaDataType_t ctype = CUDA_R_32F) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
      const size_t es = ctype == CUDA_R_32F ? sizeof(float) : sizeof(bf16);
      if (beta == 0.f) CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * es, 0, (size_t)m * es, n, stream_));
      return;
    }
    const float alpha = 1.f;
    CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                              ctype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  const bf16* to_bf16(Scratch& s, const float* x, size_t n) {
    bf16* y = (bf16*)s.get(std::max<size_t>(n, 1) * sizeof(bf16));
    k_to_bf16<<<blocks_for(n / 2 + 1, 256), 256, 0, stream_>>>(y, x, n);
    LAUNCH_CHECK("fp32 -> bf16");
    return y;
  }

  // bf16 copies of weights, made on first use and dropped when anything writes over the fp32 original.
  struct Cached {
    bf16* p;
    size_t n;
    bool valid;
  };
  const bf16* weight_bf16(const float* w, size_t n) {
    auto it = wcache_.find(w);
    if (it != wcache_.end() && it->second.n == n && it->second.valid) return it->second.p;
    if (it != wcache_.end() && it->second.n != n) {
      ++gen_;
      cudaFree(it->second.p);
      wcache_.erase(it);
      it = wcache_.end();
    }
    if (it == wcache_.end()) {
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(bf16)));
      it = wcache_.emplace(w, Cached{(bf16*)p, n, false}).first;
    }
    k_to_bf16<<<blocks_for(n / 2 + 1, 256), 256, 0, stream_>>>(it->second.p, w, n);
    LAUNCH_CHECK("weight fp32 -> bf16");
    it->second.valid = true;
    return it->second.p;
  }
  // One bf16 matrix of up to three weights stacked by rows ([w0; w1; w2]: q, k and v, or gate and up), cached like
  // weight_bf16 (keyed by w0, apart from the single copies).
  struct Cat {
    bf16* p;
    const float* src[3];
    size_t n[3];
    bool valid;
    bool overlaps(const float* a, const float* e) const {
      for (int i = 0; i < 3; i++)
        if (n[i] && src[i] < e && a < src[i] + n[i]) return true;
      return false;
    }
    void convert(cudaStream_t st) const {
      size_t off = 0;
      for (int i = 0; i < 3; i++) {
        if (!n[i]) continue;
        k_to_bf16<<<blocks_for(n[i] / 2 + 1, 256), 256, 0, st>>>(p + off, src[i], n[i]);
        LAUNCH_CHECK("weights fp32 -> bf16 (stacked)");
        off += n[i];
      }
    }
  };
  const bf16* weight_cat(const float* w0, size_t n0, const float* w1, size_t n1, const float* w2, size_t n2) {
    auto it = wcat_.find(w0);
    const bool same = it != wcat_.end() && it->second.src[1] == w1 && it->second.src[2] == w2 &&
                      it->second.n[0] == n0 && it->second.n[1] == n1 && it->second.n[2] == n2;
    if (same && it->second.valid) return it->second.p;
    if (it != wcat_.end() && !same) {
      ++gen_;
      cudaFree(it->second.p);
      wcat_.erase(it);
      it = wcat_.end();
    }
    if (it == wcat_.end()) {
      void* p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n0 + n1 + n2, 1) * sizeof(bf16)));
      it = wcat_.emplace(w0, Cat{(bf16*)p, {w0, w1, w2}, {n0, n1, n2}, false}).first;
    }
    it->second.convert(stream_);
    it->second.valid = true;
    return it->second.p;
  }
  // Cached copies overlapping [p, p+n) become stale; with drop, they are freed (their source memory is going away).
  void evict(const float* p, size_t n, bool drop = false) {
    const float* e = p + n;
    for (auto it = wcat_.begin(); it != wcat_.end();) {
      if (it->second.overlaps(p, e)) {
        if (drop) {
          ++gen_;
          cudaFree(it->second.p);
          it = wcat_.erase(it);
          continue;
        }
        if (it->second.valid) stale_ = true;
        it->second.valid = false;
      }
      ++it;
    }
    for (auto it = wcache_.begin(); it != wcache_.end();) {
      const float* a = it->first;
      if (a < e && p < a + it->second.n) {
        if (drop) {
          ++gen_;
          cudaFree(it->second.p);
          it = wcache_.erase(it);
          continue;
        }
        if (it->second.valid) stale_ = true;
        it->second.valid = false;
      }
      ++it;
    }
  }

  cublasHandle_t blas_ = nullptr;
  Scratch ws_, ss_, act_a_, act_b_, inv_, att_, colp_, invt_, samp_;
  IntStage tokens_, pos_, seqs_, targets_, slot_;
  std::map<const float*, Cached> wcache_;
  std::map<const float*, size_t> sizes_;  // allocations made by alloc(), in floats
  std::vector<float> inv_host_;           // the rotary inverse frequencies last sent to inv_
  std::map<const float*, Cat> wcat_;      // stacked weights (matmul_cat)
  // RLSTREAM_CUDA_FUSED=0: Model runs the plain ops (fused_decode() and fused_train() false) for extend and the
  // training step, for parity and measurement.
  const bool fused_ = !env_off("RLSTREAM_CUDA_FUSED");
  Scratch shadow_;                        // bf16 copy of the last fused producer's output
  Scratch att_part_, att_cnt_;            // the split decode attention's partial results and counters
  const float* shadow_src_ = nullptr;
  size_t shadow_n_ = 0;

  // --- CUDA graphs
  cudaStream_t stream_ = nullptr;  // where launches go: the legacy stream, or the capture's stream while capturing
  const bool graphs_on_ = !env_off("RLSTREAM_CUDA_GRAPHS");
  struct Xfer {
    void* host;
    size_t off, bytes;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    char* pin = nullptr;  // pinned host staging
    char* dev = nullptr;  // its device side
    size_t cap = 0;
    std::vector<Xfer> in, out;
    cudaEvent_t done = nullptr;
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
      if (done) cudaEventDestroy(done);
      if (dev) cudaFree(dev);
      if (pin) cudaFreeHost(pin);
    }
  };
  std::map<int, std::unique_ptr<Graph>> graphs_;
  std::unique_ptr<Graph> cap_;  // the graph being captured
  size_t cap_used_ = 0;
  cudaStream_t cap_stream_ = nullptr;
  // Bumped whenever memory a graph could have captured goes away (release, a scratch buffer growing, a cached bf16
  // weight freed): graphs made under another generation are dropped before the next replay.
  uint64_t gen_ = 0, graphs_gen_ = 0, cap_gen_ = 0;
  bool stale_ = false;  // some cached bf16 weight copy is out of date

  void sync_gen() {
    if (graphs_gen_ != gen_) {
      graphs_.clear();
      graphs_gen_ = gen_;
    }
  }
  void use_stream(cudaStream_t s) {
    stream_ = s;
    CUBLAS_CHECK(cublasSetStream(blas_, s));
    // cublasSetStream resets the workspace to cuBLAS's own pool (allocated on demand: not in a capture)
    CUBLAS_CHECK(cublasSetWorkspace(blas_, ws_.p, ws_.bytes));
  }
  // The bf16 copies a graph reads are re-made in place (same address) when their fp32 weights were written since.
  void refresh_weights() {
    if (!stale_) return;
    for (auto& e : wcache_)
      if (!e.second.valid) {
        k_to_bf16<<<blocks_for(e.second.n / 2 + 1, 256), 256, 0, stream_>>>(e.second.p, e.first, e.second.n);
        LAUNCH_CHECK("weight fp32 -> bf16");
        e.second.valid = true;
      }
    for (auto& e : wcat_)
      if (!e.second.valid) {
        e.second.convert(stream_);
        e.second.valid = true;
      }
    stale_ = false;
  }
  size_t take(size_t bytes) {
    const size_t off = cap_used_, want = (bytes + 255) / 256 * 256;
    if (off + want > cap_->cap) invalid("CUDA graph: staging for the captured inputs is full");
    cap_used_ += want;
    return off;
  }
  // While capturing: a host input of the step, copied in by the graph from pinned staging (one copy per address).
  const void* stage_in(const void* host, size_t bytes) {
    for (const Xfer& x : cap_->in)
      if (x.host == host && x.bytes == bytes) return cap_->dev + x.off;
    const size_t off = take(bytes);
    std::memcpy(cap_->pin + off, host, bytes);
    CUDA_CHECK(cudaMemcpyAsync(cap_->dev + off, cap_->pin + off, bytes, cudaMemcpyHostToDevice, stream_));
    cap_->in.push_back({const_cast<void*>(host), off, bytes});
    return cap_->dev + off;
  }
  // While capturing: a host output, copied to pinned staging by the graph and to `host` after each replay.
  void stage_out(void* host, const void* dsrc, size_t bytes) {
    const size_t off = take(bytes);
    CUDA_CHECK(cudaMemcpyAsync(cap_->pin + off, dsrc, bytes, cudaMemcpyDeviceToHost, stream_));
    cap_->out.push_back({host, off, bytes});
  }
  const int* ints(IntStage& s, const int32_t* host, size_t n) {
    return cap_ ? (const int*)stage_in(host, n * sizeof(int32_t)) : s.put(host, n);
  }

  void colsum_finish(float* dst, const float* part, int C, int chunks) {
    k_colsum_finish<<<(C + CF_COLS - 1) / CF_COLS, dim3(CF_COLS, CF_ROWS), 0, stream_>>>(dst, part, C, chunks);
    LAUNCH_CHECK("column sums (finish)");
  }
  void colsum(float* dst, const float* a, const float* b, const float* rowscale, int T, int C) {
    float* part = col_partials(C);
    const dim3 grid((C + 255) / 256, COL_CHUNKS);
    k_colsum_partial<<<grid, 256, 0, stream_>>>(part, a, b, rowscale, T, C);
    LAUNCH_CHECK("column sums (partial)");
    colsum_finish(dst, part, C, COL_CHUNKS);
  }
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels() { return std::make_unique<CudaKernels>(); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool cuda_memory(size_t* free_bytes, size_t* total_bytes) {
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace rls
