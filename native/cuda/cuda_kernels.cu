// The CUDA implementation of the kernel interface (src/device.h): activations, master weights, gradients and AdamW
// state in device memory; matrix products through cuBLAS on bf16 operands with fp32 accumulation (the recipe of
// autocast training); softmax, norms, rotary, SwiGLU and the optimizer compute in fp32. The plain ops keep fp32
// activations; the fused training ops keep in bf16 what autocast keeps in bf16 (products' operands, gate|up, the
// logits, some input gradients). Every runtime call and every launch is checked (check.cuh). Validated kernel by
// kernel against cpu_kernels.cpp (test/gpu/driver.cpp) and step by step against PyTorch (test/gpu/torch_ref.py).
// This file holds the object's memory, staging and cuBLAS products; the kernels live by op family in the files
// ops.cuh lists, the bf16 weight copies in weight_cache.cu and the graph capture in graphs.cu.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "../src/device.h"
#include "attention.cuh"
#include "check.cuh"
#include "common.cuh"
#include "graphs.cuh"
#include "ops.cuh"
#include "weight_cache.cuh"

namespace rls {

namespace {

using cuda::bf16;
using cuda::Scratch;

// Whether a switch of the environment is set to `value` (RLSTREAM_CUDA_FUSED=0, RLSTREAM_CUDA_SYNC=1 and the like).
bool env_is(const char* name, char value) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == value;
}
bool env_off(const char* name) { return env_is(name, '0'); }

// Host int arrays staged to the device, re-sent only when their contents change (tokens and seq_starts are used by
// several kernels of one step).
struct IntStage {
  Scratch dev;
  std::vector<int32_t> last;
  const int* put(const int32_t* host, size_t n) {
    if (last.size() == n && std::memcmp(last.data(), host, n * sizeof(int32_t)) == 0) return (const int*)dev.p;
    int* d = (int*)dev.get(std::max<size_t>(n, 1) * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpy(d, host, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    last.assign(host, host + n);
    return d;
  }
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      invalid("device 'cuda': no CUDA GPU is usable on this machine");
    }
    CUDA_CHECK(cudaSetDevice(0));
    CUBLAS_CHECK(cublasCreate(&blas_));
    // cuBLAS on Hopper wants a workspace of 32 MiB for its fastest kernels.
    CUBLAS_CHECK(cublasSetWorkspace(blas_, ws_.get(32u << 20), 32u << 20));
    CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    for (Scratch* s : {&ws_, &ss_, &act_a_, &act_b_, &inv_, &att_, &colp_, &invt_, &samp_, &shadow_, &att_part_, &att_cnt_, &tokens_.dev,
                       &pos_.dev, &seqs_.dev, &targets_.dev, &slot_.dev})
      s->gen = &gen_;
  }
  ~CudaKernels() override {
    graphs_.clear();
    weights_.clear();
    if (blas_) cublasDestroy(blas_);
  }
  const char* name() const override { return "cuda"; }
  void set_threads(int) override {}
  bool host_visible() const override { return false; }
  void* queue() const override { return stream_; }
  void written(float* p, size_t n) override { weights_.evict(p, n); }

  float* alloc(size_t n) override {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 255) / 256 * 256);
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t freeb = 0, total = 0;
      cudaMemGetInfo(&freeb, &total);
      invalid("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory (" +
              std::to_string(freeb >> 20) + " MiB free of " + std::to_string(total >> 20) + "): " + cudaGetErrorString(e));
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes));
    sizes_[static_cast<float*>(p)] = n;
    return static_cast<float*>(p);
  }
  void release(float* p) override {
    ++gen_;  // graphs may have captured this address
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      weights_.evict(p, it->second, true);
      sizes_.erase(it);
    }
    cudaFree(p);
  }
  void zero(float* p, size_t n) override {
    weights_.evict(p, n);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  }
  void copy(float* dst, const float* src, size_t n) override {
    weights_.evict(dst, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void to_host(float* host_dst, const float* src, size_t n) override {
    CUDA_CHECK(cudaMemcpy(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  void from_host(float* dst, const float* host_src, size_t n) override {
    weights_.evict(dst, n);
    CUDA_CHECK(cudaMemcpy(dst, host_src, n * sizeof(float), cudaMemcpyHostToDevice));
  }
  void add_inplace(float* y, const float* x, size_t n) override {
    weights_.evict(y, n);
    cuda::add(y, x, n, stream_);
  }
  void dropout(float* out, const float* x, size_t n, float p, uint64_t seed) override {
    weights_.evict(out, n);
    cuda::dropout(out, x, n, p, seed, stream_);
  }
  void scale(float* x, size_t n, float s) override {
    weights_.evict(x, n);
    cuda::scale(x, n, s, stream_);
  }
  double sum_squares(const float* x, size_t n) override {
    return cuda::sum_squares(x, n, ss_, stream_);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int H) override {
    const int* d = ints(tokens_, tokens, (size_t)T);
    cuda::embedding_forward(out, d, wte, T, H, stream_);
    settle();
  }
  void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int H) override {
    const int* d = tokens_.put(tokens, (size_t)T);
    cuda::embedding_backward(dwte, dout, d, T, H, stream_);
    settle();
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps) override {
    cuda::rmsnorm_forward(out, rstd, inp, w, T, C, eps, stream_);
    settle();
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                        int T, int C) override {
    cuda::rmsnorm_backward(dinp, nullptr, dw, dout, inp, w, rstd, T, C, colp_, stream_);
    settle();
  }

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                      bool accumulate) override {
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    const bf16* W = weights_.single(w, (size_t)OC * C, stream_);
    weights_.evict(out, (size_t)N * OC);
    // row-major out[N,OC] = inp[N,C] w[OC,C]^T  <=>  column-major out^T = w^T-view(T) * inp-view
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, A, C, accumulate ? 1.f : 0.f, out, OC);
    if (bias) {
      cuda::add_bias(out, bias, N, OC, stream_);
    }
    settle();
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w, int N,
                       int C, int OC) override {
    const bf16* dO = to_bf16(act_b_, dout, (size_t)N * OC);
    if (dinp) {
      const bf16* W = weights_.single(w, (size_t)OC * C, stream_);
      // dinp[N,C] += dout[N,OC] w[OC,C]
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 1.f, dinp, C);
    }
    if (dw) {  // (null: a frozen weight)
      const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
      // dw[OC,C] += dout^T[OC,N] inp[N,C]
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, A, C, dO, OC, 1.f, dw, C);
    }
    if (dbias) cuda::colsum(dbias, dout, nullptr, nullptr, N, OC, colp_, stream_);
    settle();
  }

  void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd,
                    float eps) override {
    cuda::head_rmsnorm(x, ld, saved, rstd, w, T, nh, hd, eps, stream_);
    settle();
  }
  void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w, const float* rstd,
                             int T, int nh, int hd) override {
    cuda::head_rmsnorm_backward(dx, ld, dw, saved, w, rstd, T, nh, hd, colp_, stream_);
    settle();
  }

  void rope_table(float* cosb, float* sinb, const int32_t* pos, int T, int hd, const float* inv_freq) override {
    const int half = hd / 2;
    std::vector<float> inv(inv_freq, inv_freq + half);
    float* dinv = (float*)inv_.get(half * sizeof(float));
    if (inv != inv_host_) {  // the same table every step of a model: sent once
      CUDA_CHECK(cudaMemcpy(dinv, inv.data(), half * sizeof(float), cudaMemcpyHostToDevice));
      inv_host_ = inv;
    }
    const int* dpos = ints(pos_, pos, (size_t)T);
    cuda::rope_table(cosb, sinb, dpos, dinv, T, half, stream_);
  }
  void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    cuda::rope_forward(x, cosb, sinb, T, nh, hd, stream_);
    settle();
  }
  void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd) override {
    cuda::rope_backward(dx, cosb, sinb, T, nh, hd, stream_);
    settle();
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    attention_forward16(out, nullptr, lse, q, k, v, seq_starts, S, T, NH, NKV, hd);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                          const float* v, const float* out, const float* lse, const int32_t* seq_starts, int S, int T,
                          int NH, int NKV, int hd) override {
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = std::max(max_len, seq_starts[s + 1] - seq_starts[s]);
    const int* d = seqs_.put(seq_starts, (size_t)S + 1);
    float* scratch = (float*)att_.get(cuda::attention_backward_scratch(T, NH) * sizeof(float));
    cuda::attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, d, S, max_len, T, NH, NKV, hd, 0);
    settle();
  }

  void swiglu_forward(float* out, const float* gate, const float* up, size_t n) override {
    cuda::swiglu_forward(out, gate, up, n, stream_);
    settle();
  }
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                       size_t n) override {
    cuda::swiglu_backward(dgate, dup, dout, gate, up, n, stream_);
    settle();
  }

  void logsoftmax_forward(float* logits, float* logp, float* ent, const int32_t* targets, int N, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    cuda::logsoftmax_forward(logits, logp, ent, d, N, V, stream_);
    settle();
  }
  void logsoftmax_backward(float* logprobs, const float* dlogp, const float* dent, const float* ent,
                           const int32_t* targets, int N, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    cuda::logsoftmax_backward(logprobs, dlogp, dent, ent, d, N, V, stream_);
    settle();
  }

  size_t kv_elem_bytes() const override { return sizeof(bf16); }
  void kv_store(void* kc, void* vc, const float* k, const float* v, const int32_t* slot, const int32_t* pos, int T,
                int KD, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    cuda::kv_store((bf16*)kc, (bf16*)vc, k, v, ds, dp, T, KD, max_len, stream_);
    settle();
  }
  void attention_cached(float* out, const float* q, const void* kcache, const void* vcache, const int32_t* slot,
                        const int32_t* pos, int T, int NH, int NKV, int hd, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    const bf16 *kc = (const bf16*)kcache, *vc = (const bf16*)vcache;
    bf16* o16 = nullptr;
    if (fused_) {  // the o-projection's operand, picked up by matmul_cat(fresh)
      o16 = (bf16*)shadow_.get(std::max<size_t>((size_t)T * NH * hd, 1) * sizeof(bf16));
      shadow_src_ = out;
      shadow_n_ = (size_t)T * NH * hd;
    }
    cuda::attention_cached(out, o16, q, kc, vc, ds, dp, T, NH, NKV, hd, max_len, sms(), att_part_, att_cnt_, stream_);
    settle();
  }
  void softmax_rows(float* x, const float* inv_temp, int N, int V) override {
    const float* d;
    if (graphs_.capturing()) {
      d = (const float*)graphs_.stage_in(inv_temp, (size_t)N * sizeof(float));
    } else {
      float* dd = (float*)invt_.get(std::max(N, 1) * sizeof(float));
      CUDA_CHECK(cudaMemcpy(dd, inv_temp, N * sizeof(float), cudaMemcpyHostToDevice));
      d = dd;
    }
    cuda::softmax_rows(x, d, N, V, stream_);
    settle();
  }

  void sample_rows(const float* x, const double* u, int N, int V, int32_t* token, float* logp) override {
    char* buf = (char*)samp_.get((size_t)N * (sizeof(double) + sizeof(int) + sizeof(float)));
    double* du = (double*)buf;
    int* dt = (int*)(du + N);
    float* dl = (float*)(dt + N);
    if (graphs_.capturing()) {
      const double* su = (const double*)graphs_.stage_in(u, (size_t)N * sizeof(double));
      cuda::sample_rows(x, su, N, V, dt, dl, stream_);
      graphs_.stage_out(token, dt, (size_t)N * sizeof(int));
      graphs_.stage_out(logp, dl, (size_t)N * sizeof(float));
      return;
    }
    CUDA_CHECK(cudaMemcpy(du, u, (size_t)N * sizeof(double), cudaMemcpyHostToDevice));
    cuda::sample_rows(x, du, N, V, dt, dl, stream_);
    CUDA_CHECK(cudaMemcpy(token, dt, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(logp, dl, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost));
  }

  void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
             float wd, float bc1, float bc2) override {
    weights_.evict(p, n);
    cuda::adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, bc1, bc2, stream_);
    settle();
  }

  // Fused decode ops (device.h). The producers (add_rmsnorm, swiglu_cat, attention_cached) leave a bf16 copy of
  // their output in shadow_, which matmul_cat(fresh) takes as its operand instead of converting the fp32 one.
  bool fused_decode() const override { return fused_; }
  void add_rmsnorm(float* x, float* out, float* rstd, const float* a, const float* b, const float* w, int T, int C,
                   float eps) override {
    bf16* o16 = (bf16*)shadow_.get(std::max<size_t>((size_t)T * C, 1) * sizeof(bf16));
    shadow_src_ = out;
    shadow_n_ = (size_t)T * C;
    cuda::add_rmsnorm(x, out, o16, rstd, a, b, w, T, C, eps, stream_);
    settle();
  }
  void matmul_cat(float* out, const float* inp, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                  int oc2, int N, int C, bool fresh) override {
    const size_t nin = (size_t)N * C;
    const bf16* A = fresh && inp == shadow_src_ && nin == shadow_n_ ? (const bf16*)shadow_.p : to_bf16(act_a_, inp, nin);
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = weights_.stacked(w0, oc0, w1, oc1, w2, oc2, C, stream_);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, A, C, 0.f, out, OC);
    settle();
  }
  void qkv_rope_store(float* q, void* kc, void* vc, const float* qkv, const float* qb, const float* kb,
                      const float* vb, const float* cosb, const float* sinb, const int32_t* slot, const int32_t* pos,
                      int T, int NH, int NKV, int hd, int max_len) override {
    const int* ds = ints(slot_, slot, (size_t)T);
    const int* dp = ints(pos_, pos, (size_t)T);
    cuda::qkv_rope_store(q, (bf16*)kc, (bf16*)vc, qkv, qb, kb, vb, cosb, sinb, ds, dp, max_len, T, NH, NKV, hd, stream_);
    settle();
  }
  void swiglu_cat(float* out, const float* gu, int T, int I) override {
    const size_t n = (size_t)T * I;
    bf16* o16 = (bf16*)shadow_.get(std::max<size_t>(n, 1) * sizeof(bf16));
    shadow_src_ = out;
    shadow_n_ = n;
    cuda::swiglu_cat(out, o16, gu, T, I, stream_);
    settle();
  }

  // Fused training ops (device.h): every bf16 operand is written by its producer, q|k|v and gate|up are one
  // product each, forward and backward, on the stacked bf16 weights the decode path uses too.
  bool fused_train() const override { return fused_; }
  void add_rmsnorm16(float* x, uint16_t* out16, float* rstd, const float* a, const float* b, const float* w, int T,
                     int C, float eps) override {
    cuda::add_rmsnorm(x, nullptr, (bf16*)out16, rstd, a, b, w, T, C, eps, stream_);
    settle();
  }
  void matmul16(float* out, const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                int oc2, int N, int C, bool accumulate) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = weights_.stacked(w0, oc0, w1, oc1, w2, oc2, C, stream_);
    weights_.evict(out, (size_t)N * OC);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, (const bf16*)inp16, C, accumulate ? 1.f : 0.f, out, OC);
    settle();
  }
  void matmul16_to16(uint16_t* out16, const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1,
                     const float* w2, int oc2, int N, int C) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* W = weights_.stacked(w0, oc0, w1, oc1, w2, oc2, C, stream_);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, W, C, (const bf16*)inp16, C, 0.f, out16, OC, CUDA_R_16BF);
    settle();
  }
  void matmul16_backward(float* dinp, uint16_t* dinp16, float* dw0, float* dw1, float* dw2, const uint16_t* dout16,
                         const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1, const float* w2,
                         int oc2, int N, int C) override {
    const int OC = oc0 + oc1 + oc2;
    const bf16* dO = (const bf16*)dout16;
    const bf16* A = (const bf16*)inp16;
    if (dinp || dinp16) {
      const bf16* W = weights_.stacked(w0, oc0, w1, oc1, w2, oc2, C, stream_);
      if (dinp) {
        weights_.evict(dinp, (size_t)N * C);
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 0.f, dinp, C);
      } else {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, dO, OC, 0.f, dinp16, C, CUDA_R_16BF);
      }
    }
    // dw_i[oc_i, C] += dout[:, cols of i]^T inp: one product where the gradients lie one after the other
    const bool contiguous = (!oc1 || dw1 == dw0 + (size_t)oc0 * C) && (!oc2 || dw2 == dw1 + (size_t)oc1 * C);
    if (contiguous) {
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, A, C, dO, OC, 1.f, dw0, C);
    } else {
      float* dw[3] = {dw0, dw1, dw2};
      const int oc[3] = {oc0, oc1, oc2};
      for (int i = 0, off = 0; i < 3; off += oc[i], i++)
        if (oc[i]) gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, oc[i], N, A, C, dO + off, OC, 1.f, dw[i], C);
    }
    settle();
  }
  void qkv_rope_split(float* q, float* k, float* v, const float* qkv, const float* qb, const float* kb,
                      const float* vb, const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) override {
    cuda::qkv_rope_split(q, k, v, qkv, qb, kb, vb, cosb, sinb, T, NH, NKV, hd, stream_);
    settle();
  }
  void qkv_rope_back16(uint16_t* dqkv16, float* dq, float* dk, const float* dv, float* dqb, float* dkb, float* dvb,
                       const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) override {
    cuda::qkv_rope_back16((bf16*)dqkv16, dq, dk, dv, cosb, sinb, T, NH, NKV, hd, dqb || dkb, stream_);
    if (dqb) cuda::colsum(dqb, dq, nullptr, nullptr, T, NH * hd, colp_, stream_);
    if (dkb) cuda::colsum(dkb, dk, nullptr, nullptr, T, NKV * hd, colp_, stream_);
    if (dvb) cuda::colsum(dvb, dv, nullptr, nullptr, T, NKV * hd, colp_, stream_);
    settle();
  }
  void swiglu16(uint16_t* out16, const uint16_t* gu16, int T, int I) override {
    const bf16* gu = (const bf16*)gu16;
    cuda::swiglu16((bf16*)out16, gu, T, I, stream_);
    settle();
  }
  void swiglu_back16(uint16_t* dgu16, const uint16_t* dout16, const uint16_t* gu16, int T, int I) override {
    const bf16 *d = (const bf16*)dout16, *gu = (const bf16*)gu16;
    cuda::swiglu_back16((bf16*)dgu16, d, gu, T, I, stream_);
    settle();
  }
  void rmsnorm_backward16(float* dinp, uint16_t* dinp16, float* dw, const float* dout, const float* inp, const float* w,
                          const float* rstd, int T, int C) override {
    cuda::rmsnorm_backward(dinp, (bf16*)dinp16, dw, dout, inp, w, rstd, T, C, colp_, stream_);
    settle();
  }
  void logits16_forward(uint16_t* z16, float* lse, float* logp, float* ent, const float* inp, const float* w,
                        const int32_t* targets, int N, int C, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    const bf16* W = weights_.single(w, (size_t)V * C, stream_);
    // row-major z16[N, V] = inp[N, C] w[V, C]^T
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, W, C, A, C, 0.f, z16, V, CUDA_R_16BF);
    cuda::logsoftmax16((const bf16*)z16, lse, logp, ent, d, N, V, stream_);
    settle();
  }
  void logits16_backward(float* dinp, float* dw, uint16_t* z16, const float* lse, const float* dlogp,
                         const float* dent, const float* ent, const int32_t* targets, const float* inp, const float* w,
                         int N, int C, int V) override {
    const int* d = targets_.put(targets, (size_t)N);
    bf16* dz = (bf16*)z16;
    cuda::dlogits16(dz, lse, dlogp, dent, ent, d, N, V, stream_);
    const bf16* W = weights_.single(w, (size_t)V * C, stream_);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, W, C, dz, V, 1.f, dinp, C);
    const bf16* A = to_bf16(act_a_, inp, (size_t)N * C);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, A, C, dz, V, 1.f, dw, C);
    settle();
  }
  void attention_forward16(float* out, uint16_t* out16, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) override {
    int max_len = 0;
    for (int s = 0; s < S; s++) max_len = std::max(max_len, seq_starts[s + 1] - seq_starts[s]);
    const int* d = seqs_.put(seq_starts, (size_t)S + 1);
    if (!cuda::attention_forward(out, (bf16*)out16, lse, q, k, v, d, S, max_len, T, NH, NKV, hd, 0) && out16) {
      const size_t n = (size_t)T * NH * hd;
      cuda::to_bf16((bf16*)out16, out, n, "attention output -> bf16", stream_);
    }
    settle();
  }

  // CUDA graphs (device.h): graphs_ (graphs.cu) captures and replays; this object's launches follow its stream.
  bool graphs() const override { return graphs_on_ && !sync_; }
  bool graph_ready(int id) override { return graphs_.ready(id); }
  void capture_begin(size_t stage_bytes) override { graphs_.begin(stage_bytes); }
  void capture_end(int id) override { graphs_.end(id); }
  void capture_abort() override { graphs_.abort(); }
  void replay(int id) override { graphs_.replay(id); }

 private:
  // RLSTREAM_CUDA_SYNC=1 waits for every kernel to finish, so that the model's wall-clock profile (profile())
  // measures GPU time per kind of kernel; off by default (launches stay asynchronous).
  void settle() {
    if (sync_) CUDA_CHECK(cudaDeviceSynchronize());
  }
  const bool sync_ = env_is("RLSTREAM_CUDA_SYNC", '1');

  int sms() {
    if (sms_ == 0) CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0));
    return sms_;
  }
  int sms_ = 0;  // multiprocessors of the device

  // C (column-major, fp32 or bf16 by ctype) = A * B + beta C, bf16 operands, fp32 accumulation
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16* A, int lda, const bf16* B,
            int ldb, float beta, void* C, int ldc, cudaDataType_t ctype = CUDA_R_32F) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
      const size_t es = ctype == CUDA_R_32F ? sizeof(float) : sizeof(bf16);
      if (beta == 0.f) CUDA_CHECK(cudaMemset2DAsync(C, (size_t)ldc * es, 0, (size_t)m * es, n, stream_));
      return;
    }
    const float alpha = 1.f;
    CUBLAS_CHECK(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                              ctype, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  const bf16* to_bf16(Scratch& s, const float* x, size_t n) {
    bf16* y = (bf16*)s.get(std::max<size_t>(n, 1) * sizeof(bf16));
    cuda::to_bf16(y, x, n, "fp32 -> bf16", stream_);
    return y;
  }

  cublasHandle_t blas_ = nullptr;
  Scratch ws_, ss_, act_a_, act_b_, inv_, att_, colp_, invt_, samp_;
  IntStage tokens_, pos_, seqs_, targets_, slot_;
  std::map<const float*, size_t> sizes_;  // allocations made by alloc(), in floats
  std::vector<float> inv_host_;           // the rotary inverse frequencies last sent to inv_
  // RLSTREAM_CUDA_FUSED=0: Model runs the plain ops (fused_decode() and fused_train() false) for extend and the
  // training step, for parity and measurement.
  const bool fused_ = !env_off("RLSTREAM_CUDA_FUSED");
  Scratch shadow_;                        // bf16 copy of the last fused producer's output
  Scratch att_part_, att_cnt_;            // the split decode attention's partial results and counters
  const float* shadow_src_ = nullptr;
  size_t shadow_n_ = 0;

  // Bumped whenever memory a graph could have captured goes away (release, a scratch buffer growing, a cached bf16
  // weight freed): graphs made under another generation are dropped before the next replay.
  uint64_t gen_ = 0;
  cudaStream_t stream_ = nullptr;  // where launches go: the legacy stream, or the capture's stream while capturing
  cuda::WeightCache weights_{&gen_};  // bf16 copies of the weights the products take
  const bool graphs_on_ = !env_off("RLSTREAM_CUDA_GRAPHS");
  cuda::CudaGraphs graphs_{&gen_, [this](cudaStream_t s) { use_stream(s); }, [this] { weights_.refresh(stream_); }};

  void use_stream(cudaStream_t s) {
    stream_ = s;
    CUBLAS_CHECK(cublasSetStream(blas_, s));
    // cublasSetStream resets the workspace to cuBLAS's own pool (allocated on demand: not in a capture)
    CUBLAS_CHECK(cublasSetWorkspace(blas_, ws_.p, ws_.bytes));
  }
  const int* ints(IntStage& s, const int32_t* host, size_t n) {
    return graphs_.capturing() ? (const int*)graphs_.stage_in(host, n * sizeof(int32_t)) : s.put(host, n);
  }
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels() { return std::make_unique<CudaKernels>(); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool cuda_memory(size_t* free_bytes, size_t* total_bytes) {
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace rls
