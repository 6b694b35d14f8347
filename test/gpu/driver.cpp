// Standalone driver of the GPU checks and benchmark, built with nvcc on the GPU machine (which has no Node): links
// the pure compute files (model, losses, config, cpu_kernels) and the CUDA layer, and runs
//   driver kernels            every CUDA kernel against the CPU one on random inputs (forward, gradients, updates)
//   driver model              a whole step of a model on CPU and CUDA: log-probs, loss, every gradient, AdamW update
//   driver step <file>        one policy-loss step dumped (weights, batch, logits, loss, gradients, update) for torch_ref.py
//   driver train <file> <n>   an n-step cross-entropy run dumped (weights, batches, losses) for torch_ref.py
//   driver bench [names]      training throughput, MFU and peak GPU memory for the 20M / 120M / 500M models
//   driver lora-dump <file>   one LoRA cross-entropy step (CUDA and CPU) dumped for peft_ref.py (adapter gradients)
//   driver lora-bench [names] [--recompute] [--seqs=N --len=N --rank=N --iters=N]
//                             LoRA step throughput and peak GPU memory at Qwen2.5's 1.5B / 3B / 7B shapes
//   driver dp <shape> --rank=R --ranks=N --id=<file> [--zero1] [--iters=N] [--seqs=N --len=N] [--bucket-mib=N]
//             [--check=<steps> --dump=<file>] [--broadcast] [--recompute]
//                             one rank of a data-parallel step over NCCL (one process per GPU; test/gpu/dp.sh)
// Exit status 1 when a check fails. Build and run: test/gpu/run.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../native/src/device.h"
#include "../../native/src/errors.h"
#include "../../native/src/losses.h"
#include "../../native/src/model.h"
#include "../../native/src/nccl_core.h"

using namespace rls;

namespace {

// ---- random numbers (splitmix64 + Box-Muller) ----
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uni() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  float normal() { return (float)(std::sqrt(-2.0 * std::log(uni())) * std::cos(6.283185307179586 * uni())); }
  int below(int n) { return (int)(next() % (uint64_t)n); }
};

std::vector<float> randn(Rng& r, size_t n, float std = 1.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * std;
  return v;
}

// ---- device buffers ----
struct Dev {
  Kernels* k;
  float* p;
  size_t n;
  Dev(Kernels* k_, const std::vector<float>& h) : k(k_), p(k_->alloc(h.size())), n(h.size()) { k->from_host(p, h.data(), n); }
  Dev(Kernels* k_, size_t n_) : k(k_), p(k_->alloc(n_)), n(n_) {}
  ~Dev() { k->release(p); }
  std::vector<float> host() const {
    std::vector<float> h(n);
    k->to_host(h.data(), p, n);
    return h;
  }
};

// ---- comparisons ----
struct Cmp {
  double max_abs = 0, rel = 0;  // rel = ||a - b|| / ||b||
  bool finite = true;
};
Cmp compare(const float* a, const float* b, size_t n) {
  double d2 = 0, r2 = 0;
  Cmp c;
  for (size_t i = 0; i < n; i++) {
    if (!std::isfinite(a[i])) c.finite = false;
    const double d = (double)a[i] - b[i];
    d2 += d * d;
    r2 += (double)b[i] * b[i];
    c.max_abs = std::max(c.max_abs, std::fabs(d));
  }
  c.rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  return c;
}
Cmp compare(const std::vector<float>& a, const std::vector<float>& b) { return compare(a.data(), b.data(), a.size()); }

int failures = 0;
void report(const std::string& what, const Cmp& c, double tol) {
  const bool ok = c.finite && c.rel <= tol;
  if (!ok) failures++;
  std::printf("%-58s rel %.2e  max|d| %.2e  tol %.0e  %s\n", what.c_str(), c.rel, c.max_abs, tol, ok ? "ok" : "FAIL");
}

// Tolerances (norm-relative): fp32 kernels agree with the CPU to rounding; products with bf16 operands carry about
// 2^-9 relative error per operand, ~3e-3 in norm after accumulation; attention adds bf16 P and dS on top.
constexpr double TOL_FP32 = 2e-5, TOL_BF16 = 1e-2, TOL_ATT = 2e-2;

// ---- kernel checks ----
void check_kernels() {
  auto cpu = make_cpu_kernels(8);
  auto gpu = make_cuda_kernels();
  Kernels* K = gpu.get();
  Rng r(42);
  std::printf("== kernels: CUDA vs CPU on random inputs ==\n");

  {  // elementwise helpers
    const size_t n = 1000003;
    auto x = randn(r, n), y = randn(r, n);
    Dev dx(K, x), dy(K, y);
    K->add_inplace(dy.p, dx.p, n);
    cpu->add_inplace(y.data(), x.data(), n);
    report("add_inplace", compare(dy.host(), y), TOL_FP32);
    K->scale(dy.p, n, 0.37f);
    cpu->scale(y.data(), n, 0.37f);
    report("scale", compare(dy.host(), y), TOL_FP32);
    const double a = K->sum_squares(dx.p, n), b = cpu->sum_squares(x.data(), n);
    report("sum_squares", Cmp{std::fabs(a - b), std::fabs(a - b) / b, true}, 1e-9);
    // adapter dropout: the same mask on both devices (the hash of (seed, i)), so the same values exactly
    K->dropout(dy.p, dx.p, n, 0.3f, 12345);
    cpu->dropout(y.data(), x.data(), n, 0.3f, 12345);
    report("dropout (p 0.3)", compare(dy.host(), y), 0.0);
  }
  {  // embedding (repeated ids in the backward)
    const int T = 517, H = 384, V = 97;
    std::vector<int32_t> tok(T);
    for (auto& t : tok) t = r.below(V);
    auto wte = randn(r, (size_t)V * H), dout = randn(r, (size_t)T * H), dw0 = randn(r, (size_t)V * H);
    Dev dwte(K, wte), dout_d(K, dout), out(K, (size_t)T * H), dw(K, dw0);
    std::vector<float> o((size_t)T * H), dwc = dw0;
    K->embedding_forward(out.p, tok.data(), dwte.p, T, H);
    cpu->embedding_forward(o.data(), tok.data(), wte.data(), T, H);
    report("embedding_forward", compare(out.host(), o), TOL_FP32);
    K->embedding_backward(dw.p, dout_d.p, tok.data(), T, H);
    cpu->embedding_backward(dwc.data(), dout.data(), tok.data(), T, H);
    report("embedding_backward (repeated ids, +=)", compare(dw.host(), dwc), TOL_FP32);
  }
  for (int C : {384, 1000}) {  // rmsnorm
    const int T = 333;
    auto x = randn(r, (size_t)T * C), w = randn(r, C), dy = randn(r, (size_t)T * C), dx0 = randn(r, (size_t)T * C),
         dw0 = randn(r, C);
    Dev xd(K, x), wd(K, w), dyd(K, dy), out(K, (size_t)T * C), rs(K, T), dxd(K, dx0), dwd(K, dw0);
    std::vector<float> o((size_t)T * C), rsc(T), dx = dx0, dw = dw0;
    K->rmsnorm_forward(out.p, rs.p, xd.p, wd.p, T, C, 1e-6f);
    cpu->rmsnorm_forward(o.data(), rsc.data(), x.data(), w.data(), T, C, 1e-6f);
    report("rmsnorm_forward C=" + std::to_string(C), compare(out.host(), o), TOL_FP32);
    K->rmsnorm_backward(dxd.p, dwd.p, dyd.p, xd.p, wd.p, rs.p, T, C);
    cpu->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rsc.data(), T, C);
    report("rmsnorm_backward dinp C=" + std::to_string(C), compare(dxd.host(), dx), TOL_FP32);
    report("rmsnorm_backward dw C=" + std::to_string(C), compare(dwd.host(), dw), TOL_FP32);
  }
  {  // matmul forward/backward with bias and accumulation
    const int N = 300, C = 256, OC = 384;
    auto x = randn(r, (size_t)N * C), w = randn(r, (size_t)OC * C, 0.05f), b = randn(r, OC), o0 = randn(r, (size_t)N * OC);
    auto dout = randn(r, (size_t)N * OC), dx0 = randn(r, (size_t)N * C), dw0 = randn(r, (size_t)OC * C), db0 = randn(r, OC);
    Dev xd(K, x), wd(K, w), bd(K, b), od(K, o0), dod(K, dout), dxd(K, dx0), dwd(K, dw0), dbd(K, db0);
    std::vector<float> o = o0, dx = dx0, dw = dw0, db = db0;
    K->matmul_forward(od.p, xd.p, wd.p, bd.p, N, C, OC, true);
    cpu->matmul_forward(o.data(), x.data(), w.data(), b.data(), N, C, OC, true);
    report("matmul_forward (bias, +=) bf16", compare(od.host(), o), TOL_BF16);
    K->matmul_forward(od.p, xd.p, wd.p, nullptr, N, C, OC, false);
    cpu->matmul_forward(o.data(), x.data(), w.data(), nullptr, N, C, OC, false);
    report("matmul_forward (=) bf16", compare(od.host(), o), TOL_BF16);
    K->matmul_backward(dxd.p, dwd.p, dbd.p, dod.p, xd.p, wd.p, N, C, OC);
    cpu->matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
    report("matmul_backward dinp (+=) bf16", compare(dxd.host(), dx), TOL_BF16);
    report("matmul_backward dw (+=) bf16", compare(dwd.host(), dw), TOL_BF16);
    report("matmul_backward dbias (+=)", compare(dbd.host(), db), TOL_FP32);
    // the cached bf16 weight must follow a write to the fp32 weight
    auto w2 = randn(r, (size_t)OC * C, 0.05f);
    K->from_host(wd.p, w2.data(), w2.size());
    K->matmul_forward(od.p, xd.p, wd.p, nullptr, N, C, OC, false);
    cpu->matmul_forward(o.data(), x.data(), w2.data(), nullptr, N, C, OC, false);
    report("matmul_forward after the weight changed (cache)", compare(od.host(), o), TOL_BF16);
  }
  // packed sequences: lengths 1, 64, 70, 128, 129 and a long one; an odd total, so that buffers of one float per
  // (head, token) have odd lengths and whatever follows them in a scratch block starts off a 16-byte boundary
  const std::vector<int> lens = {1, 64, 70, 128, 129, 401};
  std::vector<int32_t> starts = {0}, pos;
  for (int L : lens) {
    starts.push_back(starts.back() + L);
    for (int i = 0; i < L; i++) pos.push_back(i);
  }
  const int T = starts.back(), S = (int)lens.size();
  for (double theta : {1e4, 1e6}) {  // rotary
    const int hd = 64, nh = 6;
    std::vector<float> cb((size_t)T * hd / 2), sb((size_t)T * hd / 2);
    Dev cd(K, cb.size()), sd(K, sb.size());
    rls::ModelConfig rc;
    rc.hidden_size = hd * nh;
    rc.num_attention_heads = nh;
    rc.rope_theta = theta;
    const std::vector<float> inv = rc.rope_inv_freq();
    K->rope_table(cd.p, sd.p, pos.data(), T, hd, inv.data());
    cpu->rope_table(cb.data(), sb.data(), pos.data(), T, hd, inv.data());
    report("rope_table theta=" + std::to_string((int)theta), compare(cd.host(), cb), TOL_FP32);
    auto x = randn(r, (size_t)T * nh * hd);
    Dev xd(K, x);
    K->rope_forward(xd.p, cd.p, sd.p, T, nh, hd);
    cpu->rope_forward(x.data(), cb.data(), sb.data(), T, nh, hd);
    report("rope_forward", compare(xd.host(), x), TOL_FP32);
    K->rope_backward(xd.p, cd.p, sd.p, T, nh, hd);
    cpu->rope_backward(x.data(), cb.data(), sb.data(), T, nh, hd);
    report("rope_backward", compare(xd.host(), x), TOL_FP32);
  }
  {  // per-head q/k norms (Qwen3): in rows of a wider q|k|v layout and in contiguous rows, forward and backward
    const int hd = 128, nh = 6, ld = nh * hd + 2 * 2 * hd;
    auto x = randn(r, (size_t)T * ld), w = randn(r, hd), dy = randn(r, (size_t)T * nh * hd);
    std::vector<float> saved((size_t)T * nh * hd), rstd((size_t)T * nh), dw(hd, 0.f);
    Dev xd(K, x), wd(K, w), savedd(K, saved.size()), rstdd(K, rstd.size()), dyd(K, dy), dwd(K, dw);
    K->head_rmsnorm(xd.p, ld, savedd.p, rstdd.p, wd.p, T, nh, hd, 1e-6f);
    cpu->head_rmsnorm(x.data(), ld, saved.data(), rstd.data(), w.data(), T, nh, hd, 1e-6f);
    report("head_rmsnorm (strided rows)", compare(xd.host(), x), TOL_FP32);
    report("head_rmsnorm saved input", compare(savedd.host(), saved), 0);
    K->head_rmsnorm_backward(dyd.p, nh * hd, dwd.p, savedd.p, wd.p, rstdd.p, T, nh, hd);
    cpu->head_rmsnorm_backward(dy.data(), nh * hd, dw.data(), saved.data(), w.data(), rstd.data(), T, nh, hd);
    report("head_rmsnorm_backward dx", compare(dyd.host(), dy), TOL_FP32);
    report("head_rmsnorm_backward dw", compare(dwd.host(), dw), 1e-4);
  }
  // attention: tensor-core path (hd 64, 128) with GQA, MHA and MQA (an odd head count among them); fp32 path (hd 8, 40)
  struct AttCase {
    int NH, NKV, hd;
  };
  for (AttCase c : {AttCase{8, 2, 64}, AttCase{4, 4, 64}, AttCase{3, 1, 64}, AttCase{6, 1, 128}, AttCase{4, 2, 8}, AttCase{6, 3, 40}}) {
    const int QD = c.NH * c.hd, KD = c.NKV * c.hd;
    auto q = randn(r, (size_t)T * QD), k = randn(r, (size_t)T * KD), v = randn(r, (size_t)T * KD),
         dout = randn(r, (size_t)T * QD);
    Dev qd(K, q), kd(K, k), vd(K, v), dod(K, dout), od(K, (size_t)T * QD), ld(K, (size_t)c.NH * T),
        dqd(K, (size_t)T * QD), dkd(K, (size_t)T * KD), dvd(K, (size_t)T * KD);
    std::vector<float> o((size_t)T * QD), l((size_t)c.NH * T), dq((size_t)T * QD), dk((size_t)T * KD), dv((size_t)T * KD);
    const std::vector<float> poison((size_t)T * QD, NAN);  // every output element must be written
    K->from_host(od.p, poison.data(), od.n);
    K->from_host(dqd.p, poison.data(), dqd.n);
    K->from_host(dkd.p, poison.data(), dkd.n);
    K->from_host(dvd.p, poison.data(), dvd.n);
    K->attention_forward(od.p, ld.p, qd.p, kd.p, vd.p, starts.data(), S, T, c.NH, c.NKV, c.hd);
    cpu->attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), starts.data(), S, T, c.NH, c.NKV, c.hd);
    const std::string tag = " NH=" + std::to_string(c.NH) + " NKV=" + std::to_string(c.NKV) + " hd=" + std::to_string(c.hd);
    const double tol = (c.hd == 64 || c.hd == 128) ? TOL_ATT : TOL_FP32 * 10;
    report("attention_forward out" + tag, compare(od.host(), o), tol);
    report("attention_forward lse" + tag, compare(ld.host(), l), tol);
    {  // the training step's bf16 copy of out: from the same kernel (tensor cores) or converted after it
      Dev o2(K, (size_t)T * QD), o16(K, ((size_t)T * QD + 1) / 2);
      K->attention_forward16(o2.p, reinterpret_cast<uint16_t*>(o16.p), ld.p, qd.p, kd.p, vd.p, starts.data(), S, T,
                             c.NH, c.NKV, c.hd);
      const std::vector<float> of = o2.host(), packed = o16.host();
      std::vector<float> wide(of.size());
      for (size_t i = 0; i < of.size(); i++) {
        uint16_t h;
        std::memcpy(&h, reinterpret_cast<const char*>(packed.data()) + 2 * i, 2);
        const uint32_t u = (uint32_t)h << 16;
        std::memcpy(&wide[i], &u, 4);
      }
      report("attention_forward16 out16" + tag, compare(wide, of), 1.0 / 256);
    }
    K->attention_backward(dqd.p, dkd.p, dvd.p, dod.p, qd.p, kd.p, vd.p, od.p, ld.p, starts.data(), S, T, c.NH, c.NKV, c.hd);
    cpu->attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                            l.data(), starts.data(), S, T, c.NH, c.NKV, c.hd);
    report("attention_backward dq" + tag, compare(dqd.host(), dq), tol);
    report("attention_backward dk" + tag, compare(dkd.host(), dk), tol);
    report("attention_backward dv" + tag, compare(dvd.host(), dv), tol);
  }
  {  // swiglu
    const size_t n = 123457;
    auto g = randn(r, n, 3.f), u = randn(r, n), dout = randn(r, n);
    Dev gd(K, g), ud(K, u), dod(K, dout), od(K, n), dgd(K, n), dud(K, n);
    std::vector<float> o(n), dg(n), du(n);
    K->swiglu_forward(od.p, gd.p, ud.p, n);
    cpu->swiglu_forward(o.data(), g.data(), u.data(), n);
    report("swiglu_forward", compare(od.host(), o), TOL_FP32);
    K->swiglu_backward(dgd.p, dud.p, dod.p, gd.p, ud.p, n);
    cpu->swiglu_backward(dg.data(), du.data(), dout.data(), g.data(), u.data(), n);
    report("swiglu_backward dgate", compare(dgd.host(), dg), TOL_FP32);
    report("swiglu_backward dup", compare(dud.host(), du), TOL_FP32);
  }
  for (int V : {1000, 1001, 151936}) {  // fused log-softmax / entropy and its backward
    const int N = V > 100000 ? 9 : 37;
    auto z = randn(r, (size_t)N * V, 4.f), dlp = randn(r, N), dent = randn(r, N);
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 0 ? -1 : r.below(V);
    Dev zd(K, z), lpd(K, N), ed(K, N), dlpd(K, dlp), dentd(K, dent);
    std::vector<float> lp(N), e(N);
    K->logsoftmax_forward(zd.p, lpd.p, ed.p, tg.data(), N, V);
    cpu->logsoftmax_forward(z.data(), lp.data(), e.data(), tg.data(), N, V);
    const std::string tag = " V=" + std::to_string(V);
    // Both sides sum V fp32 terms in different orders; their rounding differences grow like sqrt(V).
    const double red = std::max(1.0, std::sqrt(V / 1000.0));
    report("logsoftmax_forward log-probs (all)" + tag, compare(zd.host(), z), TOL_FP32 * red);
    report("logsoftmax_forward logp[target]" + tag, compare(lpd.host(), lp), TOL_FP32 * red);
    report("logsoftmax_forward entropy" + tag, compare(ed.host(), e), TOL_FP32 * 5 * red);
    K->logsoftmax_backward(zd.p, dlpd.p, dentd.p, ed.p, tg.data(), N, V);
    cpu->logsoftmax_backward(z.data(), dlp.data(), dent.data(), e.data(), tg.data(), N, V);
    report("logsoftmax_backward dlogits" + tag, compare(zd.host(), z), TOL_FP32 * 5 * red);
  }
  {  // AdamW
    const size_t n = 300001;
    auto p = randn(r, n), g = randn(r, n), m = randn(r, n, 0.1f), v = randn(r, n);
    for (auto& x : v) x = x * x * 0.01f;
    Dev pd(K, p), gd(K, g), md(K, m), vd(K, v);
    for (int step = 1; step <= 3; step++) {
      const float b1 = 0.9f, b2 = 0.95f, bc1 = 1.f - std::pow(b1, step), bc2 = 1.f - std::pow(b2, step);
      K->adamw(pd.p, gd.p, md.p, vd.p, n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2);
      cpu->adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, b1, b2, 1e-8f, 0.1f, bc1, bc2);
    }
    report("adamw params (3 steps)", compare(pd.host(), p), TOL_FP32);
    report("adamw exp_avg", compare(md.host(), m), TOL_FP32);
    report("adamw exp_avg_sq", compare(vd.host(), v), TOL_FP32);
  }
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("CUDA error at the end of the kernel checks: %s\n", cudaGetErrorString(e));
    failures++;
  }
}

// ---- model-level helpers ----
ModelConfig make_config(int H, int L, int NH, int NKV, int I, int V, bool tied, bool bias, int maxpos = 4096) {
  ModelConfig c;
  c.hidden_size = H;
  c.num_hidden_layers = L;
  c.num_attention_heads = NH;
  c.num_key_value_heads = NKV;
  c.intermediate_size = I;
  c.vocab_size = V;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = maxpos;
  c.attention_bias = bias;
  return c;
}
std::string config_json(const ModelConfig& c) {
  char b[512];
  std::snprintf(b, sizeof b,
                "{\"hidden_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
                "\"intermediate_size\":%d,\"vocab_size\":%d,\"rope_theta\":%g,\"rms_norm_eps\":%g,"
                "\"tie_word_embeddings\":%s,\"max_position_embeddings\":%d,\"attention_bias\":%s}",
                c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                c.vocab_size, c.rope_theta, c.rms_norm_eps, c.tie_word_embeddings ? "true" : "false",
                c.max_position_embeddings, c.attention_bias ? "true" : "false");
  return b;
}

// A tiny safetensors writer (F32 / I32, little-endian): the format torch_ref.py reads with the safetensors package.
struct StWriter {
  struct E {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<char> bytes;
  };
  std::vector<E> es;
  std::map<std::string, std::string> meta;
  void f32(const std::string& n, std::vector<int64_t> shape, const float* p, size_t cnt) {
    es.push_back({n, "F32", shape, std::vector<char>((const char*)p, (const char*)(p + cnt))});
  }
  void i32(const std::string& n, std::vector<int64_t> shape, const int32_t* p, size_t cnt) {
    es.push_back({n, "I32", shape, std::vector<char>((const char*)p, (const char*)(p + cnt))});
  }
  static std::string esc(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o;
  }
  void write(const std::string& path) {
    std::string h = "{\"__metadata__\":{";
    bool first = true;
    for (auto& [k, v] : meta) {
      h += (first ? "" : ",") + std::string("\"") + esc(k) + "\":\"" + esc(v) + "\"";
      first = false;
    }
    h += "}";
    size_t off = 0;
    for (auto& e : es) {
      h += ",\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
      for (size_t i = 0; i < e.shape.size(); i++) h += (i ? "," : "") + std::to_string(e.shape[i]);
      h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + e.bytes.size()) + "]}";
      off += e.bytes.size();
    }
    h += "}";
    while (h.size() % 8) h += ' ';
    std::ofstream f(path, std::ios::binary);
    const uint64_t n = h.size();
    f.write((const char*)&n, 8);
    f.write(h.data(), (std::streamsize)h.size());
    for (auto& e : es) f.write(e.bytes.data(), (std::streamsize)e.bytes.size());
    if (!f) throw std::runtime_error("cannot write " + path);
  }
};

void dump_block(StWriter& w, const std::string& prefix, Model& m, BlockKind kind) {
  m.download(kind);
  const float* base = kind == BlockKind::Params ? m.params().get()
                      : kind == BlockKind::Grads ? m.grads().get()
                      : kind == BlockKind::ExpAvg ? m.adam_m().get()
                                                  : m.adam_v().get();
  for (const auto& t : m.tensors()) w.f32(prefix + t.name, t.shape, base + t.offset, t.numel);
}

struct Packed {
  std::vector<int32_t> tokens, starts, targets;
  std::vector<float> mask;
};
Packed pack(const std::vector<std::vector<int32_t>>& seqs) {
  Packed p;
  p.starts = {0};
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); i++) {
      p.tokens.push_back(s[i]);
      p.targets.push_back(i + 1 < s.size() ? s[i + 1] : -1);
      p.mask.push_back(i + 1 < s.size() ? 1.f : 0.f);
    }
    p.starts.push_back((int32_t)p.tokens.size());
  }
  return p;
}
Batch batch_of(const Packed& p) {
  Batch b;
  b.tokens = p.tokens.data();
  b.T = (int)p.tokens.size();
  b.seq_starts = p.starts.data();
  b.S = (int)p.starts.size() - 1;
  return b;
}

// The policy loss of the step check: PPO clip (0.2 / 0.28), KL k3 to a reference (0.05), entropy bonus 0.01, token mean.
// PolicyLossOptions has no defaults (native/src/losses.h): every field is set here.
PolicyLossOptions loss_options(double clip_low, double clip_high, double kl_coef, double entropy_coef) {
  PolicyLossOptions o;
  o.kind = PolicyLossKind::Ppo;
  o.clip_low = clip_low;
  o.clip_high = clip_high;
  o.dual_clip_c = 0;
  o.correction = CorrectionMode::Off;
  o.correction_level = CorrectionLevel::Token;
  o.iw_cap = 0;
  o.mask_low = 0;
  o.mask_high = 0;
  o.kl_coef = kl_coef;
  o.kl_type = KlType::K3;
  o.entropy_coef = entropy_coef;
  o.agg = Agg::TokenMean;
  o.scale = 1;
  return o;
}

PolicyLossOptions step_loss_options() { return loss_options(0.2, 0.28, 0.05, 0.01); }

// The one policy-loss step both the CUDA-vs-CPU check and the dump for torch_ref.py run: the model's shape, five
// sequences (lengths 1 to 300) and per-token advantages, behaviour and reference log-probs, seeded. The batch and
// the loss inputs point into its own vectors, so it is neither copied nor moved.
struct StepProblem {
  ModelConfig cfg = make_config(256, 2, 4, 2, 512, 1000, false, true);
  Packed p;
  std::vector<float> adv, behav, ref;
  Batch b;
  PolicyLossInputs pin;
  StepProblem() {
    Rng r(7);
    std::vector<std::vector<int32_t>> seqs;
    for (int L : {1, 70, 128, 300, 13}) {
      std::vector<int32_t> s(L);
      for (auto& x : s) x = r.below(cfg.vocab_size);
      seqs.push_back(s);
    }
    p = pack(seqs);
    b = batch_of(p);
    const double logV = std::log((double)cfg.vocab_size);
    for (size_t t = 0; t < p.tokens.size(); t++) {
      adv.push_back(r.normal());
      behav.push_back((float)(-logV + 0.5 * r.normal()));
      ref.push_back((float)(-logV + 0.5 * r.normal()));
    }
    pin.response_mask = p.mask.data();
    pin.advantages = adv.data();
    pin.behaviour = behav.data();
    pin.ref = ref.data();
  }
  StepProblem(const StepProblem&) = delete;
  StepProblem& operator=(const StepProblem&) = delete;
};

// Same model, same step on CPU and CUDA: log-probs, loss, every gradient tensor, the AdamW update.
void check_model() {
  std::printf("\n== model: one policy-loss step on CUDA vs CPU ==\n");
  const StepProblem sp;
  const ModelConfig& cfg = sp.cfg;
  const Packed& p = sp.p;
  const Batch& b = sp.b;
  const PolicyLossInputs& pin = sp.pin;
  Model cpu(cfg, 8, 0, Device::Cpu), gpu(cfg, 8, 0, Device::Cuda);
  cpu.init_random(11, 0.05f);
  gpu.init_random(11, 0.05f);
  const int T = b.T;
  std::vector<float> lc(T), ec(T), lg(T), eg(T);
  cpu.forward_logprobs(b, p.targets.data(), lc.data(), ec.data());
  gpu.forward_logprobs(b, p.targets.data(), lg.data(), eg.data());
  report("forward log-probs", compare(lg, lc), TOL_BF16);
  report("forward entropy", compare(eg, ec), TOL_BF16);
  PolicyLoss lcpu(pin, step_loss_options(), p.starts.data(), b.S, T), lgpu(pin, step_loss_options(), p.starts.data(), b.S, T);
  cpu.forward_backward(b, p.targets.data(), lcpu);
  gpu.forward_backward(b, p.targets.data(), lgpu);
  const double a = lgpu.metrics().loss, c = lcpu.metrics().loss;
  std::printf("loss: cuda %.6f cpu %.6f\n", a, c);
  report("policy loss", Cmp{std::fabs(a - c), std::fabs(a - c) / std::fabs(c), std::isfinite(a)}, TOL_BF16);
  gpu.download(BlockKind::Grads);
  double worst = 0;
  std::string worst_name;
  for (const auto& t : cpu.tensors()) {
    const Cmp g = compare(gpu.grads().get() + t.offset, cpu.grads().get() + t.offset, t.numel);
    if (g.rel > worst || !g.finite) worst = g.finite ? g.rel : INFINITY, worst_name = t.name;
    report("grad " + t.name, g, 5e-2);
  }
  std::printf("worst gradient: %s rel %.2e\n", worst_name.c_str(), worst);
  // AdamW on the same gradients (bf16 gradients differ by ~2%, and Adam's first step is close to lr * sign(g), so
  // comparing updates from different gradients would measure the gradients again).
  std::memcpy(cpu.grads().get(), gpu.grads().get(), cpu.num_parameters() * sizeof(float));
  AdamWParams ap;
  ap.lr = 1e-3f;
  ap.weight_decay = 0.1f;
  for (int s = 0; s < 2; s++) {
    cpu.adamw_step(ap);
    gpu.adamw_step(ap);
  }
  gpu.download(BlockKind::Params);
  gpu.download(BlockKind::ExpAvgSq);
  report("AdamW params after 2 steps on the same gradients",
         compare(gpu.params().get(), cpu.params().get(), cpu.num_parameters()), TOL_FP32);
  report("AdamW exp_avg_sq", compare(gpu.adam_v().get(), cpu.adam_v().get(), cpu.num_parameters()), TOL_FP32);
}

// One policy-loss step dumped for torch_ref.py.
void dump_step(const std::string& path) {
  const StepProblem sp;
  const ModelConfig& cfg = sp.cfg;
  const Packed& p = sp.p;
  const Batch& b = sp.b;
  const PolicyLossInputs& pin = sp.pin;
  const int T = b.T, V = cfg.vocab_size;
  StWriter w;
  w.meta["config"] = config_json(cfg);
  w.meta["loss"] = "{\"clip_low\":0.2,\"clip_high\":0.28,\"kl_coef\":0.05,\"kl_type\":\"k3\",\"entropy_coef\":0.01}";
  w.meta["adamw"] = "{\"lr\":0.001,\"beta1\":0.9,\"beta2\":0.999,\"eps\":1e-8,\"weight_decay\":0.1}";
  w.i32("tokens", {T}, p.tokens.data(), T);
  w.i32("seq_starts", {(int64_t)p.starts.size()}, p.starts.data(), p.starts.size());
  w.i32("targets", {T}, p.targets.data(), T);
  w.f32("mask", {T}, p.mask.data(), T);
  w.f32("advantages", {T}, sp.adv.data(), T);
  w.f32("behaviour", {T}, sp.behav.data(), T);
  w.f32("ref", {T}, sp.ref.data(), T);
  for (Device dev : {Device::Cuda, Device::Cpu}) {
    const std::string pre = dev == Device::Cuda ? "cuda." : "cpu.";
    Model m(cfg, 8, 0, dev);
    m.init_random(11, 0.05f);
    if (dev == Device::Cuda) dump_block(w, "param.", m, BlockKind::Params);
    std::vector<float> logits((size_t)T * V);
    m.forward_logits(b, logits.data());
    w.f32(pre + "logits", {T, V}, logits.data(), logits.size());
    PolicyLoss loss(pin, step_loss_options(), p.starts.data(), b.S, T);
    m.forward_backward(b, p.targets.data(), loss);
    const float lv = (float)loss.metrics().loss;
    w.f32(pre + "loss", {1}, &lv, 1);
    dump_block(w, pre + "grad.", m, BlockKind::Grads);
    AdamWParams ap;
    ap.lr = 1e-3f;
    ap.weight_decay = 0.1f;
    m.adamw_step(ap);
    dump_block(w, pre + "updated.", m, BlockKind::Params);
  }
  w.write(path);
  std::printf("step dump written to %s\n", path.c_str());
}

// A learnable synthetic language: each sequence follows x' = (a x + c) mod V with a per-sequence (a, c) from a small
// set, and one token in eight replaced by noise. Loss falls from ln V towards the noise floor.
std::vector<std::vector<int32_t>> synthetic_batch(Rng& r, int V, int tokens, int min_len, int max_len) {
  std::vector<std::vector<int32_t>> seqs;
  int total = 0;
  while (total < tokens) {
    int L = min_len + r.below(max_len - min_len + 1);
    L = std::min(L, tokens - total);
    if (L < 2) L = tokens - total;
    const int a = 1 + 2 * r.below(4), c = 1 + r.below(7);
    std::vector<int32_t> s(L);
    s[0] = r.below(V);
    for (int i = 1; i < L; i++) s[i] = r.below(8) == 0 ? r.below(V) : (a * s[i - 1] + c) % V;
    seqs.push_back(s);
    total += L;
  }
  return seqs;
}

void dump_train(const std::string& path, int steps) {
  const ModelConfig cfg = make_config(256, 4, 4, 2, 688, 512, true, false);
  const int tokens = 4096;
  StWriter w;
  w.meta["config"] = config_json(cfg);
  w.meta["train"] = "{\"lr\":0.002,\"beta1\":0.9,\"beta2\":0.95,\"eps\":1e-8,\"weight_decay\":0.01,\"clip\":1.0,\"steps\":" +
                    std::to_string(steps) + "}";
  Model m(cfg, 8, 0, Device::Cuda);
  m.init_random(5, 0.02f);
  dump_block(w, "param.", m, BlockKind::Params);
  Rng r(99);
  std::vector<float> losses, norms;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; s++) {
    const Packed p = pack(synthetic_batch(r, cfg.vocab_size, tokens, 16, 512));
    const Batch b = batch_of(p);
    w.i32("tokens." + std::to_string(s), {b.T}, p.tokens.data(), b.T);
    w.i32("seq_starts." + std::to_string(s), {(int64_t)p.starts.size()}, p.starts.data(), p.starts.size());
    m.zero_grad();
    CrossEntropyLoss loss(p.mask.data(), p.starts.data(), b.S, b.T, 1.f);
    m.forward_backward(b, p.targets.data(), loss);
    const double n = m.grad_norm();
    if (n > 1.0) m.scale_grads((float)(1.0 / (n + 1e-6)));
    AdamWParams ap;
    ap.lr = 2e-3f;
    ap.beta1 = 0.9f;
    ap.beta2 = 0.95f;
    ap.eps = 1e-8f;
    ap.weight_decay = 0.01f;
    m.adamw_step(ap);
    losses.push_back((float)loss.loss());
    norms.push_back((float)n);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  w.f32("losses", {steps}, losses.data(), steps);
  w.f32("grad_norms", {steps}, norms.data(), steps);
  w.write(path);
  std::printf("train: %d steps of %d tokens in %.2f s; loss %.4f -> %.4f; dump %s\n", steps, tokens, secs, losses.front(),
              losses.back(), path.c_str());
}

// ---- benchmark ----
struct BenchModel {
  const char* name;
  ModelConfig cfg;
  int seqs, len;
};
std::vector<BenchModel> bench_models() {
  return {
      {"20M", make_config(384, 8, 6, 2, 1024, 16384, true, false), 16, 1024},
      {"120M", make_config(768, 12, 12, 4, 2560, 32000, true, false), 16, 1024},
      // Qwen2.5-0.5B's shape: GQA 14/2, q/k/v bias, 152k vocabulary, tied
      {"500M", make_config(896, 24, 14, 2, 4864, 151936, true, true), 8, 1024},
  };
}

// Model FLOPs of a training step: 6 per matmul weight per token + causal attention (QK^T and PV, forward x3).
double step_flops(const ModelConfig& c, int seqs, int len) {
  const double H = c.hidden_size, hd = H / c.num_attention_heads, kv = c.num_key_value_heads * hd;
  const double per_layer = H * H * 2 + H * kv * 2 + 3 * H * c.intermediate_size;
  const double matmul_params = per_layer * c.num_hidden_layers + (double)c.vocab_size * H;
  const double T = (double)seqs * len, pairs = (double)seqs * len * (len + 1) / 2;
  return 6 * matmul_params * T + 3 * 4 * H * pairs * c.num_hidden_layers;
}

size_t used_bytes() {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return t - f;
}

// The benchmarks' synthetic policy-loss batch: seqs sequences of len tokens, token g = first + t of a global
// numbering (a data-parallel rank takes first = rank x T), so every implementation and rank builds the same data.
struct BenchBatch {
  std::vector<int32_t> tokens, targets, starts;
  std::vector<float> mask, adv, behav;
  Batch b;
  PolicyLossInputs pin;
  BenchBatch(int V, int seqs, int len, int64_t first = 0)
      : tokens(seqs * len), targets(seqs * len), starts(seqs + 1), mask(seqs * len, 1.f), adv(seqs * len), behav(seqs * len) {
    const int T = seqs * len;
    for (int t = 0; t < T; t++) {
      const int64_t g = first + t;
      tokens[t] = (int32_t)((g * 7919) % V);
      targets[t] = (int32_t)((g * 104729 + 3) % V);
      adv[t] = (float)((g % 13) - 6) / 6.f;
      behav[t] = (float)(-std::log((double)V) + ((g % 5) - 2) * 0.05);
    }
    for (int q = 0; q <= seqs; q++) starts[q] = q * len;
    b.tokens = tokens.data();
    b.T = T;
    b.seq_starts = starts.data();
    b.S = seqs;
    pin.response_mask = mask.data();
    pin.advantages = adv.data();
    pin.behaviour = behav.data();
  }
  BenchBatch(const BenchBatch&) = delete;
  BenchBatch& operator=(const BenchBatch&) = delete;
};

void bench(const std::vector<std::string>& names, int iters) {
  std::printf("\n== benchmark: policy-loss training step (forward, backward, clip, AdamW) on CUDA ==\n");
  cudaFree(nullptr);
  std::printf("%-6s %-11s %-8s %-9s %-10s %-7s %-11s\n", "model", "params", "tokens", "step ms", "tokens/s", "MFU %",
              "peak MiB");
  for (const auto& bm : bench_models()) {
    if (!names.empty() && std::find(names.begin(), names.end(), bm.name) == names.end()) continue;
    const size_t base = used_bytes();
    size_t peak = 0;
    const ModelConfig& cfg = bm.cfg;
    const int T = bm.seqs * bm.len;
    BenchBatch data(cfg.vocab_size, bm.seqs, bm.len);
    const Batch& b = data.b;
    const PolicyLossOptions opt = loss_options(0.2, 0.28, 0, 1e-3);
    Model m(cfg, 8, 0, Device::Cuda);
    m.init_random(1, 0.02f);
    AdamWParams ap;
    ap.lr = 1e-4f;
    ap.weight_decay = 0.01f;
    double last_loss = 0;
    auto step = [&]() {
      m.zero_grad();
      PolicyLoss loss(data.pin, opt, data.starts.data(), b.S, T);
      m.forward_backward(b, data.targets.data(), loss);
      const double n = m.grad_norm();
      if (n > 1.0) m.scale_grads((float)(1.0 / (n + 1e-6)));
      m.adamw_step(ap);
      last_loss = loss.metrics().loss;
    };
    step();
    step();
    cudaDeviceSynchronize();
    peak = std::max(peak, used_bytes() - base);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) step();
    cudaDeviceSynchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    peak = std::max(peak, used_bytes() - base);
    const double flops = step_flops(cfg, bm.seqs, bm.len), mfu = flops / s / 989e12 * 100;
    std::printf("%-6s %-11zu %-8d %-9.1f %-10.0f %-7.1f %-11.0f loss %.4f\n", bm.name, m.num_parameters(), T, s * 1e3,
                T / s, mfu, peak / 1048576.0, last_loss);
    std::printf("BENCH {\"impl\":\"rlstream-cuda\",\"model\":\"%s\",\"params\":%zu,\"tokens\":%d,\"step_ms\":%.2f,"
                "\"tokens_per_s\":%.0f,\"mfu\":%.2f,\"peak_mib\":%.0f}\n",
                bm.name, m.num_parameters(), T, s * 1e3, T / s, mfu, peak / 1048576.0);
    if (std::getenv("RLSTREAM_CUDA_SYNC")) {
      m.reset_profile();
      step();
      const double* pr = m.profile();
      const char* names[] = {"matmul", "attention", "elementwise", "logits", "optimizer"};
      double tot = 0;
      for (int i = 0; i < 5; i++) tot += pr[i];
      std::printf("  synced profile of one step (%.1f ms in kernels):", tot * 1e3);
      for (int i = 0; i < 5; i++) std::printf(" %s %.1f ms", names[i], pr[i] * 1e3);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
}

// ---- LoRA ----
const unsigned ALL_TARGETS = (1u << LoraTargets) - 1;

// One cross-entropy step of a model with adapters on every projection (B set to random values too, so that A's
// gradient is not zero), on CUDA and on the CPU, with everything peft_ref.py needs to redo it with PEFT.
void dump_lora(const std::string& path) {
  const ModelConfig cfg = make_config(256, 2, 4, 2, 512, 1000, false, true);
  LoraConfig lc;
  lc.rank = 8;
  lc.alpha = 16;
  lc.targets = ALL_TARGETS;
  const int S = 4, len = 64;
  Rng r(7);
  std::vector<std::vector<int32_t>> seqs(S, std::vector<int32_t>(len));
  for (auto& q : seqs)
    for (auto& t : q) t = (int32_t)(r.next() % (uint64_t)cfg.vocab_size);
  const Packed p = pack(seqs);
  const Batch b = batch_of(p);
  StWriter w;
  w.meta["config"] = config_json(cfg);
  w.meta["lora"] = "{\"r\":8,\"lora_alpha\":16}";
  w.i32("tokens", {b.T}, p.tokens.data(), b.T);
  w.i32("targets", {b.T}, p.targets.data(), b.T);
  w.f32("mask", {b.T}, p.mask.data(), b.T);
  for (Device dev : {Device::Cuda, Device::Cpu}) {
    const std::string pre = dev == Device::Cuda ? "cuda." : "cpu.";
    Model m(cfg, 8, 0, dev, true, lc);
    m.init_random(11, 0.05f);
    m.init_lora(5);
    Rng rb(9);
    float* P = m.params().get();
    for (const auto& t : m.tensors())
      if (t.name.find(".lora_B.") != std::string::npos)
        for (size_t i = 0; i < t.numel; i++) P[t.offset + i] = (float)(rb.uni() - 0.5) * 0.1f;
    m.upload(BlockKind::Params);
    if (dev == Device::Cuda) dump_block(w, "param.", m, BlockKind::Params);
    m.zero_grad();
    CrossEntropyLoss loss(p.mask.data(), p.starts.data(), b.S, b.T, 1.f);
    m.forward_backward(b, p.targets.data(), loss);
    m.download(BlockKind::Grads);
    for (const auto& t : m.tensors())
      if (m.trained(t)) w.f32(pre + "grad." + t.name, t.shape, m.grads().get() + (t.offset - m.train_offset()), t.numel);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", loss.loss());
    w.meta[pre + "loss"] = buf;
  }
  w.write(path);
  std::printf("lora-dump: %s\n", path.c_str());
}

struct LoraBenchModel {
  const char* name;
  ModelConfig cfg;
  int seqs, len;
};
std::vector<LoraBenchModel> lora_bench_models() {
  auto qwen = [](int H, int L, int NH, int NKV, int I, int V, bool tied) {
    ModelConfig c = make_config(H, L, NH, NKV, I, V, tied, true, 32768);
    c.rope_theta = 1e6;
    return c;
  };
  return {
      {"1.5B", qwen(1536, 28, 12, 2, 8960, 151936, true), 8, 1024},  // Qwen2.5-1.5B's shape
      {"3B", qwen(2048, 36, 16, 2, 11008, 151936, true), 8, 1024},   // Qwen2.5-3B's
      {"7B", qwen(3584, 28, 28, 4, 18944, 152064, false), 1, 32768},  // Qwen2.5-7B's, one 32k sequence
  };
}

// Weights without the host-side Box-Muller of init_random (minutes at 7B): a hashed uniform in ±0.02, norms 1,
// biases 0, adapters as init_lora makes them. Throughput does not depend on the values.
void fast_init(Model& m) {
  float* P = m.params().get();
  const auto& ts = m.tensors();
#pragma omp parallel for schedule(dynamic)
  for (size_t k = 0; k < ts.size(); k++) {
    const TensorInfo& t = ts[k];
    if (m.lora().rank > 0 && m.trained(t)) continue;  // adapters: init_lora below
    const bool norm = t.name.find("norm") != std::string::npos, bias = t.name.find(".bias") != std::string::npos;
    for (size_t i = 0; i < t.numel; i++) {
      uint64_t z = (t.offset + i) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
      P[t.offset + i] = norm ? 1.f : bias ? 0.f : (float)((double)(z >> 11) / 9007199254740992.0 - 0.5) * 0.04f;
    }
  }
  if (m.lora().rank > 0) m.init_lora(3);  // (uploads the whole block)
  else m.upload(BlockKind::Params);
}

void lora_bench(const std::vector<std::string>& names, int iters, bool recompute, int rank, int seqs_o, int len_o) {
  std::printf("\n== benchmark: LoRA training step (rank %d, all 7 projections; cross-entropy, clip, AdamW) on CUDA, "
              "recompute %s ==\n", rank, recompute ? "layer" : "none");
  cudaFree(nullptr);
  for (const auto& bm : lora_bench_models()) {
    if (!names.empty() && std::find(names.begin(), names.end(), bm.name) == names.end()) continue;
    const int seqs = seqs_o > 0 ? seqs_o : bm.seqs, len = len_o > 0 ? len_o : bm.len;
    const size_t base = used_bytes();
    const ModelConfig& cfg = bm.cfg;
    const int T = seqs * len, V = cfg.vocab_size;
    std::vector<int32_t> tokens(T), targets(T), starts(seqs + 1);
    std::vector<float> mask(T, 1.f);
    for (int t = 0; t < T; t++) {
      tokens[t] = (int32_t)(((int64_t)t * 7919) % V);
      targets[t] = (int32_t)(((int64_t)t * 104729 + 3) % V);
    }
    for (int s = 0; s <= seqs; s++) starts[s] = s * len;
    Batch b;
    b.tokens = tokens.data();
    b.T = T;
    b.seq_starts = starts.data();
    b.S = seqs;
    LoraConfig lc;
    lc.rank = rank;
    lc.alpha = 2.f * rank;
    lc.targets = ALL_TARGETS;
    try {
      Model m(cfg, 16, 0, Device::Cuda, true, lc);
      m.set_recompute(recompute);
      const auto i0 = std::chrono::steady_clock::now();
      fast_init(m);
      const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - i0).count();
      AdamWParams ap;
      ap.lr = 1e-4f;
      double last_loss = 0;
      auto step = [&]() {
        m.zero_grad();
        CrossEntropyLoss loss(mask.data(), starts.data(), b.S, T, 1.f);
        m.forward_backward(b, targets.data(), loss);
        const double n = m.grad_norm();
        if (n > 1.0) m.scale_grads((float)(1.0 / (n + 1e-6)));
        m.adamw_step(ap);
        last_loss = loss.loss();
      };
      step();
      cudaDeviceSynchronize();
      size_t peak = used_bytes() - base;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; i++) step();
      cudaDeviceSynchronize();
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      peak = std::max(peak, used_bytes() - base);
      size_t base_params = 0;
      for (const auto& t : m.tensors()) base_params += m.trained(t) ? 0 : t.numel;
      std::printf("%-5s %zu base + %zu adapter params, %d x %d tokens: %.1f ms/step, %.0f tokens/s, device memory "
                  "in use %.0f MiB (init %.1f s), loss %.4f\n", bm.name, base_params, m.train_numel(), seqs, len,
                  sec * 1e3, T / sec, peak / 1048576.0, init_s, last_loss);
      std::printf("BENCH {\"impl\":\"rlstream-cuda\",\"model\":\"%s\",\"rank\":%d,\"recompute\":\"%s\",\"seqs\":%d,"
                  "\"len\":%d,\"tokens\":%d,\"step_ms\":%.1f,\"tokens_per_s\":%.0f,\"device_used_mib\":%.0f,"
                  "\"adapter_params\":%zu}\n", bm.name, rank, recompute ? "layer" : "none", seqs, len, T, sec * 1e3,
                  T / sec, peak / 1048576.0, m.train_numel());
    } catch (const std::exception& e) {
      std::printf("%-5s %d x %d tokens: FAILED: %s\n", bm.name, seqs, len, e.what());
      std::printf("BENCH {\"impl\":\"rlstream-cuda\",\"model\":\"%s\",\"seqs\":%d,\"len\":%d,\"error\":\"%s\"}\n",
                  bm.name, seqs, len, StWriter::esc(e.what()).c_str());
    }
    std::fflush(stdout);
  }
}


// ---- data-parallel (issue #53) ----
// One rank of a data-parallel training step over NCCL, one process per GPU (test/gpu/dp.sh starts them with
// CUDA_VISIBLE_DEVICES=R, so each sees its GPU as device 0). Every rank holds the whole model, trains its own
// seqs x len tokens (rank R's share of one global batch: token g = R*T + t), and then, on the device and queued on
// the model's stream (no host copies):
//   DDP:    the gradients all-reduced in buckets of --bucket-mib, last layers first; the norm over the whole sum;
//           AdamW over the whole block on every rank.
//   ZeRO-1: the gradients reduce-scattered so rank R holds the sum of its slice; the norm from the slices' sums of
//           squares (one scalar all-reduce); AdamW on the slice alone, with moments for it alone
//           (Model::set_optimizer_shard); the parameters all-gathered.
// The loss of each rank is its token mean; with equal token counts per rank the mean of the ranks' gradients
// (1/N of the sum) is the gradient of the global token mean, which is what one GPU training the whole batch takes.
struct DpArgs {
  std::string shape = "1.5B", id_file, dump;
  int rank = 0, ranks = 1, iters = 10, seqs = 8, len = 1024, check = 0;
  bool zero1 = false, broadcast = false, recompute = false;
  double bucket_mib = 25;
};

std::vector<uint8_t> dp_unique_id(const DpArgs& a) {
  std::vector<uint8_t> id(128);
  if (a.rank == 0) {
    nccl_unique_id(id.data());
    const std::string tmp = a.id_file + ".tmp";
    std::ofstream(tmp, std::ios::binary).write((const char*)id.data(), 128);
    std::rename(tmp.c_str(), a.id_file.c_str());
    return id;
  }
  for (int i = 0; i < 1200; i++) {  // two minutes for rank 0 to start
    std::ifstream f(a.id_file, std::ios::binary);
    if (f && f.read((char*)id.data(), 128) && f.gcount() == 128) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  invalid("rank " + std::to_string(a.rank) + ": no NCCL id in " + a.id_file + " after 120 s");
}

uint64_t fnv(const float* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const uint8_t* b = reinterpret_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

void data_parallel(const DpArgs& a) {
  cudaSetDevice(0);
  cudaFree(nullptr);
  const auto models = lora_bench_models();
  auto it = std::find_if(models.begin(), models.end(), [&](const LoraBenchModel& m) { return a.shape == m.name; });
  if (it == models.end()) invalid("dp: no shape " + a.shape + " (1.5B, 3B, 7B)");
  const ModelConfig& cfg = it->cfg;
  const int N = a.ranks, R = a.rank, T = a.seqs * a.len, V = cfg.vocab_size;
  const size_t base = used_bytes();
  const auto id = dp_unique_id(a);
  const int comm = nccl_comm_init(id.data(), N, R, 0);

  BenchBatch data(V, a.seqs, a.len, (int64_t)R * T);
  const Batch& b = data.b;
  const PolicyLossOptions opt = loss_options(0.2, 0.28, 0, 1e-3);

  Model m(cfg, 8, 0, Device::Cuda);
  m.set_recompute(a.recompute);
  fast_init(m);
  const size_t n = m.train_numel(), chunk = n / (size_t)N, tail = n - chunk * (size_t)N;
  const size_t mine = (size_t)R * chunk, mine_n = chunk + (R == N - 1 ? tail : 0);
  if (a.zero1) m.set_optimizer_shard(mine, mine_n);
  float* G = m.block_data(BlockKind::Grads);
  float* P = m.block_data(BlockKind::Params);
  void* q = m.queue();
  AdamWParams ap;
  ap.lr = 1e-4f;
  ap.weight_decay = 0.01f;
  const size_t bucket = std::max<size_t>(1, (size_t)(a.bucket_mib * 1048576.0 / sizeof(float)));
  cudaEvent_t c0, c1;
  cudaEventCreate(&c0);
  cudaEventCreate(&c1);
  double comm_ms = 0, last_loss = 0, last_norm = 0;

  auto step = [&]() {
    m.zero_grad();
    PolicyLoss loss(data.pin, opt, data.starts.data(), b.S, T);
    m.forward_backward(b, data.targets.data(), loss);
    last_loss = loss.metrics().loss;
    cudaEventRecord(c0, (cudaStream_t)q);
    double ss = 0;
    if (!a.zero1) {
      for (size_t end = n; end > 0;) {
        const size_t beg = end > bucket ? end - bucket : 0;
        if (N > 1) nccl_run_device(comm, NcclOp::AllReduce, NcclType::F32, G + beg, end - beg, G + beg, end - beg, 0, q);
        end = beg;
      }
      cudaEventRecord(c1, (cudaStream_t)q);
      ss = m.grad_sum_squares(0, n);
    } else {
      if (N > 1) {
        nccl_run_device(comm, NcclOp::ReduceScatter, NcclType::F32, G, chunk * N, G + mine, chunk, 0, q);
        if (tail) nccl_run_device(comm, NcclOp::AllReduce, NcclType::F32, G + chunk * N, tail, G + chunk * N, tail, 0, q);
      }
      cudaEventRecord(c1, (cudaStream_t)q);
      float part = (float)m.grad_sum_squares(mine, mine_n);
      if (N > 1) nccl_run(comm, NcclOp::AllReduce, NcclType::F32, &part, 1, &part, 1, 0);
      ss = part;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, c0, c1);
    comm_ms += ms;
    // the mean gradient is the sum / N; clip its norm to 1
    const double norm = std::sqrt(ss) / N;
    last_norm = norm;
    const float scale = (float)((1.0 / N) * (norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0));
    if (a.zero1) m.scale_grads(scale, mine, mine_n);
    else m.scale_grads(scale);
    m.adamw_step(ap);
    if (a.zero1 && N > 1) {
      cudaEventRecord(c0, (cudaStream_t)q);
      const size_t off = m.train_offset();
      nccl_run_device(comm, NcclOp::AllGather, NcclType::F32, P + off + mine, chunk, P + off, chunk * N, 0, q);
      if (tail) nccl_run_device(comm, NcclOp::Broadcast, NcclType::F32, P + off + chunk * N, tail, P + off + chunk * N, tail, N - 1, q);
      m.params_written(off, n);
      cudaEventRecord(c1, (cudaStream_t)q);
      cudaEventSynchronize(c1);
      cudaEventElapsedTime(&ms, c0, c1);
      comm_ms += ms;
    }
  };

  if (a.check > 0) {
    for (int i = 0; i < a.check; i++) step();
    cudaDeviceSynchronize();
    m.download(BlockKind::Params);
    const float* hp = m.params().get();
    std::printf("DPCHECK {\"rank\":%d,\"ranks\":%d,\"zero1\":%s,\"steps\":%d,\"params_fnv\":\"%016llx\",\"loss\":%.6f,\"grad_norm\":%.6f}\n",
                R, N, a.zero1 ? "true" : "false", a.check, (unsigned long long)fnv(hp, m.num_parameters()), last_loss, last_norm);
    if (!a.dump.empty() && R == 0) {
      std::vector<float> sample;
      for (size_t i = 0; i < m.num_parameters(); i += 1009) sample.push_back(hp[i]);
      std::ofstream(a.dump, std::ios::binary).write((const char*)sample.data(), sample.size() * sizeof(float));
    }
    nccl_comm_destroy(comm, false);
    return;
  }
  step();
  step();
  cudaDeviceSynchronize();
  comm_ms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; i++) step();
  cudaDeviceSynchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.iters;
  const double peak = (double)(used_bytes() - base);
  const double mfu = step_flops(cfg, a.seqs, a.len) / s / 989e12 * 100;
  std::printf("BENCH {\"impl\":\"rlstream-%s%s\",\"model\":\"%s\",\"ranks\":%d,\"rank\":%d,\"params\":%zu,\"tokens_per_rank\":%d,"
              "\"step_ms\":%.2f,\"comm_ms\":%.2f,\"tokens_per_s\":%.0f,\"mfu_per_gpu\":%.2f,\"peak_mib\":%.0f,\"loss\":%.4f}\n",
              a.zero1 ? "zero1" : "ddp", a.recompute ? "-recompute" : "", a.shape.c_str(), N, R, m.num_parameters(), T, s * 1e3, comm_ms / a.iters,
              (double)N * T / s, mfu, peak / 1048576.0, last_loss);
  std::fflush(stdout);

  if (a.broadcast && N > 1) {
    // A new version's weights from rank 0 to the others: NCCL broadcast into the block in place, against the file a
    // rank writes and the others read (what PolicyVersion names today): download, write, read, upload.
    double bc = 1e9;
    for (int i = 0; i < 3; i++) {
      cudaDeviceSynchronize();
      float meet = 0;  // every rank here before the clock starts
      nccl_run(comm, NcclOp::AllReduce, NcclType::F32, &meet, 1, &meet, 1, 0);
      const auto b0 = std::chrono::steady_clock::now();
      nccl_run_device(comm, NcclOp::Broadcast, NcclType::F32, P, m.num_parameters(), P, m.num_parameters(), 0, q);
      m.params_written(0, m.num_parameters());
      cudaStreamSynchronize((cudaStream_t)q);
      bc = std::min(bc, std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count());
    }
    double wr = 0, rd = 0;
    const std::string path = "/tmp/rlstream-dp-weights.bin";
    if (R == 0) {
      const auto w0 = std::chrono::steady_clock::now();
      m.download(BlockKind::Params);
      std::ofstream f(path, std::ios::binary);
      f.write((const char*)m.params().get(), m.num_parameters() * sizeof(float));
      f.close();
      wr = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    }
    float done = 0;
    nccl_run(comm, NcclOp::AllReduce, NcclType::F32, &done, 1, &done, 1, 0);  // rank 0's file is written
    if (R == 1) {
      const auto r0 = std::chrono::steady_clock::now();
      std::ifstream f(path, std::ios::binary);
      f.read((char*)m.params().get(), m.num_parameters() * sizeof(float));
      m.upload(BlockKind::Params);
      cudaDeviceSynchronize();
      rd = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    }
    std::printf("BCAST {\"model\":\"%s\",\"rank\":%d,\"bytes\":%zu,\"nccl_broadcast_ms\":%.1f,\"file_write_ms\":%.1f,\"file_read_upload_ms\":%.1f}\n",
                a.shape.c_str(), R, m.num_parameters() * sizeof(float), bc * 1e3, wr * 1e3, rd * 1e3);
    if (R == 0) std::remove(path.c_str());
  }
  nccl_comm_destroy(comm, false);
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "kernels";
  try {
    if (cuda_device_count() == 0) {
      std::printf("no CUDA GPU: nothing to check\n");
      return 2;
    }
    if (mode == "kernels") check_kernels();
    else if (mode == "model") check_model();
    else if (mode == "step") dump_step(argc > 2 ? argv[2] : "step.safetensors");
    else if (mode == "train") dump_train(argc > 2 ? argv[2] : "train.safetensors", argc > 3 ? std::atoi(argv[3]) : 200);
    else if (mode == "bench") {
      std::vector<std::string> names;
      int iters = 10;
      for (int i = 2; i < argc; i++) {
        if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
        else names.push_back(argv[i]);
      }
      bench(names, iters);
    } else if (mode == "lora-dump") {
      dump_lora(argc > 2 ? argv[2] : "lora.safetensors");
    } else if (mode == "dp") {
      DpArgs a;
      if (argc > 2) a.shape = argv[2];
      for (int i = 3; i < argc; i++) {
        const std::string o = argv[i];
        auto val = [&](const char* k) { return o.rfind(k, 0) == 0 ? o.substr(std::strlen(k)) : std::string(); };
        if (!val("--rank=").empty()) a.rank = std::stoi(val("--rank="));
        else if (!val("--ranks=").empty()) a.ranks = std::stoi(val("--ranks="));
        else if (!val("--id=").empty()) a.id_file = val("--id=");
        else if (!val("--iters=").empty()) a.iters = std::stoi(val("--iters="));
        else if (!val("--seqs=").empty()) a.seqs = std::stoi(val("--seqs="));
        else if (!val("--len=").empty()) a.len = std::stoi(val("--len="));
        else if (!val("--bucket-mib=").empty()) a.bucket_mib = std::stod(val("--bucket-mib="));
        else if (!val("--check=").empty()) a.check = std::stoi(val("--check="));
        else if (!val("--dump=").empty()) a.dump = val("--dump=");
        else if (o == "--zero1") a.zero1 = true;
        else if (o == "--broadcast") a.broadcast = true;
        else if (o == "--recompute") a.recompute = true;
        else invalid("dp: unknown option " + o);
      }
      if (a.id_file.empty()) invalid("dp: --id=<file> is needed (rank 0 writes the NCCL id there)");
      data_parallel(a);
    } else if (mode == "lora-bench") {
      std::vector<std::string> names;
      int iters = 3, rank = 16, seqs = 0, len = 0;
      bool recompute = false;
      for (int i = 2; i < argc; i++) {
        if (std::strncmp(argv[i], "--iters=", 8) == 0) iters = std::atoi(argv[i] + 8);
        else if (std::strncmp(argv[i], "--rank=", 7) == 0) rank = std::atoi(argv[i] + 7);
        else if (std::strncmp(argv[i], "--seqs=", 7) == 0) seqs = std::atoi(argv[i] + 7);
        else if (std::strncmp(argv[i], "--len=", 6) == 0) len = std::atoi(argv[i] + 6);
        else if (std::strcmp(argv[i], "--recompute") == 0) recompute = true;
        else names.push_back(argv[i]);
      }
      lora_bench(names, iters, recompute, rank, seqs, len);
    } else {
      std::printf("usage: driver kernels|model|step <file>|train <file> <steps>|bench [20M 120M 500M] [--iters=N]\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  if (failures) std::printf("\n%d check(s) FAILED\n", failures);
  else if (mode == "kernels" || mode == "model") std::printf("\nall checks passed\n");
  return failures ? 1 : 0;
}
