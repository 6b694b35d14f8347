// CPU reference implementation of the kernel interface: OpenMP loops for elementwise work and attention, OpenBLAS
// sgemm (single-threaded per call) for the matrix multiplies, split over the OpenMP threads by output blocks so
// that each output element is computed by exactly one sgemm over its full K (deterministic for a thread count).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "device.h"

extern "C" void openblas_set_num_threads(int);

namespace rls {

namespace {

// One-time: OpenBLAS runs single-threaded inside each call; parallelism is ours (no two thread pools spinning).
struct BlasInit {
  BlasInit() { openblas_set_num_threads(1); }
};
static BlasInit blas_init;

inline float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
  for (int i = 0; i < n; i++) y[i] += a * x[i];
}

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(int threads) : nt_(std::max(1, threads)) {}
  const char* name() const override { return "cpu"; }
  void set_threads(int threads) override { nt_ = std::max(1, threads); }

  float* alloc(size_t n) override {
    size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
    if (bytes == 0) bytes = 64;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void release(float* p) override { std::free(p); }
  void zero(float* p, size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void copy(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }

  void add_inplace(float* y, const float* x, size_t n) override {
    const long nn = static_cast<long>(n);
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 65536)
    for (long i = 0; i < nn; i++) y[i] += x[i];
  }
  void scale(float* x, size_t n, float s) override {
    const long nn = static_cast<long>(n);
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 65536)
    for (long i = 0; i < nn; i++) x[i] *= s;
  }
  double sum_squares(const float* x, size_t n) override {
    // Fixed 4096-element chunks summed in double, combined in order: the same bits for any thread count.
    const long chunk = 4096, nc = static_cast<long>((n + chunk - 1) / chunk);
    std::vector<double> part(static_cast<size_t>(nc), 0.0);
#pragma omp parallel for num_threads(nt_) schedule(static) if (nc > 16)
    for (long c = 0; c < nc; c++) {
      const long a = c * chunk, b = std::min<long>(static_cast<long>(n), a + chunk);
      double s = 0.0;
      for (long i = a; i < b; i++) s += static_cast<double>(x[i]) * x[i];
      part[static_cast<size_t>(c)] = s;
    }
    double total = 0.0;
    for (double p : part) total += p;
    return total;
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int H) override {
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) std::memcpy(out + (size_t)t * H, wte + (size_t)tokens[t] * H, H * sizeof(float));
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int H) override {
    // Columns split over threads, tokens in order: repeated ids accumulate without races, deterministically.
    const int nb = std::max(1, std::min(nt_, H / 16));
#pragma omp parallel for num_threads(nt_) schedule(static) if (nb > 1)
    for (int b = 0; b < nb; b++) {
      const int c0 = (int)((long)H * b / nb), c1 = (int)((long)H * (b + 1) / nb);
      for (int t = 0; t < T; t++) axpy(dwte + (size_t)tokens[t] * H + c0, 1.f, dout + (size_t)t * H + c0, c1 - c0);
    }
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps) override {
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 16)
    for (int t = 0; t < T; t++) {
      const float* x = inp + (size_t)t * C;
      float ss = dot(x, x, C);
      float r = 1.0f / std::sqrt(ss / C + eps);
      rstd[t] = r;
      float* o = out + (size_t)t * C;
#pragma omp simd
      for (int i = 0; i < C; i++) o[i] = w[i] * (x[i] * r);
    }
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int T, int C) override {
#pragma omp parallel num_threads(nt_) if (T > 16)
    {
#pragma omp for schedule(static)
      for (int t = 0; t < T; t++) {
        const float* x = inp + (size_t)t * C;
        const float* dy = dout + (size_t)t * C;
        const float r = rstd[t];
        // dx = r * (dn - n * mean(dn * n)), n = x * r, dn = dy * w
        float m = 0.f;
#pragma omp simd reduction(+ : m)
        for (int i = 0; i < C; i++) m += dy[i] * w[i] * x[i] * r;
        m /= C;
        float* dx = dinp + (size_t)t * C;
#pragma omp simd
        for (int i = 0; i < C; i++) dx[i] += r * (dy[i] * w[i] - x[i] * r * m);
      }
      // dw: each thread owns a column range and walks tokens in order.
#pragma omp for schedule(static)
      for (int b = 0; b < nt_; b++) {
        const int c0 = (int)((long)C * b / nt_), c1 = (int)((long)C * (b + 1) / nt_);
        for (int t = 0; t < T; t++) {
          const float* x = inp + (size_t)t * C;
          const float* dy = dout + (size_t)t * C;
          const float r = rstd[t];
#pragma omp simd
          for (int i = c0; i < c1; i++) dw[i] += dy[i] * x[i] * r;
        }
      }
    }
  }

  // C[M,N] = op(A) op(B) + beta C, split into nt_ blocks of rows (M) or columns (N); K is never split.
  void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float beta,
            float* Cm, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
      if (beta == 0.f)
        for (int i = 0; i < M; i++) std::memset(Cm + (size_t)i * ldc, 0, N * sizeof(float));
      return;
    }
    const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    const double work = (double)M * N * K;
    const int parts = work < (1 << 18) ? 1 : nt_;
    if (parts == 1) {
      cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, 1.f, A, lda, B, ldb, beta, Cm, ldc);
      return;
    }
    const bool split_rows = M >= N;
#pragma omp parallel for num_threads(parts) schedule(static)
    for (int p = 0; p < parts; p++) {
      const int D = split_rows ? M : N;
      // block boundaries on multiples of 16 keep the BLAS micro-kernels on full tiles
      int a = (int)((long)D * p / parts), b = (int)((long)D * (p + 1) / parts);
      if (p > 0) a = std::min(D, (a + 15) / 16 * 16);
      if (p + 1 < parts) b = std::min(D, (b + 15) / 16 * 16);
      if (b <= a) continue;
      if (split_rows) {
        const float* Ap = ta ? A + a : A + (size_t)a * lda;
        cblas_sgemm(CblasRowMajor, TA, TB, b - a, N, K, 1.f, Ap, lda, B, ldb, beta, Cm + (size_t)a * ldc, ldc);
      } else {
        const float* Bp = tb ? B + (size_t)a * ldb : B + a;
        cblas_sgemm(CblasRowMajor, TA, TB, M, b - a, K, 1.f, A, lda, Bp, ldb, beta, Cm + a, ldc);
      }
    }
  }

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                      bool accumulate) override {
    gemm(false, true, N, OC, C, inp, C, w, C, accumulate ? 1.f : 0.f, out, OC);
    if (bias) {
#pragma omp parallel for num_threads(nt_) schedule(static) if (N > 64)
      for (int n = 0; n < N; n++) axpy(out + (size_t)n * OC, 1.f, bias, OC);
    }
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       int N, int C, int OC) override {
    if (dinp) gemm(false, false, N, C, OC, dout, OC, w, C, 1.f, dinp, C);
    gemm(true, false, OC, C, N, dout, OC, inp, C, 1.f, dw, C);
    if (dbias) {
      const int nb = std::max(1, std::min(nt_, OC / 16));
#pragma omp parallel for num_threads(nt_) schedule(static) if (nb > 1)
      for (int b = 0; b < nb; b++) {
        const int c0 = (int)((long)OC * b / nb), c1 = (int)((long)OC * (b + 1) / nb);
        for (int n = 0; n < N; n++) axpy(dbias + c0, 1.f, dout + (size_t)n * OC + c0, c1 - c0);
      }
    }
  }

  void rope_table(float* cosb, float* sinb, const int32_t* pos, int T, int hd, double theta) override {
    const int half = hd / 2;
    std::vector<float> inv(half);
    // float32 like HF: inv_freq = 1 / theta^(2i/hd), freqs = pos * inv_freq, both rounded to float
    for (int i = 0; i < half; i++) inv[i] = 1.0f / (float)std::pow(theta, (double)(2 * i) / (double)hd);
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < half; i++) {
        const float ang = (float)pos[t] * inv[i];
        cosb[(size_t)t * half + i] = (float)std::cos((double)ang);
        sinb[(size_t)t * half + i] = (float)std::sin((double)ang);
      }
  }
  void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    const int half = hd / 2;
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) {
      const float* c = cosb + (size_t)t * half;
      const float* s = sinb + (size_t)t * half;
      for (int h = 0; h < nh; h++) {
        float* v = x + ((size_t)t * nh + h) * hd;
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] - b * s[i];
          v[i + half] = b * c[i] + a * s[i];
        }
      }
    }
  }
  void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    const int half = hd / 2;
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) {
      const float* c = cosb + (size_t)t * half;
      const float* s = sinb + (size_t)t * half;
      for (int h = 0; h < nh; h++) {
        float* v = dx + ((size_t)t * nh + h) * hd;
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] + b * s[i];
          v[i + half] = b * c[i] - a * s[i];
        }
      }
    }
  }

  // seq_start_of[t] = first position of t's sequence; seq_end_of[t] = one past its last.
  static void seq_bounds(const int32_t* seq_starts, int S, int T, std::vector<int>& st, std::vector<int>& en) {
    st.resize(T);
    en.resize(T);
    for (int s = 0; s < S; s++)
      for (int t = seq_starts[s]; t < seq_starts[s + 1]; t++) {
        st[t] = seq_starts[s];
        en[t] = seq_starts[s + 1];
      }
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    std::vector<int> st, en;
    seq_bounds(seq_starts, S, T, st, en);
    const int QD = NH * hd, KD = NKV * hd, group = NH / NKV;
    const float sc = 1.0f / std::sqrt((float)hd);
    const long rows = (long)NH * T;
#pragma omp parallel num_threads(nt_)
    {
      std::vector<float> p;
#pragma omp for schedule(dynamic, 8)
      for (long r = 0; r < rows; r++) {
        const int h = (int)(r / T), t = (int)(r % T), kh = h / group, s0 = st[t], n = t - s0 + 1;
        if ((int)p.size() < n) p.resize(n);
        const float* qt = q + (size_t)t * QD + (size_t)h * hd;
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
          p[j] = dot(qt, k + (size_t)(s0 + j) * KD + (size_t)kh * hd, hd) * sc;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.f;
        for (int j = 0; j < n; j++) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        float* o = out + (size_t)t * QD + (size_t)h * hd;
        std::fill(o, o + hd, 0.f);
        const float inv = 1.f / sum;
        for (int j = 0; j < n; j++) axpy(o, p[j] * inv, v + (size_t)(s0 + j) * KD + (size_t)kh * hd, hd);
        lse[(size_t)h * T + t] = mx + std::log(sum);
      }
    }
  }

  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const int32_t* seq_starts, int S, int T,
                          int NH, int NKV, int hd) override {
    std::vector<int> st, en;
    seq_bounds(seq_starts, S, T, st, en);
    const int QD = NH * hd, KD = NKV * hd, group = NH / NKV;
    const float sc = 1.0f / std::sqrt((float)hd);
    std::vector<float> D((size_t)NH * T);
    const long rows = (long)NH * T, cols = (long)NKV * T;
#pragma omp parallel num_threads(nt_)
    {
      // Pass 1, one query row at a time: D = dout.out, dq = sc * sum_j p_j (dout.v_j - D) k_j.
#pragma omp for schedule(dynamic, 8)
      for (long r = 0; r < rows; r++) {
        const int h = (int)(r / T), t = (int)(r % T), kh = h / group, s0 = st[t];
        const float* qt = q + (size_t)t * QD + (size_t)h * hd;
        const float* dot_ = dout + (size_t)t * QD + (size_t)h * hd;
        const float Dt = dot(dot_, out + (size_t)t * QD + (size_t)h * hd, hd);
        D[(size_t)h * T + t] = Dt;
        const float l = lse[(size_t)h * T + t];
        float* dqt = dq + (size_t)t * QD + (size_t)h * hd;
        std::fill(dqt, dqt + hd, 0.f);
        for (int j = s0; j <= t; j++) {
          const float* kj = k + (size_t)j * KD + (size_t)kh * hd;
          const float pj = std::exp(dot(qt, kj, hd) * sc - l);
          const float ds = pj * (dot(dot_, v + (size_t)j * KD + (size_t)kh * hd, hd) - Dt);
          axpy(dqt, ds * sc, kj, hd);
        }
      }
      // Pass 2, one key row at a time (all query heads of its group): dk_j, dv_j without write conflicts.
#pragma omp for schedule(dynamic, 8)
      for (long r = 0; r < cols; r++) {
        const int kh = (int)(r / T), j = (int)(r % T), e = en[j];
        const float* kj = k + (size_t)j * KD + (size_t)kh * hd;
        const float* vj = v + (size_t)j * KD + (size_t)kh * hd;
        float* dkj = dk + (size_t)j * KD + (size_t)kh * hd;
        float* dvj = dv + (size_t)j * KD + (size_t)kh * hd;
        std::fill(dkj, dkj + hd, 0.f);
        std::fill(dvj, dvj + hd, 0.f);
        for (int h = kh * group; h < (kh + 1) * group; h++)
          for (int i = j; i < e; i++) {
            const float* qi = q + (size_t)i * QD + (size_t)h * hd;
            const float* doi = dout + (size_t)i * QD + (size_t)h * hd;
            const float pij = std::exp(dot(qi, kj, hd) * sc - lse[(size_t)h * T + i]);
            axpy(dvj, pij, doi, hd);
            const float ds = pij * (dot(doi, vj, hd) - D[(size_t)h * T + i]);
            axpy(dkj, ds * sc, qi, hd);
          }
      }
    }
  }

  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    const long nn = (long)n;
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 16384)
    for (long i = 0; i < nn; i++) {
      const float g = gate[i];
      out[i] = g / (1.f + std::exp(-g)) * up[i];
    }
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       size_t n) override {
    const long nn = (long)n;
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 16384)
    for (long i = 0; i < nn; i++) {
      const float g = gate[i], sg = 1.f / (1.f + std::exp(-g));
      dup[i] = dout[i] * g * sg;
      dgate[i] = dout[i] * up[i] * sg * (1.f + g * (1.f - sg));
    }
  }

  void logsoftmax_forward(float* logits, float* logp, float* ent, const int32_t* targets, int N, int V) override {
#pragma omp parallel for num_threads(nt_) schedule(static)
    for (int n = 0; n < N; n++) {
      float* z = logits + (size_t)n * V;
      float mx = -INFINITY;
      for (int i = 0; i < V; i++) mx = std::max(mx, z[i]);
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) sum += std::exp(z[i] - mx);
      const float l = mx + std::log(sum);
      float h = 0.f;
#pragma omp simd reduction(+ : h)
      for (int i = 0; i < V; i++) {
        const float lp = z[i] - l;
        z[i] = lp;
        h -= std::exp(lp) * lp;
      }
      ent[n] = h;
      logp[n] = targets[n] >= 0 ? z[targets[n]] : 0.f;
    }
  }
  void logsoftmax_backward(float* lp, const float* dlogp, const float* dent, const float* ent,
                           const int32_t* targets, int N, int V) override {
    // dz_i = dlogp (1[i = target] - p_i) - dent p_i (log p_i + H)
#pragma omp parallel for num_threads(nt_) schedule(static)
    for (int n = 0; n < N; n++) {
      float* z = lp + (size_t)n * V;
      const float a = dlogp[n], b = dent[n], H = ent[n];
      if (a == 0.f && b == 0.f) {
        std::memset(z, 0, (size_t)V * sizeof(float));
        continue;
      }
#pragma omp simd
      for (int i = 0; i < V; i++) {
        const float p = std::exp(z[i]);
        z[i] = -a * p - b * p * (z[i] + H);
      }
      if (targets[n] >= 0) z[targets[n]] += a;
    }
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
             float wd, float bc1, float bc2) override {
    const long nn = (long)n;
    const float step = lr / bc1, sbc2 = std::sqrt(bc2), decay = 1.f - lr * wd;
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 65536)
    for (long i = 0; i < nn; i++) {
      const float gi = g[i];
      const float mi = beta1 * m[i] + (1.f - beta1) * gi;
      const float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - step * mi / (std::sqrt(vi) / sbc2 + eps);
    }
  }

 private:
  int nt_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(int threads) { return std::make_unique<CpuKernels>(threads); }

double cpu_sgemm_gflops(int n, int iters, int threads) {
  std::vector<float> A((size_t)n * n), B((size_t)n * n), C((size_t)n * n);
  for (size_t i = 0; i < A.size(); i++) {
    A[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
    B[i] = (float)((i * 40503u) % 1000) / 1000.f - 0.5f;
  }
  openblas_set_num_threads(std::max(1, threads));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, C.data(), n);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  openblas_set_num_threads(1);
  return 2.0 * n * n * (double)n * iters / s / 1e9;
}

}  // namespace rls
