// RMSNorm on the GPU: the plain forward and backward (one block per row), the decode path's residual add fused with
// the norm, the warp-per-row kernels of the fused training step, per-head norms (q_norm / k_norm), and the
// deterministic two-stage column sums the weight gradients are taken with.
#include <string>

#include "../src/errors.h"
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace rls::cuda {

namespace {

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

}  // namespace

namespace {

int row_threads(int C) { return C >= 1024 ? 512 : C >= 256 ? 256 : 128; }
// K of the warp-per-row kernels for rows of C floats (columns per lane / 4, rounded up to an instantiated one),
// 0 where they do not apply
int row_k(int C) {
  if (C % 4 != 0 || C > 128 * ROW_K_MAX) return 0;
  const int k = (C + 127) / 128;
  return k <= 2 ? k : k <= 4 ? 4 : k <= 6 ? 6 : 8;
}
// blocks of the rmsnorm backward over rows: its weight gradient's partial sums are ROW_BLOCKS x C floats
constexpr int ROW_BLOCKS = 512;

// partial column sums: COL_CHUNKS x C floats for colsum, ROW_BLOCKS x C for the rmsnorm backward
float* col_partials(Scratch& colp, int C) {
  return (float*)colp.get(std::max<size_t>((size_t)ROW_BLOCKS, COL_CHUNKS) * C * sizeof(float));
}
void colsum_finish(float* dst, const float* part, int C, int chunks, cudaStream_t st) {
  k_colsum_finish<<<(C + CF_COLS - 1) / CF_COLS, dim3(CF_COLS, CF_ROWS), 0, st>>>(dst, part, C, chunks);
  LAUNCH_CHECK("column sums (finish)");
}

}  // namespace

void colsum(float* dst, const float* a, const float* b, const float* rowscale, int T, int C, Scratch& colp,
            cudaStream_t st) {
  float* part = col_partials(colp, C);
  const dim3 grid((C + 255) / 256, COL_CHUNKS);
  k_colsum_partial<<<grid, 256, 0, st>>>(part, a, b, rowscale, T, C);
  LAUNCH_CHECK("column sums (partial)");
  colsum_finish(dst, part, C, COL_CHUNKS, st);
}

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps,
                     cudaStream_t st) {
  k_rmsnorm_forward<<<T, row_threads(C), 0, st>>>(out, rstd, inp, w, C, eps);
  LAUNCH_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(float* dinp, bf16* dinp16, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int T, int C, Scratch& colp, cudaStream_t st) {
  const int k = row_k(C);
  if (k == 0) {
    k_rmsnorm_backward_dx<<<T, row_threads(C), 0, st>>>(dinp, dinp16, dout, inp, w, rstd, C);
    LAUNCH_CHECK("rmsnorm_backward dx");
    colsum(dw, dout, inp, rstd, T, C, colp, st);
    return;
  }
  float* part = col_partials(colp, C);
#define RLS_ROWS(K) \
  k_rmsnorm_back_rows<K><<<ROW_BLOCKS, ROW_WARPS * 32, 0, st>>>(dinp, dinp16, part, dout, inp, w, rstd, T, C)
  switch (k) {
    case 1: RLS_ROWS(1); break;
    case 2: RLS_ROWS(2); break;
    case 4: RLS_ROWS(4); break;
    case 6: RLS_ROWS(6); break;
    default: RLS_ROWS(8); break;
  }
#undef RLS_ROWS
  LAUNCH_CHECK("rmsnorm backward rows");
  colsum_finish(dw, part, C, ROW_BLOCKS, st);
}

void add_rmsnorm(float* x, float* out, bf16* out16, float* rstd, const float* a, const float* b, const float* w, int T,
                 int C, float eps, cudaStream_t st) {
  const unsigned grid = (unsigned)((T + ROW_WARPS - 1) / ROW_WARPS);
#define RLS_ROWS(K) \
  k_add_rmsnorm_rows<K><<<grid, ROW_WARPS * 32, 0, st>>>(x, out, out16, rstd, a, b, w, T, C, eps)
  switch (row_k(C)) {
    case 1: RLS_ROWS(1); break;
    case 2: RLS_ROWS(2); break;
    case 4: RLS_ROWS(4); break;
    case 6: RLS_ROWS(6); break;
    case 8: RLS_ROWS(8); break;
    default: k_add_rmsnorm<<<T, row_threads(C), 0, st>>>(x, out, out16, rstd, a, b, w, C, eps);
  }
#undef RLS_ROWS
  LAUNCH_CHECK("add_rmsnorm");
}

void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd, float eps,
                  cudaStream_t st) {
  const long rows = (long)T * nh;
  k_head_rmsnorm<<<blocks_for((size_t)rows * 32, 256), 256, 0, st>>>(x, ld, saved, rstd, w, T, nh, hd, eps);
  LAUNCH_CHECK("head_rmsnorm");
}
void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w, const float* rstd, int T,
                           int nh, int hd, Scratch& colp, cudaStream_t st) {
  // the weight's gradient from d out (rows of hd floats one after the other: ld must be nh * hd here)
  if (ld != nh * hd) invalid("head_rmsnorm_backward: the CUDA layer takes d out as contiguous heads");
  colsum(dw, dx, saved, rstd, T * nh, hd, colp, st);
  const long rows = (long)T * nh;
  k_head_rmsnorm_back<<<blocks_for((size_t)rows * 32, 256), 256, 0, st>>>(dx, ld, saved, w, rstd, T, nh, hd);
  LAUNCH_CHECK("head_rmsnorm_backward");
}

}  // namespace rls::cuda
