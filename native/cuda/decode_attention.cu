// Decoding over the slot KV cache on the GPU: k and v stored in bf16 at (slot, position), and attention of each new
// token over its slot's cached keys. Head dims 32, 64 and 128 with at most 8 query heads a key head take the kernel
// that reads each cached row once for the whole group (and splits a row's keys over blocks where the rows are few);
// any other head dim up to 256 takes one block per (token, query head).
#include <cmath>
#include <string>

#include "../src/errors.h"
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

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

}  // namespace

void kv_store(bf16* kc, bf16* vc, const float* k, const float* v, const int* slot, const int* pos, int T, int KD,
              int max_len, cudaStream_t st) {
  k_kv_store<<<blocks_for((size_t)T * KD, 256), 256, 0, st>>>(kc, vc, k, v, slot, pos, T, KD, max_len);
  LAUNCH_CHECK("kv_store");
}

void attention_cached(float* out, bf16* o16, const float* q, const bf16* kc, const bf16* vc, const int* ds,
                      const int* dp, int T, int NH, int NKV, int hd, int max_len, int sms, Scratch& att_part,
                      Scratch& att_cnt, cudaStream_t st) {
  const float sc = 1.0f / std::sqrt((float)hd);
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
    int warps = rows <= 8L * sms ? 8 : 4, ns = 1;
    if (rows < 16) {
      const int round = warps * (32 / lpk) * (G >= 8 ? 2 : 4);
      ns = (int)std::max<long>(1, std::min<long>({(16 + rows - 1) / rows, 4L, (max_len + round - 1) / round}));
    }
    if (G == 8) warps = std::min(warps, 8);
    float* part = nullptr;
    int* cnt = nullptr;
    if (ns > 1) {
      part = (float*)att_part.get((size_t)rows * ns * G * (hd + 2) * sizeof(float));
      const size_t had = att_cnt.bytes;  // a new allocation (which may reuse the old address) starts at 0
      cnt = (int*)att_cnt.get((size_t)rows * sizeof(int));
      if (att_cnt.bytes != had) CUDA_CHECK(cudaMemsetAsync(cnt, 0, att_cnt.bytes, st));
    }
    const size_t smem = (size_t)warps * G * (hd + 2) * sizeof(float);
    const dim3 grid(T, NKV, ns);
#define RLS_AC16(L, GG) \
  k_attention_cached16<L, GG><<<grid, warps * 32, smem, st>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, max_len, sc, part, cnt)
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
    return;
  }
  const dim3 grid(T, NH);
  const bool few = (long)T * NH < 2L * sms;
#define RLS_AC(D)                                                                                                   \
  if (few)                                                                                                          \
    k_attention_cached<D, AC_WARPS_FEW><<<grid, AC_WARPS_FEW * 32, 0, st>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, hd, max_len, sc); \
  else                                                                                                              \
    k_attention_cached<D, AC_WARPS><<<grid, AC_WARPS * 32, 0, st>>>(out, o16, q, kc, vc, ds, dp, NH, NKV, hd, max_len, sc);
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
}

}  // namespace rls::cuda
