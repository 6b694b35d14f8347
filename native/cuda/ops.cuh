// The launchers of the CUDA op families, one section per file (declarations; the kernels are private to their
// file). Each launches on stream st and checks the launch (check.cuh); layouts are those of src/device.h's Kernels.
// Integer arrays (tokens, targets, slots, positions, seq starts) are device copies.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace rls::cuda {

// elementwise.cu: y += x, x *= s, dropout, fp32 -> bf16, bias rows, the embedding lookup and its gradient
void add(float* y, const float* x, size_t n, cudaStream_t st);
void scale(float* x, size_t n, float s, cudaStream_t st);
void dropout(float* out, const float* x, size_t n, float p, uint64_t seed, cudaStream_t st);
// `what` names the conversion in a launch error
void to_bf16(bf16* y, const float* x, size_t n, const char* what, cudaStream_t st);
void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t st);
void embedding_forward(float* out, const int* tokens, const float* wte, int T, int H, cudaStream_t st);
void embedding_backward(float* dwte, const float* dout, const int* tokens, int T, int H, cudaStream_t st);

// optimizer.cu: AdamW, and the deterministic sum of squares of gradient clipping (partials: its scratch)
void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
           float wd, float bc1, float bc2, cudaStream_t st);
double sum_squares(const float* x, size_t n, Scratch& partials, cudaStream_t st);

// norms.cu: RMSNorm (plain, fused with the residual add, per head), deterministic column sums (colp: their scratch)
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps,
                     cudaStream_t st);
// dinp += the input gradient (dinp16, where set: its bf16), dw += column sums of dout * inp * rstd
void rmsnorm_backward(float* dinp, bf16* dinp16, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int T, int C, Scratch& colp, cudaStream_t st);
void add_rmsnorm(float* x, float* out, bf16* out16, float* rstd, const float* a, const float* b, const float* w, int T,
                 int C, float eps, cudaStream_t st);
void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd, float eps,
                  cudaStream_t st);
void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w, const float* rstd, int T,
                           int nh, int hd, Scratch& colp, cudaStream_t st);
// dst[c] += sum over rows t of a[t, c] (* b[t, c] where b is set) (* rowscale[t] where set)
void colsum(float* dst, const float* a, const float* b, const float* rowscale, int T, int C, Scratch& colp,
            cudaStream_t st);

// rope.cu: the rotary tables and rotation, and the fused q|k|v split with bias and rotary
void rope_table(float* cosb, float* sinb, const int* pos, const float* inv_freq, int T, int half, cudaStream_t st);
void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd, cudaStream_t st);
void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd, cudaStream_t st);
// k and v into rows t of [T, KD]
void qkv_rope_split(float* q, float* k, float* v, const float* qkv, const float* qb, const float* kb, const float* vb,
                    const float* cosb, const float* sinb, int T, int NH, int NKV, int hd, cudaStream_t st);
// k and v into the bf16 caches at (slot[t], pos[t])
void qkv_rope_store(float* q, bf16* kc, bf16* vc, const float* qkv, const float* qb, const float* kb, const float* vb,
                    const float* cosb, const float* sinb, const int* slot, const int* pos, int max_len, int T, int NH,
                    int NKV, int hd, cudaStream_t st);
// write: dq and dk are written too (their biases' gradients are column sums of them)
void qkv_rope_back16(bf16* dqkv16, float* dq, float* dk, const float* dv, const float* cosb, const float* sinb, int T,
                     int NH, int NKV, int hd, bool write, cudaStream_t st);

// swiglu.cu: silu(gate) * up, on separate fp32 halves, on [gate | up] rows (fp32 with a bf16 copy, or bf16)
void swiglu_forward(float* out, const float* gate, const float* up, size_t n, cudaStream_t st);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, size_t n,
                     cudaStream_t st);
void swiglu_cat(float* out, bf16* out16, const float* gu, int T, int I, cudaStream_t st);
void swiglu16(bf16* out16, const bf16* gu, int T, int I, cudaStream_t st);
void swiglu_back16(bf16* dgu16, const bf16* dout, const bf16* gu, int T, int I, cudaStream_t st);

// softmax.cu: log-softmax over the vocabulary with entropy (fp32 logits, or bf16 with dlogits), softmax at a
// temperature per row
void logsoftmax_forward(float* logits, float* logp, float* ent, const int* targets, int N, int V, cudaStream_t st);
void logsoftmax_backward(float* logprobs, const float* dlogp, const float* dent, const float* ent, const int* targets,
                         int N, int V, cudaStream_t st);
void logsoftmax16(const bf16* z16, float* lse, float* logp, float* ent, const int* targets, int N, int V,
                  cudaStream_t st);
void dlogits16(bf16* dz, const float* lse, const float* dlogp, const float* dent, const float* ent, const int* targets,
               int N, int V, cudaStream_t st);
void softmax_rows(float* x, const float* inv_temp, int N, int V, cudaStream_t st);

// sampling.cu: a token per row of probabilities (arg-max, or the draw u), with its log-probability
void sample_rows(const float* x, const double* u, int N, int V, int* token, float* logp, cudaStream_t st);

// decode_attention.cu: the bf16 slot KV cache and attention over it (sms: the device's multiprocessors; part and cnt:
// the split rows' partial results and counters)
void kv_store(bf16* kc, bf16* vc, const float* k, const float* v, const int* slot, const int* pos, int T, int KD,
              int max_len, cudaStream_t st);
void attention_cached(float* out, bf16* out16, const float* q, const bf16* kc, const bf16* vc, const int* slot,
                      const int* pos, int T, int NH, int NKV, int hd, int max_len, int sms, Scratch& part,
                      Scratch& cnt, cudaStream_t st);

}  // namespace rls::cuda
