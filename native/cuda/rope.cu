// Rotary position embedding on the GPU: the cos/sin tables of a step, the rotation of q or k (and back), and the
// fused training/decode op that splits q|k|v rows, adds the biases and rotates q and k in one pass (k and v into
// rows, or into the bf16 KV cache).
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

__global__ void k_rope_table(float* cosb, float* sinb, const int* pos, const float* inv, int T, int half) {
  const size_t n = (size_t)T * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(i / half), j = (int)(i % half);
    const float ang = (float)pos[t] * inv[j];  // rounded to float like HF, then cos/sin in double like the CPU
    cosb[i] = (float)cos((double)ang);
    sinb[i] = (float)sin((double)ang);
  }
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

}  // namespace

namespace {

// k_qkv_rope_split: k and v into rows t of [T, KD] (slot null) or into the caches at (slot[t], pos[t])
template <typename KV>
void qkv_rope(float* q, KV* k, KV* v, const float* qkv, const float* qb, const float* kb, const float* vb,
              const float* cosb, const float* sinb, const int* slot, const int* pos, int max_len, int T, int NH,
              int NKV, int hd, cudaStream_t st) {
  const unsigned grid = blocks_for(T, 1);
  if (hd % 4 == 0)
    k_qkv_rope_split<2, KV><<<grid, ROPE_THREADS, 0, st>>>(q, k, v, qkv, qb, kb, vb, cosb, sinb, slot, pos, max_len,
                                                          T, NH, NKV, hd);
  else
    k_qkv_rope_split<1, KV><<<grid, ROPE_THREADS, 0, st>>>(q, k, v, qkv, qb, kb, vb, cosb, sinb, slot, pos, max_len,
                                                          T, NH, NKV, hd);
  LAUNCH_CHECK("qkv rotary split");
}

}  // namespace

void rope_table(float* cosb, float* sinb, const int* pos, const float* inv_freq, int T, int half, cudaStream_t st) {
  k_rope_table<<<blocks_for((size_t)T * half, 256), 256, 0, st>>>(cosb, sinb, pos, inv_freq, T, half);
  LAUNCH_CHECK("rope_table");
}
void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd, cudaStream_t st) {
  k_rope<false><<<blocks_for((size_t)T * nh * hd / 2, 256), 256, 0, st>>>(x, cosb, sinb, T, nh, hd);
  LAUNCH_CHECK("rope_forward");
}
void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd, cudaStream_t st) {
  k_rope<true><<<blocks_for((size_t)T * nh * hd / 2, 256), 256, 0, st>>>(dx, cosb, sinb, T, nh, hd);
  LAUNCH_CHECK("rope_backward");
}

void qkv_rope_split(float* q, float* k, float* v, const float* qkv, const float* qb, const float* kb, const float* vb,
                    const float* cosb, const float* sinb, int T, int NH, int NKV, int hd, cudaStream_t st) {
  qkv_rope(q, k, v, qkv, qb, kb, vb, cosb, sinb, nullptr, nullptr, 0, T, NH, NKV, hd, st);
}
void qkv_rope_store(float* q, bf16* kc, bf16* vc, const float* qkv, const float* qb, const float* kb, const float* vb,
                    const float* cosb, const float* sinb, const int* slot, const int* pos, int max_len, int T, int NH,
                    int NKV, int hd, cudaStream_t st) {
  qkv_rope(q, kc, vc, qkv, qb, kb, vb, cosb, sinb, slot, pos, max_len, T, NH, NKV, hd, st);
}

void qkv_rope_back16(bf16* dqkv16, float* dq, float* dk, const float* dv, const float* cosb, const float* sinb, int T,
                     int NH, int NKV, int hd, bool write, cudaStream_t st) {
  const unsigned grid = blocks_for(T, 1);
#define RLS_BACK(P, W) \
  k_qkv_rope_back16<P, W><<<grid, ROPE_THREADS, 0, st>>>(dqkv16, dq, dk, dv, cosb, sinb, T, NH, NKV, hd)
  if (hd % 4 == 0) {
    if (write) RLS_BACK(2, true);
    else RLS_BACK(2, false);
  } else {
    if (write) RLS_BACK(1, true);
    else RLS_BACK(1, false);
  }
#undef RLS_BACK
  LAUNCH_CHECK("qkv_rope_back16");
}

}  // namespace rls::cuda
