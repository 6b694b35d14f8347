// The device abstraction: every kernel the model needs, on raw pointers, with shapes in the comments.
// The CPU implementation (cpu_kernels.cpp) is the reference; a CUDA layer implements the same interface in its
// own file and is validated against the CPU one kernel by kernel. No N-API here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "errors.h"

namespace rls {

struct Kernels {
  virtual ~Kernels() = default;
  virtual const char* name() const = 0;
  virtual void set_threads(int threads) = 0;

  // Memory lives where the kernels run. The CPU returns host memory, 64-byte aligned, zero-filled.
  virtual float* alloc(size_t n) = 0;
  virtual void release(float* p) = 0;
  virtual void zero(float* p, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  virtual void add_inplace(float* y, const float* x, size_t n) = 0;  // y += x
  virtual void scale(float* x, size_t n, float s) = 0;
  virtual double sum_squares(const float* x, size_t n) = 0;  // deterministic for a given thread count
  // Inverted dropout with a mask drawn from (seed, i) alone, so it is drawn again identically for the backward:
  // out[i] = keep(seed, i) ? x[i] / (1 - p) : 0 (out may be x). keep: u >= p for u = the top 24 bits of
  // splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15) / 2^24.
  virtual void dropout(float* out, const float* x, size_t n, float p, uint64_t seed) = 0;

  // Host staging. The CPU's memory is the host's, so these are plain copies. A device whose memory the host cannot
  // read (CUDA) returns false from host_visible() and moves bytes; the model then keeps host mirrors of its
  // parameter blocks and stages the per-token loss through them. Integer inputs (tokens, targets, positions,
  // seq_starts) are always host pointers: a device copies them itself.
  virtual bool host_visible() const { return true; }
  // For collectives that read and write the blocks outside these kernels (NCCL, data-parallel training): the queue
  // the kernels run on (CUDA: the cudaStream_t, null for the legacy default stream; the CPU runs in call order), so a
  // collective queued there runs after the kernels before it and before those after it; and written(p, n), told
  // after such a write into [p, p+n), so that what the kernels derived from that memory (the bf16 weight copies)
  // is made again.
  virtual void* queue() const { return nullptr; }
  virtual void written(float* /*p*/, size_t /*n*/) {}
  virtual void to_host(float* host_dst, const float* src, size_t n) { copy(host_dst, src, n); }
  virtual void from_host(float* dst, const float* host_src, size_t n) { copy(dst, host_src, n); }

  // out[T,H] = wte[tokens[t], :]            wte [V,H]
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, int T, int H) = 0;
  // dwte[tokens[t], :] += dout[t, :]
  virtual void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int T, int H) = 0;

  // out[T,C] = inp * rstd * w, rstd[T] = 1/sqrt(mean(inp^2) + eps)   (HF LlamaRMSNorm)
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int T, int C, float eps) = 0;
  // dinp += ..., dw += ...
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                                const float* rstd, int T, int C) = 0;

  // out[N,OC] (= or +=) inp[N,C] * w[OC,C]^T + bias[OC]   (bias may be null)
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC,
                              bool accumulate) = 0;
  // dinp[N,C] += dout * w (skipped when dinp is null); dw[OC,C] += dout^T * inp (skipped when dw is null); dbias[OC] += colsum(dout) (if non-null)
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                               int N, int C, int OC) = 0;

  // cos/sin tables [T, hd/2] for positions pos[T]: angle = pos * inv_freq[i] (HF rotary, float32 like HF), with
  // inv_freq [hd/2] host floats (ModelConfig::rope_inv_freq: theta^(-2i/hd), scaled where rope_scaling says so).
  virtual void rope_table(float* cosb, float* sinb, const int32_t* pos, int T, int hd, const float* inv_freq) = 0;
  // x[T, nh*hd] rotated in place (rotate_half convention); backward applies the inverse rotation to the gradient.
  virtual void rope_forward(float* x, const float* cosb, const float* sinb, int T, int nh, int hd) = 0;
  virtual void rope_backward(float* dx, const float* cosb, const float* sinb, int T, int nh, int hd) = 0;

  // Per-head RMSNorm (Qwen3's q_norm / k_norm): in rows t of x with a stride of ld floats, each of the nh heads
  // x[t, h*hd : (h+1)*hd] is replaced by rmsnorm(head) * w[hd] (as rmsnorm_forward); the heads' inputs are kept in
  // saved[T, nh*hd] (where not null) and their rstd[T*nh] for the backward.
  virtual void head_rmsnorm(float* x, int ld, float* saved, float* rstd, const float* w, int T, int nh, int hd,
                            float eps) = 0;
  // Its backward in place: dx (rows of stride ld) holds d out on entry and d in on return; dw += sum d out * x̂.
  virtual void head_rmsnorm_backward(float* dx, int ld, float* dw, const float* saved, const float* w,
                                     const float* rstd, int T, int nh, int hd) = 0;

  // Causal grouped-query attention inside each packed sequence [seq_starts[s], seq_starts[s+1]).
  // q/out [T, NH*hd], k/v [T, NKV*hd], lse [NH, T] (log-sum-exp of each score row, kept for backward).
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                                 const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) = 0;
  // dq, dk, dv are overwritten. Probabilities are recomputed from q, k and lse (no [T,T] storage).
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                                  const float* v, const float* out, const float* lse, const int32_t* seq_starts, int S,
                                  int T, int NH, int NKV, int hd) = 0;

  // Incremental decoding over a slot-based KV cache. kc/vc [slots, max_len, NKV*hd] (one layer) of elements of
  // kv_elem_bytes() bytes: fp32 on the CPU, bf16 on CUDA (half the bytes a decode step reads, as the cache of
  // transformers' bf16 models); token t of a call belongs to slot[t] at position pos[t] (host pointers, like every
  // integer input).
  virtual size_t kv_elem_bytes() const { return sizeof(float); }
  // kc[slot[t], pos[t], :] = k[t, :], vc likewise; k/v [T, NKV*hd].
  virtual void kv_store(void* kc, void* vc, const float* k, const float* v, const int32_t* slot,
                        const int32_t* pos, int T, int KD, int max_len) = 0;
  // out[t, head h] = softmax(q[t,h] . kc[slot[t], j, kv head of h] / sqrt(hd), j = 0..pos[t]) . vc[...]: each query
  // sees its slot's keys up to and including its own position (stored by kv_store first). q/out [T, NH*hd].
  virtual void attention_cached(float* out, const float* q, const void* kc, const void* vc, const int32_t* slot,
                                const int32_t* pos, int T, int NH, int NKV, int hd, int max_len) = 0;
  // x[N,V] replaced by softmax(x[n,:] * inv_temp[n]) row by row (inv_temp: N host floats).
  virtual void softmax_rows(float* x, const float* inv_temp, int N, int V) = 0;
  // One token per row of probabilities x[N,V] (from softmax_rows), where the rows are: u[n] in [0, 1) takes the
  // first index i with x[n,0] + ... + x[n,i] > u[n] (sums in double; the last index with mass when rounding leaves
  // the total at or below u), u[n] < 0 the arg-max (the lowest index among equals). token[N] and logp[N] =
  // log(x[n, token]) are host outputs; u is N host doubles. The same rule as producers/policy/sampler.ts for rows
  // without top-k / top-p, so the rows need not leave the device.
  virtual void sample_rows(const float* x, const double* u, int N, int V, int32_t* token, float* logp) = 0;

  // out = silu(gate) * up, elementwise over n
  virtual void swiglu_forward(float* out, const float* gate, const float* up, size_t n) = 0;
  // dgate, dup are overwritten
  virtual void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                               size_t n) = 0;

  // logits[N,V] are replaced by log-probabilities; logp[n] = logprob of targets[n] (0 where targets[n] < 0),
  // ent[n] = entropy of the row.
  virtual void logsoftmax_forward(float* logits, float* logp, float* ent, const int32_t* targets, int N, int V) = 0;
  // logprobs[N,V] (from logsoftmax_forward) are replaced by dlogits given dL/dlogp[n] and dL/dent[n].
  virtual void logsoftmax_backward(float* logprobs, const float* dlogp, const float* dent, const float* ent,
                                   const int32_t* targets, int N, int V) = 0;

  // PyTorch AdamW: p *= 1 - lr*wd; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
  virtual void adamw(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                     float eps, float wd, float bc1, float bc2) = 0;

  // Fused ops of the decode path (Model::extend), used where fused_decode() is true (CUDA); the CPU runs the plain
  // ops above instead and has none of these.
  virtual bool fused_decode() const { return false; }
  // x[T,C] = a + b (b null: x = a; x may be a), out = rmsnorm(x) with rstd as rmsnorm_forward.
  virtual void add_rmsnorm(float* x, float* out, float* rstd, const float* a, const float* b, const float* w, int T,
                           int C, float eps) { unsupported("add_rmsnorm"); }
  // out[N, oc0+oc1+oc2] = inp[N,C] * [w0; w1; w2]^T, w1 and w2 null where oc1 and oc2 are 0. fresh: inp is the
  // output of the call just before (add_rmsnorm, swiglu_cat or attention_cached), which may keep it in the
  // products' precision for this call.
  virtual void matmul_cat(float* out, const float* inp, const float* w0, int oc0, const float* w1, int oc1,
                          const float* w2, int oc2, int N, int C, bool fresh) { unsupported("matmul_cat"); }
  // From qkv[T, QD + 2 KD] plus biases (each may be null): q[T, QD] rotated (rope_forward), k rotated and v
  // stored into the caches at (slot[t], pos[t]) as kv_store does.
  virtual void qkv_rope_store(float* q, void* kc, void* vc, const float* qkv, const float* qb, const float* kb,
                              const float* vb, const float* cosb, const float* sinb, const int32_t* slot,
                              const int32_t* pos, int T, int NH, int NKV, int hd, int max_len) {
    unsupported("qkv_rope_store");
  }
  // out[T,I] = silu(gu[t, 0:I]) * gu[t, I:2I]
  virtual void swiglu_cat(float* out, const float* gu, int T, int I) { unsupported("swiglu_cat"); }

  // Fused ops of the training step (forward_trunk without a cache, forward_backward), used where fused_train() is
  // true (CUDA, unless RLSTREAM_CUDA_FUSED=0); the CPU runs the plain ops. Buffers typed uint16_t* hold bf16 (the
  // products' operands, written by the op that produces them, so no product converts its input). The stacked
  // weights [w0; w1; w2] take oc0 + oc1 + oc2 output columns, w1 and w2 null where oc1 and oc2 are 0.
  virtual bool fused_train() const { return false; }
  // add_rmsnorm with only the bf16 copy of the norm's output: x = a + b (b null: x = a), out16 = rmsnorm(x).
  virtual void add_rmsnorm16(float* x, uint16_t* out16, float* rstd, const float* a, const float* b, const float* w,
                             int T, int C, float eps) { unsupported("add_rmsnorm16"); }
  // out[N, OC] (= or +=) inp16[N, C] * [w0; w1; w2]^T
  virtual void matmul16(float* out, const uint16_t* inp16, const float* w0, int oc0, const float* w1, int oc1,
                        const float* w2, int oc2, int N, int C, bool accumulate) { unsupported("matmul16"); }
  // out16[N, OC] = bf16(inp16[N, C] * [w0; w1; w2]^T), accumulated in fp32: a product whose only reader wants bf16.
  virtual void matmul16_to16(uint16_t* out16, const uint16_t* inp16, const float* w0, int oc0, const float* w1,
                             int oc1, const float* w2, int oc2, int N, int C) { unsupported("matmul16_to16"); }
  // Backward of matmul16 given dout16[N, OC]: dinp[N, C] = dout16 * [w0; w1; w2], or its bf16 into dinp16 where
  // dinp is null (neither: skipped); dw_i[oc_i, C] += (columns of w_i in dout16)^T * inp16.
  virtual void matmul16_backward(float* dinp, uint16_t* dinp16, float* dw0, float* dw1, float* dw2,
                                 const uint16_t* dout16, const uint16_t* inp16, const float* w0, int oc0,
                                 const float* w1, int oc1, const float* w2, int oc2, int N, int C) {
    unsupported("matmul16_backward");
  }
  // From qkv[T, QD + 2 KD] plus biases (each may be null): q[T, QD] and k[T, KD] rotated (rope_forward), v[T, KD].
  virtual void qkv_rope_split(float* q, float* k, float* v, const float* qkv, const float* qb, const float* kb,
                              const float* vb, const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) {
    unsupported("qkv_rope_split");
  }
  // dq, dk rotated back in place (rope_backward), dqkv16[T, QD + 2 KD] = [dq | dk | dv]; bias gradients (each may be
  // null) += column sums of dq, dk, dv. cosb null: dq and dk are taken as they are (rotated back already, by a
  // caller with q/k norms between the product and the rotation).
  virtual void qkv_rope_back16(uint16_t* dqkv16, float* dq, float* dk, const float* dv, float* dqb, float* dkb,
                               float* dvb, const float* cosb, const float* sinb, int T, int NH, int NKV, int hd) {
    unsupported("qkv_rope_back16");
  }
  // out16[T, I] = silu(gu16[t, 0:I]) * gu16[t, I:2I] (gate|up in bf16, as matmul16_to16 writes them)
  virtual void swiglu16(uint16_t* out16, const uint16_t* gu16, int T, int I) { unsupported("swiglu16"); }
  // dgu16[T, 2I] = [dgate | dup] (swiglu_backward) given dout16[T, I]
  virtual void swiglu_back16(uint16_t* dgu16, const uint16_t* dout16, const uint16_t* gu16, int T, int I) {
    unsupported("swiglu_back16");
  }
  // rmsnorm_backward, and dinp16 = the updated dinp in bf16.
  virtual void rmsnorm_backward16(float* dinp, uint16_t* dinp16, float* dw, const float* dout, const float* inp,
                                  const float* w, const float* rstd, int T, int C) {
    unsupported("rmsnorm_backward16");
  }
  // The loss head on bf16 logits: z16[N, V] = bf16(inp * w^T) (the lm_head), then per row its log-sum-exp
  // lse[N], entropy ent[N] and the target's log-prob logp[N] (0 where the target is < 0), as logsoftmax_forward.
  virtual void logits16_forward(uint16_t* z16, float* lse, float* logp, float* ent, const float* inp, const float* w,
                                const int32_t* targets, int N, int C, int V) {
    unsupported("logits16_forward");
  }
  // Its backward: dlogits (logsoftmax_backward) over z16 in place, in bf16, then dinp += dlogits * w and
  // dw += dlogits^T * inp.
  virtual void logits16_backward(float* dinp, float* dw, uint16_t* z16, const float* lse, const float* dlogp,
                                 const float* dent, const float* ent, const int32_t* targets, const float* inp,
                                 const float* w, int N, int C, int V) {
    unsupported("logits16_backward");
  }
  // attention_forward, and out16 = bf16(out)
  virtual void attention_forward16(float* out, uint16_t* out16, float* lse, const float* q, const float* k,
                                   const float* v, const int32_t* seq_starts, int S, int T, int NH, int NKV, int hd) {
    unsupported("attention_forward16");
  }

  // Replay of a repeated step as a recorded graph (CUDA graphs; the CPU has none: graphs() false, the rest unused).
  // Between capture_begin and capture_end the calls are recorded as graph `id`, not run. Their host inputs (integer
  // inputs, inv_temp, u) are re-read from the same host addresses at every replay(id), and their host outputs
  // (sample_rows' token and logp) written there when replay returns; stage_bytes bounds their total size (plus 256
  // a buffer). The caller runs the step once normally first, so that nothing is allocated while capturing.
  // graph_ready(id) is false once anything a graph captured was freed or reallocated; weights written since the
  // capture are seen by the next replay. A failed capture throws; capture_abort() then leaves capture mode.
  virtual bool graphs() const { return false; }
  virtual bool graph_ready(int /*id*/) { return false; }
  virtual void capture_begin(size_t /*stage_bytes*/) {}
  virtual void capture_end(int /*id*/) {}
  virtual void capture_abort() {}
  virtual void replay(int /*id*/) {}

 protected:
  [[noreturn]] void unsupported(const char* op) const {
    throw NativeError(ErrCode::InvalidArgument, std::string(op) + ": not implemented on device '" + name() + "'");
  }
};

std::unique_ptr<Kernels> make_cpu_kernels(int threads);  // one per model (thread count is per model)
// The CUDA layer (native/cuda), linked only into builds made with RLSTREAM_CUDA=1. bf16 matrix work with fp32
// accumulation, fp32 everywhere else; a device copy of matmul weights in bf16 is cached until adamw, copy, zero,
// scale, add_inplace or from_host writes over them. Throws NativeError when no GPU is usable.
std::unique_ptr<Kernels> make_cuda_kernels();
int cuda_device_count();  // 0 when the driver or a GPU is missing
// Free and total memory of the current GPU (cudaMemGetInfo); false when there is none.
bool cuda_memory(size_t* free_bytes, size_t* total_bytes);
// Single-precision GEMM throughput of the BLAS on this machine: C[n,n] = A*B, iters times, with `threads`.
double cpu_sgemm_gflops(int n, int iters, int threads);

}  // namespace rls
