// Minimal stand-in for OpenBLAS's cblas.h, used only when the standalone GPU driver is built on a machine without
// OpenBLAS (the GPU image has none): a straightforward row-major sgemm, enough for the CPU reference at test sizes.
#pragma once

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                            const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);
