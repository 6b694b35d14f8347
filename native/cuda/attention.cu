// Causal grouped-query attention for packed variable-length sequences on the GPU, FlashAttention-2 style: tiles of
// 64 queries x 64 keys, bf16 tensor-core products (mma.sync m16n8k16) with fp32 accumulation, softmax in fp32, and no
// [T, T] matrix anywhere. Scores, probabilities and output accumulators stay in registers: the accumulator layout of
// one product is the operand layout of the next, so a warp's P (or dS) feeds P V (or dS K) without a trip through
// shared memory. The forward makes one pass over the keys with an online softmax; the backward recomputes P from q,
// k and lse, one kernel for dQ (per query tile) and one for dK/dV (per key tile and key head, summed over the group's
// query heads in registers). Head dims 64 and 128 take the tensor-core path; any other (even) head dim a plain fp32 path.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention.cuh"
#include "check.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int BQ = 64, BK = 64, NW = 4, NT = NW * 32;
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

// Shared-memory tiles, bf16, row-major [64 tokens][LDT]. Row strides are padded by 8 elements: a row is then 4 banks
// further on, so the 8 x 4 lanes of a fragment load (row lane/4, word lane%4) and the 8 rows of an ldmatrix phase hit
// 32 different banks, and every row stays 16-byte aligned as ldmatrix needs.
template <int D>
struct Geo {
  static constexpr int LDT = D + 8;
  static constexpr size_t tile = (size_t)64 * LDT * sizeof(bf16);
};

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// c[4] += a (16x16, row-major fragment) * b (16x8, column fragment). Fragment layouts (PTX ISA, m16n8k16): with
// g = lane/4 and t = lane%4, a = {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, b = {(k 2t..2t+1, n g),
// (k 2t+8.., n g)}, c = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}.
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A operand of rows 16w.. of a row-major smem tile, k-step kk.
template <int D>
__device__ __forceinline__ void frag_a(uint32_t* a, const bf16* tile, int row0, int kk, int g, int t) {
  const bf16* p = tile + (row0 + g) * Geo<D>::LDT + kk * 16 + t * 2;
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * Geo<D>::LDT);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * Geo<D>::LDT + 8);
}

// The A operand of 16 rows (row0..row0+15, those >= n zero) of an fp32 [*, ld] matrix in global memory, k-step kk.
__device__ __forceinline__ void frag_a_global(uint32_t* a, const float* src, int ld, int row0, int n, int kk, int g,
                                              int t) {
  const int c = kk * 16 + t * 2, ra = row0 + g, rb = ra + 8;
  const float2 z = make_float2(0.f, 0.f);
  const float2 x0 = ra < n ? *reinterpret_cast<const float2*>(src + (size_t)ra * ld + c) : z;
  const float2 x1 = rb < n ? *reinterpret_cast<const float2*>(src + (size_t)rb * ld + c) : z;
  const float2 x2 = ra < n ? *reinterpret_cast<const float2*>(src + (size_t)ra * ld + c + 8) : z;
  const float2 x3 = rb < n ? *reinterpret_cast<const float2*>(src + (size_t)rb * ld + c + 8) : z;
  a[0] = pack(x0.x, x0.y);
  a[1] = pack(x1.x, x1.y);
  a[2] = pack(x2.x, x2.y);
  a[3] = pack(x3.x, x3.y);
}

// acc[8][4] (16 rows x 64 columns) = A (16 x D, fragments a[D/16]) * tile^T, tile a row-major [64][LDT] smem tile whose
// rows are the columns of the result.
template <int D>
__device__ __forceinline__ void mm_abt(float (*acc)[4], const uint32_t (*a)[4], const bf16* tile, int g, int t) {
#pragma unroll
  for (int j = 0; j < 8; j++) {
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    const bf16* p = tile + (j * 8 + g) * Geo<D>::LDT + t * 2;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) mma(acc[j], a[kk], ld32(p + kk * 16), ld32(p + kk * 16 + 8));
  }
}

// The B operands of two adjacent n-tiles (columns n0..n0+15) for k-step kk of a product over the rows of a
// row-major smem tile: ldmatrix .trans hands each lane the (k 2t..2t+1, n g) pairs that lie in one column. Lanes 8i..8i+7
// give the row addresses of 8x8 matrix i: rows +8 for i odd, columns +8 for i >= 2; b = {b0, b1} of n0, then of n0+8.
template <int D>
__device__ __forceinline__ void frag_b_trans(uint32_t* b, const bf16* tile, int kk, int n0, int lane) {
  const int mat = lane >> 3;
  const bf16* p = tile + (kk * 16 + (mat & 1) * 8 + (lane & 7)) * Geo<D>::LDT + n0 + (mat >> 1) * 8;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"((unsigned)__cvta_generic_to_shared(p)));
}

// acc[D/8][4] (16 x D) += P (16 x 64, the accumulator layout of mm_abt, values p[8][4]) * M, M a row-major [64][LDT]
// smem tile (its rows are the product's k). The accumulator fragment pairs of P are its A operand fragments.
template <int D>
__device__ __forceinline__ void mm_pv(float (*acc)[4], const float (*p)[4], const bf16* m, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    const uint32_t a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                           pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int nt = 0; nt < D / 8; nt += 2) {
      uint32_t b[4];
      frag_b_trans<D>(b, m, kk, nt * 8, lane);
      mma(acc[nt], a, b[0], b[1]);
      mma(acc[nt + 1], a, b[2], b[3]);
    }
  }
}

// 64 rows x D of fp32 (row stride ld) into a row-major bf16 tile; rows >= `rows` are zero.
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

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Where a block of the tensor-core kernels works: sequence blockIdx.z (rows s0 .. s0+n-1 of the packed batch), query
// head h = blockIdx.y and its key head kh (with KEY_GRID, blockIdx.y is kh and h is unused: dK/dV walks the group's
// query heads itself); warp w owns rows 16w .. 16w+15 of the block's tile, and a lane rows g and g+8 of those
// (g = lane/4, t = lane%4 as in the fragments).
struct Place {
  int s0, n, h, kh, QD, KD, warp, g, t;
};

template <int D, bool KEY_GRID = false>
__device__ __forceinline__ Place place(const int* seq_starts, int NH, int NKV) {
  const int s = blockIdx.z, y = blockIdx.y, lane = threadIdx.x & 31;
  const int s0 = seq_starts[s];
  return {s0, seq_starts[s + 1] - s0, y, KEY_GRID ? y : y / (NH / NKV), NH * D, NKV * D, (int)threadIdx.x >> 5,
          lane >> 2, lane & 3};
}

// Two adjacent columns of a row, fp32 (8 bytes) or bf16 (one 32-bit word).
__device__ __forceinline__ void store2(float* p, float x, float y) { *reinterpret_cast<float2*>(p) = make_float2(x, y); }
__device__ __forceinline__ void store2(bf16* p, float x, float y) { *reinterpret_cast<uint32_t*>(p) = pack(x, y); }

// Writes a warp's 16 x D accumulator (times mul) to dst rows row0.. (row stride ld), fp32 or bf16; rows >= n are
// skipped.
template <int D, typename Out>
__device__ __forceinline__ void store_acc(Out* dst, int ld, const float (*acc)[4], int row0, int n, int g, int t,
                                          float mul_a, float mul_b) {
  const int ra = row0 + g, rb = ra + 8;
#pragma unroll
  for (int nt = 0; nt < D / 8; nt++) {
    const int c = nt * 8 + t * 2;
    if (ra < n) store2(dst + (size_t)ra * ld + c, acc[nt][0] * mul_a, acc[nt][1] * mul_a);
    if (rb < n) store2(dst + (size_t)rb * ld + c, acc[nt][2] * mul_b, acc[nt][3] * mul_b);
  }
}

// Grid (query tiles, NH, S), last tile first (it has the most keys). One pass over the key tiles up to the diagonal
// with an online softmax in base 2 (exp2f is one instruction): each row's running max m and sum l, the output
// rescaled when m grows.
template <int D>
__global__ void __launch_bounds__(NT) fwd_tc(float* out, bf16* out16, float* lse, const float* q, const float* k,
                                             const float* v, const int* seq_starts, int T, int NH, int NKV,
                                             float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + Geo<D>::tile);
  const auto [s0, n, h, kh, QD, KD, warp, g, t] = place<D>(seq_starts, NH, NKV);
  const int lane = threadIdx.x & 31, tile = gridDim.x - 1 - blockIdx.x, i0 = tile * BQ;
  if (i0 >= n) return;
  const int row0 = i0 + warp * 16, ra = row0 + g, rb = ra + 8;
  const float sl2 = scale * LOG2E;
  uint32_t qf[D / 16][4];
  const float* qsrc = q + (size_t)s0 * QD + (size_t)h * D;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) frag_a_global(qf[kk], qsrc, QD, row0, n, kk, g, t);
  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  // Every key tile up to the diagonal has a visible key in every row (key j0 of an earlier tile, key i0 of the
  // diagonal one), so the running max is finite after the first tile and exp2f(m_old - m_new) is 0 there.
  float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;  // l: this lane's share of its rows' sums
  for (int kt = 0; kt <= tile; kt++) {
    const int j0 = kt * BK;
    __syncthreads();
    const size_t off = (size_t)(s0 + j0) * KD + (size_t)kh * D;
    load_tile<D>(ks, k + off, KD, min(BK, n - j0));
    load_tile<D>(vs, v + off, KD, min(BK, n - j0));
    __syncthreads();
    float s[8][4];
    mm_abt<D>(s, qf, ks, g, t);
    const bool diag = kt == tile;
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = j0 + j * 8 + t * 2 + (c & 1);
        float x = s[j][c] * sl2;
        if (diag && key > (c < 2 ? ra : rb)) x = -INFINITY;
        s[j][c] = x;
        if (c < 2) xa = fmaxf(xa, x);
        else xb = fmaxf(xb, x);
      }
    const float na = fmaxf(ma, quad_max(xa)), nb = fmaxf(mb, quad_max(xb));
    const float aa = exp2f(ma - na), ab = exp2f(mb - nb);
    ma = na;
    mb = nb;
    float sa = 0.f, sb = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      s[j][0] = exp2f(s[j][0] - na);
      s[j][1] = exp2f(s[j][1] - na);
      s[j][2] = exp2f(s[j][2] - nb);
      s[j][3] = exp2f(s[j][3] - nb);
      sa += s[j][0] + s[j][1];
      sb += s[j][2] + s[j][3];
    }
    la = la * aa + sa;
    lb = lb * ab + sb;
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) {
      o[nt][0] *= aa;
      o[nt][1] *= aa;
      o[nt][2] *= ab;
      o[nt][3] *= ab;
    }
    mm_pv<D>(o, s, vs, lane);
  }
  la = quad_sum(la);
  lb = quad_sum(lb);
  store_acc<D>(out + (size_t)s0 * QD + (size_t)h * D, QD, o, row0, n, g, t, 1.f / la, 1.f / lb);
  if (out16) store_acc<D>(out16 + (size_t)s0 * QD + (size_t)h * D, QD, o, row0, n, g, t, 1.f / la, 1.f / lb);
  if (t == 0) {
    if (ra < n) lse[(size_t)h * T + s0 + ra] = (ma + log2f(la)) * LN2;
    if (rb < n) lse[(size_t)h * T + s0 + rb] = (mb + log2f(lb)) * LN2;
  }
}

// D[h, t] = sum_d dO[t, h, d] * O[t, h, d], one group of R lanes per (t, h): with V4 (R = hd / 4, 16-byte aligned
// rows) each lane takes one float4 of each; otherwise a warp (R = 32) strides over the row.
template <int R, bool V4>
__global__ void rowdot(float* dbuf, const float* dout, const float* out, int T, int NH, int hd) {
  const long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) / R;
  const int lane = threadIdx.x % R;
  const bool live = w < (long)T * NH;
  const size_t off = live ? (size_t)w * hd : 0;  // (t, h) rows are consecutive: row w = t * NH + h
  float s = 0.f;
  if (live) {
    if (V4) {
      const float4 a = reinterpret_cast<const float4*>(dout + off)[lane], b = reinterpret_cast<const float4*>(out + off)[lane];
      s = a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    } else {
      for (int i = lane; i < hd; i += R) s += dout[off + i] * out[off + i];
    }
  }
  for (int o = R / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (live && lane == 0) dbuf[(size_t)(w % NH) * T + w / NH] = s;
}

// dQ per query tile: dS = P (dP - D) with P = exp(S - lse), dQ = scale dS K. The warp's queries and dO stay in
// registers as A operands; each key tile is staged row-major (keys and values: the B operands of S = Q K^T and
// dP = dO V^T directly, and of dS K through ldmatrix .trans).
template <int D>
__global__ void __launch_bounds__(NT) dq_tc(float* dq, const float* dout, const float* q, const float* k,
                                            const float* v, const float* lse, const float* dbuf,
                                            const int* seq_starts, int T, int NH, int NKV, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + Geo<D>::tile);
  const auto [s0, n, h, kh, QD, KD, warp, g, t] = place<D>(seq_starts, NH, NKV);
  const int lane = threadIdx.x & 31, tile = gridDim.x - 1 - blockIdx.x, i0 = tile * BQ;
  if (i0 >= n) return;
  const int row0 = i0 + warp * 16, ra = row0 + g, rb = ra + 8;
  const float sl2 = scale * LOG2E;
  const size_t qoff = (size_t)s0 * QD + (size_t)h * D;
  uint32_t qf[D / 16][4], df[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    frag_a_global(qf[kk], q + qoff, QD, row0, n, kk, g, t);
    frag_a_global(df[kk], dout + qoff, QD, row0, n, kk, g, t);
  }
  const float La = ra < n ? lse[(size_t)h * T + s0 + ra] * LOG2E : 0.f;
  const float Lb = rb < n ? lse[(size_t)h * T + s0 + rb] * LOG2E : 0.f;
  const float Da = ra < n ? dbuf[(size_t)h * T + s0 + ra] : 0.f;
  const float Db = rb < n ? dbuf[(size_t)h * T + s0 + rb] : 0.f;
  float acc[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  for (int kt = 0; kt <= tile; kt++) {
    const int j0 = kt * BK;
    __syncthreads();
    const size_t off = (size_t)(s0 + j0) * KD + (size_t)kh * D;
    load_tile<D>(ks, k + off, KD, min(BK, n - j0));
    load_tile<D>(vs, v + off, KD, min(BK, n - j0));
    __syncthreads();
    float s[8][4], dp[8][4];
    mm_abt<D>(s, qf, ks, g, t);
    mm_abt<D>(dp, df, vs, g, t);
    const bool diag = kt == tile;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int key = j0 + j * 8 + t * 2 + (c & 1), row = c < 2 ? ra : rb;
        const float ds = exp2f(s[j][c] * sl2 - (c < 2 ? La : Lb)) * (dp[j][c] - (c < 2 ? Da : Db));
        s[j][c] = (row < n && !(diag && key > row)) ? ds : 0.f;
      }
    mm_pv<D>(acc, s, ks, lane);
  }
  store_acc<D>(dq + qoff, QD, acc, row0, n, g, t, scale, scale);
}

// dK, dV per key tile and key head, the transposed problem: the warp's 16 keys are the rows, S^T = K Q^T and
// dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q, summed over every query tile at or after the key tile and every
// query head of the group in registers (deterministic, no atomics, no partials). Each (query tile, head) is staged
// row-major: the B operands of the first two products directly, of the last two through ldmatrix .trans.
template <int D>
__global__ void __launch_bounds__(NT) dkv_tc(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                             const float* v, const float* lse, const float* dbuf,
                                             const int* seq_starts, int T, int NH, int NKV, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using G = Geo<D>;
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + G::tile);
  bf16* qs = reinterpret_cast<bf16*>(smem + 2 * G::tile);
  bf16* dos = reinterpret_cast<bf16*>(smem + 3 * G::tile);
  float* lse_s = reinterpret_cast<float*>(smem + 4 * G::tile);  // the staged query tile's lse and D
  float* d_s = lse_s + 64;
  [[maybe_unused]] const auto [s0, n, h, kh, QD, KD, warp, g, t] = place<D, true>(seq_starts, NH, NKV);
  const int lane = threadIdx.x & 31, group = NH / NKV;
  const int kt = blockIdx.x, j0 = kt * BK;  // key tile 0 has the most queries: first
  if (j0 >= n) return;
  const int row0 = j0 + warp * 16, ka = row0 + g, kb = ka + 8;
  const float sl2 = scale * LOG2E;
  const size_t koff = (size_t)(s0 + j0) * KD + (size_t)kh * D;
  load_tile<D>(ks, k + koff, KD, min(BK, n - j0));
  load_tile<D>(vs, v + koff, KD, min(BK, n - j0));
  float ak[D / 8][4], av[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
    for (int c = 0; c < 4; c++) ak[nt][c] = av[nt][c] = 0.f;
  const int ntq = (n + BQ - 1) / BQ;
  for (int qt = kt; qt < ntq; qt++)
    for (int h = kh * group; h < (kh + 1) * group; h++) {
      const int i0 = qt * BQ, rows = min(BQ, n - i0);
      __syncthreads();
      const size_t qoff = (size_t)(s0 + i0) * QD + (size_t)h * D;
      load_tile<D>(qs, q + qoff, QD, rows);
      load_tile<D>(dos, dout + qoff, QD, rows);
      if (threadIdx.x < 64) {
        const int i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < n ? lse[(size_t)h * T + s0 + i] * LOG2E : 0.f;
        d_s[threadIdx.x] = i < n ? dbuf[(size_t)h * T + s0 + i] : 0.f;
      }
      __syncthreads();
      float st[8][4], dpt[8][4];
      {
        uint32_t a[D / 16][4];
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) frag_a<D>(a[kk], ks, warp * 16, kk, g, t);
        mm_abt<D>(st, a, qs, g, t);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) frag_a<D>(a[kk], vs, warp * 16, kk, g, t);
        mm_abt<D>(dpt, a, dos, g, t);
      }
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
          const int col = j * 8 + t * 2 + (c & 1), i = i0 + col, key = c < 2 ? ka : kb;
          float p = 0.f;
          if (i < n && i >= key) p = exp2f(st[j][c] * sl2 - lse_s[col]);
          st[j][c] = p;
          dpt[j][c] = p * (dpt[j][c] - d_s[col]);
        }
      mm_pv<D>(av, st, dos, lane);
      mm_pv<D>(ak, dpt, qs, lane);
    }
  store_acc<D>(dk + (size_t)s0 * KD + (size_t)kh * D, KD, ak, row0, n, g, t, scale, scale);
  store_acc<D>(dv + (size_t)s0 * KD + (size_t)kh * D, KD, av, row0, n, g, t, 1.f, 1.f);
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
  return 2 * Geo<D>::tile;
}
template <int D>
constexpr size_t dq_smem() {
  return 2 * Geo<D>::tile;
}
template <int D>
constexpr size_t dkv_smem() {
  return 4 * Geo<D>::tile + 128 * sizeof(float);
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
void fwd_launch(float* out, bf16* out16, float* lse, const float* q, const float* k, const float* v,
                const int* seq_starts, int S, int max_len, int T, int NH, int NKV, float scale, cudaStream_t st) {
  raise_smem_limits<D>();
  const dim3 grid((max_len + BQ - 1) / BQ, NH, S);
  fwd_tc<D><<<grid, NT, fwd_smem<D>(), st>>>(out, out16, lse, q, k, v, seq_starts, T, NH, NKV, scale);
  LAUNCH_CHECK("attention forward (tensor cores)");
}

template <int D>
void bwd_launch(float* dq, float* dk, float* dv, const float* dbuf, const float* dout, const float* q, const float* k,
                const float* v, const float* lse, const int* seq_starts, int S, int max_len, int T, int NH, int NKV,
                float scale, cudaStream_t st) {
  raise_smem_limits<D>();
  const dim3 gq((max_len + BQ - 1) / BQ, NH, S);
  dq_tc<D><<<gq, NT, dq_smem<D>(), st>>>(dq, dout, q, k, v, lse, dbuf, seq_starts, T, NH, NKV, scale);
  LAUNCH_CHECK("attention backward dQ (tensor cores)");
  const dim3 gk((max_len + BK - 1) / BK, NKV, S);
  dkv_tc<D><<<gk, NT, dkv_smem<D>(), st>>>(dk, dv, dout, q, k, v, lse, dbuf, seq_starts, T, NH, NKV, scale);
  LAUNCH_CHECK("attention backward dK/dV (tensor cores)");
}

bool tensor_core_path(int hd, std::initializer_list<const void*> ptrs) {
  if (hd != 64 && hd != 128) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

}  // namespace

size_t attention_backward_scratch(int T, int NH) { return (size_t)NH * T; }

bool attention_forward(float* out, bf16* out16, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_starts, int S, int max_len, int T, int NH, int NKV, int hd, cudaStream_t st) {
  const float scale = 1.0f / std::sqrt((float)hd);
  if (tensor_core_path(hd, {out, q, k, v})) {
    if (hd == 64) fwd_launch<64>(out, out16, lse, q, k, v, seq_starts, S, max_len, T, NH, NKV, scale, st);
    else fwd_launch<128>(out, out16, lse, q, k, v, seq_starts, S, max_len, T, NH, NKV, scale, st);
    return out16 != nullptr;
  }
  const long n = (long)T * NH;
  fwd_plain<<<(unsigned)((n + 127) / 128), 128, 0, st>>>(out, lse, q, k, v, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention forward (fp32)");
  return false;
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, const int* seq_starts, int S,
                        int max_len, int T, int NH, int NKV, int hd, cudaStream_t st) {
  const float scale = 1.0f / std::sqrt((float)hd);
  float* dbuf = scratch;
  const long rows = (long)T * NH;
  const bool a16 = aligned16(dout) && aligned16(out);
  if (hd == 64 && a16)
    rowdot<16, true><<<(unsigned)((rows * 16 + 255) / 256), 256, 0, st>>>(dbuf, dout, out, T, NH, hd);
  else if (hd == 128 && a16)
    rowdot<32, true><<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(dbuf, dout, out, T, NH, hd);
  else
    rowdot<32, false><<<(unsigned)((rows * 32 + 255) / 256), 256, 0, st>>>(dbuf, dout, out, T, NH, hd);
  LAUNCH_CHECK("attention backward rowsum(dO*O)");
  if (tensor_core_path(hd, {dq, dk, dv, dout, q, k, v})) {
    if (hd == 64) bwd_launch<64>(dq, dk, dv, dbuf, dout, q, k, v, lse, seq_starts, S, max_len, T, NH, NKV, scale, st);
    else bwd_launch<128>(dq, dk, dv, dbuf, dout, q, k, v, lse, seq_starts, S, max_len, T, NH, NKV, scale, st);
    return;
  }
  dq_plain<<<(unsigned)((rows + 127) / 128), 128, 0, st>>>(dq, dout, q, k, v, lse, dbuf, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention backward dQ (fp32)");
  const long kr = (long)T * NKV;
  dkv_plain<<<(unsigned)((kr + 127) / 128), 128, 0, st>>>(dk, dv, dout, q, k, v, lse, dbuf, seq_starts, S, T, NH, NKV, hd, scale);
  LAUNCH_CHECK("attention backward dK/dV (fp32)");
}

}  // namespace rls::cuda
