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

// exp for float without branches, so loops with it vectorize (std::exp does not without -ffast-math): Cody-Waite
// range reduction x = n ln2 + r, a degree-6 polynomial for e^r on |r| <= ln2/2 (Cephes coefficients, ~1 ulp),
// and 2^n built in the exponent bits. Inputs below -87.3 give 0; above 88 they are clamped to e^88 (finite).
inline float vexp(float x) {
  const float hi = 88.0f, lo = -87.3365448f;  // 2^n must stay a normal float: n <= 127
  const bool under = x < lo;
  x = std::min(std::max(x, lo), hi);  // this argument order lets NaN through (NaN in, NaN out)
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return under ? 0.0f : y * scale;
}

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
  void dropout(float* out, const float* x, size_t n, float p, uint64_t seed) override {
    const long nn = static_cast<long>(n);
    const float keep_scale = 1.f / (1.f - p);
    const uint32_t cut = (uint32_t)std::ceil((double)p * 16777216.0);  // u >= p  <=>  top24 >= ceil(p * 2^24)
#pragma omp parallel for num_threads(nt_) schedule(static) if (nn > 65536)
    for (long i = 0; i < nn; i++) {
      uint64_t z = seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      out[i] = (uint32_t)(z >> 40) >= cut ? x[i] * keep_scale : 0.f;
    }
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

  void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd,
                    float eps) override {
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 16)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nh; h++) {
        float* v = x + (size_t)t * ld + (size_t)h * hd;
        if (saved) std::memcpy(saved + ((size_t)t * nh + h) * hd, v, hd * sizeof(float));
        const float r = 1.0f / std::sqrt(dot(v, v, hd) / hd + eps);
        rstd[(size_t)t * nh + h] = r;
#pragma omp simd
        for (int i = 0; i < hd; i++) v[i] = w[i] * (v[i] * r);
      }
  }
  void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w, const float* rstd,
                             int T, int nh, int hd) override {
    // dw first (it needs d out), each thread a column range over every row in order: deterministic
    const int nb = std::max(1, std::min(nt_, hd / 8));
#pragma omp parallel for num_threads(nt_) schedule(static) if (nb > 1)
    for (int b = 0; b < nb; b++) {
      const int c0 = (int)((long)hd * b / nb), c1 = (int)((long)hd * (b + 1) / nb);
      for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
          const float* dy = dx + (size_t)t * ld + (size_t)h * hd;
          const float* xs = saved + ((size_t)t * nh + h) * hd;
          const float r = rstd[(size_t)t * nh + h];
          for (int i = c0; i < c1; i++) dw[i] += dy[i] * xs[i] * r;
        }
    }
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 16)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nh; h++) {
        float* dy = dx + (size_t)t * ld + (size_t)h * hd;
        const float* xs = saved + ((size_t)t * nh + h) * hd;
        const float r = rstd[(size_t)t * nh + h];
        float m = 0.f;
#pragma omp simd reduction(+ : m)
        for (int i = 0; i < hd; i++) m += dy[i] * w[i] * xs[i] * r;
        m /= hd;
#pragma omp simd
        for (int i = 0; i < hd; i++) dy[i] = r * (dy[i] * w[i] - xs[i] * r * m);
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
    if (dw) gemm(true, false, OC, C, N, dout, OC, inp, C, 1.f, dw, C);
    if (dbias) {
      const int nb = std::max(1, std::min(nt_, OC / 16));
#pragma omp parallel for num_threads(nt_) schedule(static) if (nb > 1)
      for (int b = 0; b < nb; b++) {
        const int c0 = (int)((long)OC * b / nb), c1 = (int)((long)OC * (b + 1) / nb);
        for (int n = 0; n < N; n++) axpy(dbias + c0, 1.f, dout + (size_t)n * OC + c0, c1 - c0);
      }
    }
  }

  void rope_table(float* cosb, float* sinb, const int32_t* pos, int T, int hd, const float* inv) override {
    const int half = hd / 2;
    // float32 like HF: freqs = pos * inv_freq rounded to float
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < half; i++) {
        const float ang = (float)pos[t] * inv[i];
        cosb[(size_t)t * half + i] = (float)std::cos((double)ang);
        sinb[(size_t)t * half + i] = (float)std::sin((double)ang);
      }
  }
  void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    rope_rotate<false>(x, cosb, sinb, T, nh, hd);
  }
  // The gradient of a rotation is the rotation by the opposite angle.
  void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    rope_rotate<true>(dx, cosb, sinb, T, nh, hd);
  }
  // Rotates each (i, i + hd/2) pair of every head in place by the position's angle, or by its negative when
  // Inverse (sin negated: exact, so both directions round as the two written-out loops would).
  template <bool Inverse>
  void rope_rotate(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) {
    const int half = hd / 2;
#pragma omp parallel for num_threads(nt_) schedule(static) if (T > 64)
    for (int t = 0; t < T; t++) {
      const float* c = cosb + (size_t)t * half;
      const float* s = sinb + (size_t)t * half;
      for (int h = 0; h < nh; h++) {
        float* v = x + ((size_t)t * nh + h) * hd;
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float a = v[i], b = v[i + half], sn = Inverse ? -s[i] : s[i];
          v[i] = a * c[i] - b * sn;
          v[i + half] = b * c[i] + a * sn;
        }
      }
    }
  }

  // Attention works on blocks of ATT_B rows of one sequence and one head, each block through sgemm: the scores of
  // a block against every key up to its last row, a causal mask inside the diagonal block, softmax in place.
  static constexpr int ATT_B = 64;

  struct AttItem {
    int s0, n, h, b;  // sequence start and length, head (query or kv), block index
  };
  static std::vector<AttItem> att_items(const int32_t* seq_starts, int S, int heads) {
    std::vector<AttItem> items;
    for (int s = 0; s < S; s++) {
      const int s0 = seq_starts[s], n = seq_starts[s + 1] - s0;
      for (int h = 0; h < heads; h++)
        for (int b = 0; b * ATT_B < n; b++) items.push_back({s0, n, h, b});
    }
    // longest blocks first so dynamic scheduling balances the causal triangle
    std::stable_sort(items.begin(), items.end(), [](const AttItem& x, const AttItem& y) { return x.b > y.b; });
    return items;
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    const int QD = NH * hd, KD = NKV * hd, group = NH / NKV;
    const float sc = 1.0f / std::sqrt((float)hd);
    const std::vector<AttItem> items = att_items(seq_starts, S, NH);
    const long ni = (long)items.size();
#pragma omp parallel num_threads(nt_)
    {
      std::vector<float> P;
#pragma omp for schedule(dynamic, 1)
      for (long it = 0; it < ni; it++) {
        const AttItem& w = items[it];
        const int i0 = w.b * ATT_B, i1 = std::min(w.n, i0 + ATT_B), rows = i1 - i0, cols = i1, kh = w.h / group;
        P.resize((size_t)rows * cols);
        const float* Qb = q + (size_t)(w.s0 + i0) * QD + (size_t)w.h * hd;
        const float* Kb = k + (size_t)w.s0 * KD + (size_t)kh * hd;
        const float* Vb = v + (size_t)w.s0 * KD + (size_t)kh * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hd, sc, Qb, QD, Kb, KD, 0.f, P.data(), cols);
        for (int r = 0; r < rows; r++) {
          float* row = P.data() + (size_t)r * cols;
          const int cnt = i0 + r + 1;  // keys 0..i are visible to query i
          float mx = -INFINITY;
          for (int j = 0; j < cnt; j++) mx = std::max(mx, row[j]);
          double sum = 0.;  // see logsoftmax_forward: a float sum drops the small terms of a flat row
#pragma omp simd reduction(+ : sum)
          for (int j = 0; j < cnt; j++) {
            row[j] = vexp(row[j] - mx);
            sum += row[j];
          }
          const float inv = (float)(1. / sum);
          for (int j = 0; j < cnt; j++) row[j] *= inv;
          for (int j = cnt; j < cols; j++) row[j] = 0.f;
          lse[(size_t)w.h * T + w.s0 + i0 + r] = mx + std::log(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, cols, 1.f, P.data(), cols, Vb, KD, 0.f,
                    out + (size_t)(w.s0 + i0) * QD + (size_t)w.h * hd, QD);
      }
    }
  }

  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const int32_t* seq_starts, int S, int T,
                          int NH, int NKV, int hd) override {
    const int QD = NH * hd, KD = NKV * hd, group = NH / NKV;
    const float sc = 1.0f / std::sqrt((float)hd);
    std::vector<float> D((size_t)NH * T);
    const std::vector<AttItem> qitems = att_items(seq_starts, S, NH), kitems = att_items(seq_starts, S, NKV);
    const long nq = (long)qitems.size(), nk = (long)kitems.size();
#pragma omp parallel num_threads(nt_)
    {
      std::vector<float> P, dP;
      // Pass 1, query blocks: P from q, k and lse; dP = dO V^T; dS = P (dP - D); dQ = sc dS K.
#pragma omp for schedule(dynamic, 1)
      for (long it = 0; it < nq; it++) {
        const AttItem& w = qitems[it];
        const int i0 = w.b * ATT_B, i1 = std::min(w.n, i0 + ATT_B), rows = i1 - i0, cols = i1, kh = w.h / group;
        P.resize((size_t)rows * cols);
        dP.resize((size_t)rows * cols);
        const size_t qoff = (size_t)(w.s0 + i0) * QD + (size_t)w.h * hd;
        const float* Kb = k + (size_t)w.s0 * KD + (size_t)kh * hd;
        const float* Vb = v + (size_t)w.s0 * KD + (size_t)kh * hd;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hd, sc, q + qoff, QD, Kb, KD, 0.f, P.data(), cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hd, 1.f, dout + qoff, QD, Vb, KD, 0.f, dP.data(), cols);
        for (int r = 0; r < rows; r++) {
          const int i = w.s0 + i0 + r, cnt = i0 + r + 1;
          const float Di = dot(dout + qoff + (size_t)r * QD, out + qoff + (size_t)r * QD, hd);
          D[(size_t)w.h * T + i] = Di;
          const float l = lse[(size_t)w.h * T + i];
          float* pr = P.data() + (size_t)r * cols;
          float* dr = dP.data() + (size_t)r * cols;
#pragma omp simd
          for (int j = 0; j < cnt; j++) dr[j] = vexp(pr[j] - l) * (dr[j] - Di);
          for (int j = cnt; j < cols; j++) dr[j] = 0.f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, cols, sc, dP.data(), cols, Kb, KD, 0.f, dq + qoff, QD);
      }
      // Pass 2, key blocks (all query heads of the group, every later query): dV = P^T dO, dK = sc dS^T Q.
#pragma omp for schedule(dynamic, 1)
      for (long it = 0; it < nk; it++) {
        const AttItem& w = kitems[it];
        const int j0 = w.b * ATT_B, j1 = std::min(w.n, j0 + ATT_B), bk = j1 - j0, nqr = w.n - j0;
        const size_t koff = (size_t)(w.s0 + j0) * KD + (size_t)w.h * hd;
        for (int r = 0; r < bk; r++) {
          std::fill(dk + koff + (size_t)r * KD, dk + koff + (size_t)r * KD + hd, 0.f);
          std::fill(dv + koff + (size_t)r * KD, dv + koff + (size_t)r * KD + hd, 0.f);
        }
        P.resize((size_t)nqr * bk);
        dP.resize((size_t)nqr * bk);
        for (int h = w.h * group; h < (w.h + 1) * group; h++) {
          const size_t qoff = (size_t)(w.s0 + j0) * QD + (size_t)h * hd;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nqr, bk, hd, sc, q + qoff, QD, k + koff, KD, 0.f, P.data(), bk);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nqr, bk, hd, 1.f, dout + qoff, QD, v + koff, KD, 0.f, dP.data(), bk);
          for (int r = 0; r < nqr; r++) {
            const int i = w.s0 + j0 + r;
            const float l = lse[(size_t)h * T + i], Di = D[(size_t)h * T + i];
            float* pr = P.data() + (size_t)r * bk;
            float* dr = dP.data() + (size_t)r * bk;
            const int cnt = std::min(bk, r + 1);  // key j0+c is visible to query j0+r when c <= r
#pragma omp simd
            for (int c = 0; c < cnt; c++) {
              pr[c] = vexp(pr[c] - l);
              dr[c] = pr[c] * (dr[c] - Di);
            }
            for (int c = cnt; c < bk; c++) pr[c] = dr[c] = 0.f;
          }
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, hd, nqr, 1.f, P.data(), bk, dout + qoff, QD, 1.f, dv + koff, KD);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, hd, nqr, sc, dP.data(), bk, q + qoff, QD, 1.f, dk + koff, KD);
        }
      }
    }
  }

  void kv_store(void* kcache, void* vcache, const float* k, const float* v, const int32_t* slot, const int32_t* pos,
                int T, int KD, int max_len) override {
    float *kc = (float*)kcache, *vc = (float*)vcache;
    for (int t = 0; t < T; t++) {
      const size_t at = ((size_t)slot[t] * max_len + pos[t]) * KD;
      std::memcpy(kc + at, k + (size_t)t * KD, (size_t)KD * sizeof(float));
      std::memcpy(vc + at, v + (size_t)t * KD, (size_t)KD * sizeof(float));
    }
  }
  // One (query token, head) per item: scores against the slot's keys 0..pos, softmax, weighted sum of values. The
  // same arithmetic per row as attention_forward (scaled dot products, max-shifted vexp, sum, then divide).
  void attention_cached(float* out, const float* q, const void* kcache, const void* vcache, const int32_t* slot,
                        const int32_t* pos, int T, int NH, int NKV, int hd, int max_len) override {
    const float *kc = (const float*)kcache, *vc = (const float*)vcache;
    const int QD = NH * hd, KD = NKV * hd, group = NH / NKV;
    const float sc = 1.0f / std::sqrt((float)hd);
    const long ni = (long)T * NH;
#pragma omp parallel num_threads(nt_)
    {
      std::vector<float> P;
#pragma omp for schedule(dynamic, 4)
      for (long it = 0; it < ni; it++) {
        const int t = (int)(it / NH), h = (int)(it % NH), kh = h / group, n = pos[t] + 1;
        const float* qr = q + (size_t)t * QD + (size_t)h * hd;
        const float* K = kc + (size_t)slot[t] * max_len * KD + (size_t)kh * hd;
        const float* Vc = vc + (size_t)slot[t] * max_len * KD + (size_t)kh * hd;
        P.resize((size_t)n);
        float mx = -INFINITY;
        for (int j = 0; j < n; j++) {
          P[j] = dot(qr, K + (size_t)j * KD, hd) * sc;
          mx = std::max(mx, P[j]);
        }
        double sum = 0.;  // see logsoftmax_forward
        for (int j = 0; j < n; j++) {
          P[j] = vexp(P[j] - mx);
          sum += P[j];
        }
        const float inv = (float)(1. / sum);
        float* o = out + (size_t)t * QD + (size_t)h * hd;
        std::fill(o, o + hd, 0.f);
        for (int j = 0; j < n; j++) axpy(o, P[j] * inv, Vc + (size_t)j * KD, hd);
      }
    }
  }
  void softmax_rows(float* x, const float* inv_temp, int N, int V) override {
#pragma omp parallel for num_threads(nt_) schedule(static)
    for (int n = 0; n < N; n++) {
      float* z = x + (size_t)n * V;
      const float s = inv_temp[n];
      float mx = -INFINITY;
      for (int i = 0; i < V; i++) mx = std::max(mx, z[i] * s);
      double sum = 0.;  // see logsoftmax_forward
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) {
        z[i] = vexp(z[i] * s - mx);
        sum += z[i];
      }
      const float inv = (float)(1. / sum);
#pragma omp simd
      for (int i = 0; i < V; i++) z[i] *= inv;
    }
  }

  void sample_rows(const float* x, const double* u, int N, int V, int32_t* token, float* logp) override {
#pragma omp parallel for num_threads(nt_) schedule(static) if (N > 8)
    for (int n = 0; n < N; n++) {
      const float* z = x + (size_t)n * V;
      int pick = -1;
      if (u[n] < 0) {
        pick = 0;
        for (int i = 1; i < V; i++)
          if (z[i] > z[pick]) pick = i;
      } else {
        double left = u[n];
        for (int i = 0; i < V && pick < 0; i++) {
          left -= z[i];
          if (left < 0) pick = i;
        }
        if (pick < 0) {
          pick = V - 1;
          while (pick > 0 && z[pick] == 0.f) pick--;
        }
      }
      token[n] = pick;
      logp[n] = (float)std::log((double)z[pick]);
    }
  }

  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    const long nn = (long)n;
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 16384)
    for (long i = 0; i < nn; i++) {
      const float g = gate[i];
      out[i] = g / (1.f + vexp(-g)) * up[i];
    }
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       size_t n) override {
    const long nn = (long)n;
#pragma omp parallel for simd num_threads(nt_) schedule(static) if (nn > 16384)
    for (long i = 0; i < nn; i++) {
      const float g = gate[i], sg = 1.f / (1.f + vexp(-g));
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
      // one exp per element: with s_i = z_i - max, H = log(sum e^s) - sum(e^s s) / sum(e^s). The sums are double:
      // summed in float (and this loop does not always vectorize into many partial sums), a flat row's thousands of
      // terms below half an ulp of the running sum are each rounded away, always down. On SmolLM2-135M's
      // 49,152-token vocabulary that lowered log-sum-exp by up to 1.1e-4, ten times transformers' fp32 error.
      double sum = 0., es = 0.;
#pragma omp simd reduction(+ : sum, es)
      for (int i = 0; i < V; i++) {
        const float s = z[i] - mx, e = vexp(s);
        sum += e;
        es += (double)e * s;
      }
      const float lsum = (float)std::log(sum), l = mx + lsum;
      ent[n] = (float)(std::log(sum) - es / sum);
#pragma omp simd
      for (int i = 0; i < V; i++) z[i] -= l;
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
        const float p = vexp(z[i]);
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
