// The sgemm of blas_shim/cblas.h: C = alpha op(A) op(B) + beta C, row-major, accumulated in double per element so
// the reference is at least as accurate as a BLAS. Slow by design; only the standalone GPU driver links it.
#include "cblas.h"

extern "C" void openblas_set_num_threads(int) {}

extern "C" void cblas_sgemm(CBLAS_ORDER, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                            const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++) {
        const float a = ta == CblasTrans ? A[(long)k * lda + i] : A[(long)i * lda + k];
        const float b = tb == CblasTrans ? B[(long)j * ldb + k] : B[(long)k * ldb + j];
        s += (double)a * b;
      }
      float& c = C[(long)i * ldc + j];
      c = (float)(alpha * s + (beta == 0.f ? 0.0 : (double)beta * c));
    }
}
