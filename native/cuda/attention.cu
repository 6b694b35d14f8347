// Causal grouped-query attention for packed variable-length sequences on the GPU, FlashAttention style: tiles of 64
// queries x 64 keys in shared memory, bf16 tensor-core products (WMMA) with fp32 accumulation, softmax in fp32, and no
// [T, T] matrix anywhere. The forward makes two passes over the keys (row max and sum first, then P V with the final
// log-sum-exp), so the output accumulators never need rescaling; the backward recomputes P from q, k and lse, one
// kernel for dQ (per query tile) and one for dK/dV (per key tile and query head, partials summed over each group).
// Head dims 64 and 128 take the tensor-core path; any other (even) head dim a plain fp32 path.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "attention.cuh"
#include "check.cuh"

namespace rls::cuda {

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int BQ = 64, BK = 64, NW = 4, NT = NW * 32;
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// Shared-memory geometry. Row strides are padded (8 bf16, 4 floats) against bank conflicts and keep every WMMA
// pointer 32-byte aligned.
template <int D>
struct Geo {
  static constexpr int LDT = D + 8;                  // bf16 tile [64][LDT]
  static constexpr int SW = (D > BK ? D : BK) + 4;   // fp32 per-warp scratch [16][SW]
  static constexpr int LDP = BK + 8;                 // bf16 per-warp probabilities [16][LDP]
  static constexpr size_t tile = (size_t)64 * LDT * sizeof(bf16);
  static constexpr size_t sbuf = (size_t)NW * 16 * SW * sizeof(float);
  static constexpr size_t pbuf = (size_t)NW * 16 * LDP * sizeof(bf16);
};

// 64 rows x D of fp32 (row stride ld) into a bf16 tile; rows >= `rows` are zero.
template <int D>
__device__ __forceinline__ void load_tile(bf16* dst, const float* src, int ld, int rows) {
  constexpr int V4 = D / 4;
  for (int idx = threadIdx.x; idx < 64 * V4; idx += NT) {
    const int r = idx / V4, c = (idx - r * V4) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows) x = *reinterpret_cast<const float4*>(src + (size_t)r * ld + c);
    bf16* d = dst + r * Geo<D>::LDT + c;
    *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(x.x, x.y);
    *reinterpret_cast<__nv_bfloat162*>(d + 2) = __floats2bfloat162_rn(x.z, x.w);
  }
}

// out[16][64] (fp32, stride SW) = a[16][D] * b[64][D]^T, both bf16 tiles of stride LDT. One warp.
template <int D>
__device__ __forceinline__ void mm_abt(float* out, const bf16* a, const bf16* b) {
#pragma unroll
  for (int c = 0; c < 64 / 16; c++) {
    Acc acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + kk * 16, Geo<D>::LDT);
      wmma::load_matrix_sync(fb, b + c * 16 * Geo<D>::LDT + kk * 16, Geo<D>::LDT);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + c * 16, acc, Geo<D>::SW, wmma::mem_row_major);
  }
}

// acc[D/16] (16 x D) += p[16][64] (bf16, stride LDP) * m[64][D] (bf16 tile). One warp.
template <int D>
__device__ __forceinline__ void mm_acc(Acc* acc, const bf16* p, const bf16* m) {
#pragma unroll
  for (int c = 0; c < 64 / 16; c++) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, p + c * 16, Geo<D>::LDP);
#pragma unroll
    for (int d = 0; d < D / 16; d++) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, m + c * 16 * Geo<D>::LDT + d * 16, Geo<D>::LDT);
      wmma::mma_sync(acc[d], fa, fb, acc[d]);
    }
  }
}

// Writes the warp's 16 x D accumulator rows (times mul) to dst (row stride ld); rows >= rows_valid are skipped.
template <int D>
__device__ __forceinline__ void store_rows(float* scratch, Acc* acc, float* dst, int ld, int rows_valid, float mul) {
#pragma unroll
  for (int d = 0; d < D / 16; d++) wmma::store_matrix_sync(scratch + d * 16, acc[d], Geo<D>::SW, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x & 31;
  for (int idx = lane; idx < 16 * D; idx += 32) {
    const int r = idx / D, c = idx - r * D;
    if (r < rows_valid) dst[(size_t)r * ld + c] = scratch[r * Geo<D>::SW + c] * mul;
  }
  __syncwarp();
}

// Where a block of the tensor-core kernels works: sequence blockIdx.z (rows s0 .. s0+n-1 of the packed batch), query
// head h = blockIdx.y and its key head kh. Warp w owns rows 16w .. 16w+15 of the block's tile; lanes 2r and 2r+1
// share row r, 32 columns each (half).
struct Place {
  int s0, n, h, kh, QD, KD, warp, r, half;
};

template <int D>
__device__ __forceinline__ Place place(const int* seq_starts, int NH, int NKV) {
  const int s = blockIdx.z, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s0 = seq_starts[s];
  return {s0, seq_starts[s + 1] - s0, h, h / (NH / NKV), NH * D, NKV * D, warp, lane >> 1, lane & 1};
}

// Key tile j0 of key head kh (and its value tile, where vs is given) into shared memory, between two barriers: the
// first lets every warp finish with the previous tile, the second publishes this one.
template <int D>
__device__ __forceinline__ void stage_keys(bf16* ks, bf16* vs, const float* k, const float* v, const Place& p, int j0) {
  __syncthreads();
  const size_t off = (size_t)(p.s0 + j0) * p.KD + (size_t)p.kh * D;
  load_tile<D>(ks, k + off, p.KD, min(BK, p.n - j0));
  if (vs) load_tile<D>(vs, v + off, p.KD, min(BK, p.n - j0));
  __syncthreads();
}

// This warp's 16 x 64 scores (fp32, in sw) of its queries qw against key tile j0, staged first (with its values
// where vs is given); returns the 32 columns of this lane's row.
template <int D>
__device__ __forceinline__ const float* tile_scores(float* sw, const bf16* qw, bf16* ks, bf16* vs, const float* k,
                                                    const float* v, const Place& p, int j0) {
  stage_keys<D>(ks, vs, k, v, p, j0);
  mm_abt<D>(sw, qw, ks);
  __syncwarp();
  return sw + p.r * Geo<D>::SW + p.half * 32;
}

// Shared memory of the two backward kernels: four bf16 tiles (queries, dO, keys, values), then two fp32 scratch
// blocks of 16 rows per warp (scores and dP, this warp's rows given here), then `rest` for what each kernel adds.
struct BwdSmem {
  bf16 *qs, *dos, *ks, *vs;
  float *sw, *dw;
  unsigned char* rest;
};

template <int D>
__device__ __forceinline__ BwdSmem bwd_smem(unsigned char* smem, int warp) {
  using G = Geo<D>;
  float* sb = reinterpret_cast<float*>(smem + 4 * G::tile);
  float* db = reinterpret_cast<float*>(smem + 4 * G::tile + G::sbuf);
  return {reinterpret_cast<bf16*>(smem), reinterpret_cast<bf16*>(smem + G::tile),
          reinterpret_cast<bf16*>(smem + 2 * G::tile), reinterpret_cast<bf16*>(smem + 3 * G::tile),
          sb + warp * 16 * G::SW, db + warp * 16 * G::SW, smem + 4 * G::tile + 2 * G::sbuf};
}

// Grid (query tiles, NH, S), last tile first (it has the most keys). Each warp owns 16 query rows; within a warp,
// lanes 2r and 2r+1 share row r of the score block, 32 columns each.
template <int D>
__global__ void __launch_bounds__(NT) fwd_tc(float* out, float* lse, const float* q, const float* k, const float* v,
                                             const int* seq_starts, int T, int NH, int NKV, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using G = Geo<D>;
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem + G::tile);
  bf16* vs = reinterpret_cast<bf16*>(smem + 2 * G::tile);
  float* sb = reinterpret_cast<float*>(smem + 3 * G::tile);
  bf16* pb = reinterpret_cast<bf16*>(smem + 3 * G::tile + G::sbuf);
  const Place P = place<D>(seq_starts, NH, NKV);
  const auto [s0, n, h, kh, QD, KD, warp, r, half] = P;
  const int tile = gridDim.x - 1 - blockIdx.x, i0 = tile * BQ;
  if (i0 >= n) return;
  const int qi = i0 + warp * 16 + r;
  float* sw = sb + warp * 16 * G::SW;
  bf16* pw = pb + warp * 16 * G::LDP;
  const bf16* qw = qs + warp * 16 * G::LDT;
  const float sl2 = scale * LOG2E;  // softmax in base 2: exp2f is one instruction
  load_tile<D>(qs, q + (size_t)(s0 + i0) * QD + (size_t)h * D, QD, min(BQ, n - i0));

  // Pass 1: row max and sum. Every key tile up to the diagonal has at least one visible key in every row (key j0 of
  // an earlier tile, key i0 of the diagonal one), so m is finite after the first tile.
  float m = -INFINITY, l = 0.f;
  for (int kt = 0; kt <= tile; kt++) {
    const int j0 = kt * BK;
    const float* row = tile_scores<D>(sw, qw, ks, nullptr, k, nullptr, P, j0);
    const int jb = j0 + half * 32;
    float mx = -INFINITY;
    for (int c = 0; c < 32; c++)
      if (jb + c <= qi) mx = fmaxf(mx, row[c] * sl2);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float mn = fmaxf(m, mx);
    float sum = 0.f;
    for (int c = 0; c < 32; c++)
      if (jb + c <= qi) sum += exp2f(row[c] * sl2 - mn);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * exp2f(m - mn) + sum;
    m = mn;
    __syncwarp();
  }
  const float L2 = m + log2f(l);

  // Pass 2: O = P V with P final (exp of score minus the log-sum-exp).
  Acc acc[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; d++) wmma::fill_fragment(acc[d], 0.f);
  for (int kt = 0; kt <= tile; kt++) {
    const int j0 = kt * BK;
    const float* row = tile_scores<D>(sw, qw, ks, vs, k, v, P, j0);
    bf16* prow = pw + r * G::LDP + half * 32;
    const int jb = j0 + half * 32;
    for (int c = 0; c < 32; c++) prow[c] = __float2bfloat16(jb + c <= qi ? exp2f(row[c] * sl2 - L2) : 0.f);
    __syncwarp();
    mm_acc<D>(acc, pw, vs);
  }
  store_rows<D>(sw, acc, out + (size_t)(s0 + i0 + warp * 16) * QD + (size_t)h * D, QD, n - (i0 + warp * 16), 1.f);
  if (half == 0 && qi < n) lse[(size_t)h * T + s0 + qi] = L2 * LN2;
}

// D[h, t] = sum_d dO[t, h, d] * O[t, h, d], one warp per (t, h).
__global__ void rowdot(float* dbuf, const float* dout, const float* out, int T, int NH, int hd) {
  const long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (long)T * NH) return;
  const int t = (int)(w / NH), h = (int)(w % NH);
  const float* a = dout + (size_t)t * NH * hd + (size_t)h * hd;
  const float* b = out + (size_t)t * NH * hd + (size_t)h * hd;
  float s = 0.f;
  for (int i = lane; i < hd; i += 32) s += a[i] * b[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) dbuf[(size_t)h * T + t] = s;
}

// dQ per query tile: dS = P (dP - D) with P = exp(S - lse), dQ = scale dS K.
template <int D>
__global__ void __launch_bounds__(NT) dq_tc(float* dq, const float* dout, const float* q, const float* k,
                                            const float* v, const float* lse, const float* dbuf,
                                            const int* seq_starts, int T, int NH, int NKV, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using G = Geo<D>;
  const Place P = place<D>(seq_starts, NH, NKV);
  const auto [s0, n, h, kh, QD, KD, warp, r, half] = P;
  const auto [qs, dos, ks, vs, sw, dw, rest] = bwd_smem<D>(smem, warp);
  bf16* pw = reinterpret_cast<bf16*>(rest) + warp * 16 * G::LDP;
  const int tile = gridDim.x - 1 - blockIdx.x, i0 = tile * BQ;
  if (i0 >= n) return;
  const int qi = i0 + warp * 16 + r;
  const float sl2 = scale * LOG2E;
  const size_t qoff = (size_t)(s0 + i0) * QD + (size_t)h * D;
  load_tile<D>(qs, q + qoff, QD, min(BQ, n - i0));
  load_tile<D>(dos, dout + qoff, QD, min(BQ, n - i0));
  const bool live = qi < n;
  const float Lr = live ? lse[(size_t)h * T + s0 + qi] * LOG2E : 0.f;
  const float Dr = live ? dbuf[(size_t)h * T + s0 + qi] : 0.f;
  Acc acc[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; d++) wmma::fill_fragment(acc[d], 0.f);
  for (int kt = 0; kt <= tile; kt++) {
    const int j0 = kt * BK;
    stage_keys<D>(ks, vs, k, v, P, j0);
    mm_abt<D>(sw, qs + warp * 16 * G::LDT, ks);
    mm_abt<D>(dw, dos + warp * 16 * G::LDT, vs);
    __syncwarp();
    const float* row = sw + r * G::SW + half * 32;
    const float* dprow = dw + r * G::SW + half * 32;
    bf16* prow = pw + r * G::LDP + half * 32;
    const int jb = j0 + half * 32;
    for (int c = 0; c < 32; c++) {
      float ds = 0.f;
      if (live && jb + c <= qi) ds = exp2f(row[c] * sl2 - Lr) * (dprow[c] - Dr);
      prow[c] = __float2bfloat16(ds);
    }
    __syncwarp();
    mm_acc<D>(acc, pw, ks);
  }
  store_rows<D>(sw, acc, dq + (size_t)(s0 + i0 + warp * 16) * QD + (size_t)h * D, QD, n - (i0 + warp * 16), scale);
}

// dK, dV per key tile and query head: S^T and dP^T computed directly (rows are keys), dV += P^T dO, dK += dS^T Q.
// Output rows go to out_k/out_v with stride ldo at column offset (per_qhead ? h : kh) * D.
template <int D>
__global__ void __launch_bounds__(NT) dkv_tc(float* out_k, float* out_v, int ldo, int per_qhead, const float* dout,
                                             const float* q, const float* k, const float* v, const float* lse,
                                             const float* dbuf, const int* seq_starts, int T, int NH, int NKV,
                                             float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using G = Geo<D>;
  const Place P = place<D>(seq_starts, NH, NKV);
  const auto [s0, n, h, kh, QD, KD, warp, r, half] = P;
  const auto [qs, dos, ks, vs, sw, dw, rest] = bwd_smem<D>(smem, warp);
  bf16* ptw = reinterpret_cast<bf16*>(rest) + warp * 16 * G::LDP;           // P^T, this warp's 16 keys
  bf16* dsw = reinterpret_cast<bf16*>(rest + G::pbuf) + warp * 16 * G::LDP;  // dS^T
  float* lse_s = reinterpret_cast<float*>(rest + 2 * G::pbuf);              // the query tile's lse and D
  float* d_s = lse_s + 64;
  const int kt = blockIdx.x, j0 = kt * BK;  // key tile 0 has the most queries: first
  if (j0 >= n) return;
  const int kj = j0 + warp * 16 + r;
  const float sl2 = scale * LOG2E;
  stage_keys<D>(ks, vs, k, v, P, j0);
  Acc ak[D / 16], av[D / 16];
#pragma unroll
  for (int d = 0; d < D / 16; d++) {
    wmma::fill_fragment(ak[d], 0.f);
    wmma::fill_fragment(av[d], 0.f);
  }
  const int ntq = (n + BQ - 1) / BQ;
  for (int qt = kt; qt < ntq; qt++) {
    const int i0 = qt * BQ;
    __syncthreads();
    const size_t qoff = (size_t)(s0 + i0) * QD + (size_t)h * D;
    load_tile<D>(qs, q + qoff, QD, min(BQ, n - i0));
    load_tile<D>(dos, dout + qoff, QD, min(BQ, n - i0));
    if (threadIdx.x < 64) {
      const int i = i0 + threadIdx.x;
      lse_s[threadIdx.x] = i < n ? lse[(size_t)h * T + s0 + i] * LOG2E : 0.f;
      d_s[threadIdx.x] = i < n ? dbuf[(size_t)h * T + s0 + i] : 0.f;
    }
    __syncthreads();
    mm_abt<D>(sw, ks + warp * 16 * G::LDT, qs);   // S^T: 16 keys x 64 queries
    mm_abt<D>(dw, vs + warp * 16 * G::LDT, dos);  // dP^T
    __syncwarp();
    const float* row = sw + r * G::SW + half * 32;
    const float* dprow = dw + r * G::SW + half * 32;
    bf16* ptrow = ptw + r * G::LDP + half * 32;
    bf16* dsrow = dsw + r * G::LDP + half * 32;
    for (int c = 0; c < 32; c++) {
      const int col = half * 32 + c, i = i0 + col;
      float p = 0.f, ds = 0.f;
      if (i < n && i >= kj) {
        p = exp2f(row[c] * sl2 - lse_s[col]);
        ds = p * (dprow[c] - d_s[col]);
      }
      ptrow[c] = __float2bfloat16(p);
      dsrow[c] = __float2bfloat16(ds);
    }
    __syncwarp();
    mm_acc<D>(av, ptw, dos);
    mm_acc<D>(ak, dsw, qs);
  }
  const int off = (per_qhead ? h : kh) * D, rows = n - (j0 + warp * 16);
  store_rows<D>(sw, ak, out_k + (size_t)(s0 + j0 + warp * 16) * ldo + off, ldo, rows, scale);
  store_rows<D>(sw, av, out_v + (size_t)(s0 + j0 + warp * 16) * ldo + off, ldo, rows, 1.f);
}

// dst[t, kh*D + d] = sum over the group's query heads g of src[t, (kh*G + g)*D + d]
__global__ void group_sum(float* dst, const float* src, int T, int NH, int NKV, int D) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  const long KD = (long)NKV * D;
  if (idx >= (long)T * KD) return;
  const long t = idx / KD;
  const int rem = (int)(idx - t * KD), kh = rem / D, d = rem - kh * D, G = NH / NKV;
  const float* p = src + t * NH * D + (size_t)kh * G * D + d;
  float acc = 0.f;
  for (int g = 0; g < G; g++) acc += p[(size_t)g * D];
  dst[idx] = acc;
}

// ---- plain fp32 path (any even head dim): one thread per (token, head) ----

__device__ __forceinline__ int seq_of(const int* seq_starts, int S, int t) {
  int lo = 0, hi = S;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (seq_starts[mid] <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

__global__ void fwd_plain(float* out, float* lse, const float* q, const float* k, const float* v, const int* seq_starts,
                          int S, int T, int NH, int NKV, int hd, float scale) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)T * NH) return;
  const int t = (int)(idx / NH), h = (int)(idx % NH), kh = h / (NH / NKV), KD = NKV * hd;
  const int s0 = seq_starts[seq_of(seq_starts, S, t)];
  const float* qp = q + (size_t)t * NH * hd + (size_t)h * hd;
  float* op = out + (size_t)t * NH * hd + (size_t)h * hd;
  for (int d = 0; d < hd; d++) op[d] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int j = s0; j <= t; j++) {
    const float* kp = k + (size_t)j * KD + (size_t)kh * hd;
    const float* vp = v + (size_t)j * KD + (size_t)kh * hd;
    float sc = 0.f;
    for (int d = 0; d < hd; d++) sc += qp[d] * kp[d];
    sc *= scale;
    const float mn = fmaxf(m, sc), a = expf(m - mn), p = expf(sc - mn);
    l = l * a + p;
    for (int d = 0; d < hd; d++) op[d] = op[d] * a + p * vp[d];
    m = mn;
  }
  for (int d = 0; d < hd; d++) op[d] /= l;
  lse[(size_t)h * T + t] = m + logf(l);
}

__global__ void dq_plain(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* lse,
                         const float* dbuf, const int* seq_starts, int S, int T, int NH, int NKV, int hd, float scale) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)T * NH) return;
  const int t = (int)(idx / NH), h = (int)(idx % NH), kh = h / (NH / NKV), KD = NKV * hd;
  const int s0 = seq_starts[seq_of(seq_starts, S, t)];
  const size_t qo = (size_t)t * NH * hd + (size_t)h * hd;
  const float L = lse[(size_t)h * T + t], Dv = dbuf[(size_t)h * T + t];
  for (int d = 0; d < hd; d++) dq[qo + d] = 0.f;
  for (int j = s0; j <= t; j++) {
    const float* kp = k + (size_t)j * KD + (size_t)kh * hd;
    const float* vp = v + (size_t)j * KD + (size_t)kh * hd;
    float sc = 0.f, dp = 0.f;
    for (int d = 0; d < hd; d++) {
      sc += q[qo + d] * kp[d];
      dp += dout[qo + d] * vp[d];
    }
    const float ds = expf(sc * scale - L) * (dp - Dv) * scale;
    for (int d = 0; d < hd; d++) dq[qo + d] += ds * kp[d];
  }
}

__global__ void dkv_plain(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                          const float* lse, const float* dbuf, const int* seq_starts, int S, int T, int NH, int NKV,
                          int hd, float scale) {
  const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long)T * NKV) return;
  const int j = (int)(idx / NKV), kh = (int)(idx % NKV), G = NH / NKV, KD = NKV * hd;
  const int e = seq_starts[seq_of(seq_starts, S, j) + 1];
  const size_t ko = (size_t)j * KD + (size_t)kh * hd;
  for (int d = 0; d < hd; d++) dk[ko + d] = dv[ko + d] = 0.f;
  for (int h = kh * G; h < (kh + 1) * G; h++)
    for (int i = j; i < e; i++) {
      const size_t qo = (size_t)i * NH * hd + (size_t)h * hd;
      float sc = 0.f, dp = 0.f;
      for (int d = 0; d < hd; d++) {
        sc += q[qo + d] * k[ko + d];
        dp += dout[qo + d] * v[ko + d];
      }
      const float p = expf(sc * scale - lse[(size_t)h * T + i]), ds = p * (dp - dbuf[(size_t)h * T + i]) * scale;
      for (int d = 0; d < hd; d++) {
        dv[ko + d] += p * dout[qo + d];
        dk[ko + d] += ds * q[qo + d];
      }
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int D>
constexpr size_t fwd_smem() {
  return 3 * Geo<D>::tile + Geo<D>::sbuf + Geo<D>::pbuf;
}
template <int D>
constexpr size_t dq_smem() {
  return 4 * Geo<D>::tile + 2 * Geo<D>::sbuf + Geo<D>::pbuf;
}
template <int D>
constexpr size_t dkv_smem() {
  return 4 * Geo<D>::tile + 2 * Geo<D>::sbuf + 2 * Geo<D>::pbuf + 128 * sizeof(float);
}

// Kernels over 48 KiB of shared memory must raise their limit once per process.
template <int D>
void raise_smem_limits() {
  static bool done = false;
  if (done) return;
  CUDA_CHECK(cudaFuncSetAttribute(fwd_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<D>()));
  CUDA_CHECK(cudaFuncSetAttribute(dq_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem<D>()));
  CUDA_CHECK(cudaFuncSetAttribute(dkv_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkv_smem<D>()));
  done = true;
}

template <int D>
void fwd_launch(float* out, float* lse, const float* q, const float* k, const float* v, const int* seq_starts, int S,
                int max_len, int T, int NH, int NKV, float scale, cudaStream_t st) {
  raise_smem_limits<D>();
  const dim3 grid((max_len + BQ - 1) / BQ, NH, S);
  fwd_tc<D><<<grid, NT, fwd_smem<D>(), st>>>(out, lse, q, k, v, seq_starts, T, NH, NKV, scale);
  LAUNCH_CHECK("attention forward (tensor cores)");
}

template <int D>
void bwd_launch(float* dq, float* dk, float* dv, float* dbuf, float* part, const float* dout, const float* q,
                const float* k, const float* v, const float* lse, const int* seq_starts, int S, int max_len, int T,
                int NH, int NKV, float scale, cudaStream_t st) {
  raise_smem_limits<D>();
  const dim3 gq((max_len + BQ - 1) / BQ, NH, S);
  dq_tc<D><<<gq, NT, dq_smem<D>(), st>>>(dq, dout, q, k, v, lse, dbuf, seq_starts, T, NH, NKV, scale);
  LAUNCH_CHECK("attention backward dQ (tensor cores)");
  const dim3 gk((max_len + BK - 1) / BK, NH, S);
  if (NH == NKV) {
    dkv_tc<D><<<gk, NT, dkv_smem<D>(), st>>>(dk, dv, NKV * D, 0, dout, q, k, v, lse, dbuf, seq_starts, T, NH, NKV, scale);
    LAUNCH_CHECK("attention backward dK/dV (tensor cores)");
  } else {
    float* pk = part;
    float* pv = part + (size_t)T * NH * D;
    dkv_tc<D><<<gk, NT, dkv_smem<D>(), st>>>(pk, pv, NH * D, 1, dout, q, k, v, lse, dbuf, seq_starts, T, NH, NKV, scale);
    LAUNCH_CHECK("attention backward dK/dV (tensor cores)");
    const long n = (long)T * NKV * D;
    group_sum<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(dk, pk, T, NH, NKV, D);
    LAUNCH_CHECK("attention backward group sum dK");
    group_sum<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(dv, pv, T, NH, NKV, D);
    LAUNCH_CHECK("attention backward group sum dV");
  }
}

bool tensor_core_path(int hd, std::initializer_list<const void*> ptrs) {
  if (hd != 64 && hd != 128) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

}  // namespace

size_t attention_backward_scratch(int T, int NH, int NKV, int hd) {
  return (size_t)NH * T + (NH != NKV ? (size_t)2 * T * NH * hd : 0);
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const int* seq_starts,
                       int S, int max_len, int T, int NH, int NKV, int hd, cudaStream_t st) {
  const float scale = 1.0f / std::sqrt((float)hd);
  if (tensor_core_path(hd, {out, q, k, v})) {
    if (hd == 64) fwd_launch<64>(out, lse, q, k, v, seq_starts, S, max_len, T, NH, NKV, scale, st);
    else fwd_launch<128>(out, lse, q, k, v, seq_starts, S, max_len, T, NH, NKV, scale, st);
    return;
  }
  const long n = (long)T * NH;
  fwd_plain<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(out, lse, q, k, v, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention forward (fp32)");
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, const int* seq_starts, int S,
                        int max_len, int T, int NH, int NKV, int hd, cudaStream_t st) {
  const float scale = 1.0f / std::sqrt((float)hd);
  float* dbuf = scratch;
  float* part = scratch + (size_t)NH * T;
  const long rows = (long)T * NH;
  rowdot<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(dbuf, dout, out, T, NH, hd);
  LAUNCH_CHECK("attention backward rowsum(dO*O)");
  if (tensor_core_path(hd, {dq, dk, dv, dout, q, k, v})) {
    if (hd == 64) bwd_launch<64>(dq, dk, dv, dbuf, part, dout, q, k, v, lse, seq_starts, S, max_len, T, NH, NKV, scale, st);
    else bwd_launch<128>(dq, dk, dv, dbuf, part, dout, q, k, v, lse, seq_starts, S, max_len, T, NH, NKV, scale, st);
    return;
  }
  dq_plain<<<(unsigned)((rows + 127) / 128), 128, 0, st>>>(dq, dout, q, k, v, lse, dbuf, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention backward dQ (fp32)");
  const long kr = (long)T * NKV;
  dkv_plain<<<(unsigned)((kr + 127) / 128), 128, 0, st>>>(dk, dv, dout, q, k, v, lse, dbuf, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention backward dK/dV (fp32)");
}

}  // namespace rls::cuda
