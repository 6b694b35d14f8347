// Sampling on the GPU: a token per row of probabilities, the arg-max or the draw of a given uniform u, the same
// index the CPU picks, with its log-probability.
#include <cmath>
#include "common.cuh"
#include "ops.cuh"

namespace rls::cuda {

namespace {

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

}  // namespace

void sample_rows(const float* x, const double* u, int N, int V, int* token, float* logp, cudaStream_t st) {
  k_sample_rows<<<N, SR_THREADS, 0, st>>>(x, u, V, token, logp);
  LAUNCH_CHECK("sample_rows");
}

}  // namespace rls::cuda
