// The optimizer's CUDA ops: AdamW over a parameter tensor, and the deterministic sum of squares gradient clipping
// takes the norm from.
#include <cmath>
#include "common.cuh"
#include "ops.cuh"

namespace rls::cuda {

namespace {

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

}  // namespace

double sum_squares(const float* x, size_t n, Scratch& partials, cudaStream_t st) {
  double* part = (double*)partials.get(SS_BLOCKS * sizeof(double));
  k_sum_squares<<<SS_BLOCKS, SS_THREADS, 0, st>>>(part, x, n);
  LAUNCH_CHECK("sum_squares");
  double h[SS_BLOCKS];
  CUDA_CHECK(cudaMemcpy(h, part, sizeof h, cudaMemcpyDeviceToHost));
  double total = 0.0;
  for (double v : h) total += v;
  return total;
}
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
           float wd, float bc1, float bc2, cudaStream_t st) {
  k_adamw<<<blocks_for(n, 256), 256, 0, st>>>(p, g, m, v, n, lr, beta1, beta2, eps, 1.f - lr * wd, lr / bc1, std::sqrt(bc2));
  LAUNCH_CHECK("adamw");
}

}  // namespace rls::cuda
