// The transformer (Llama / Qwen2 family) on raw pointers: parameter layout with HF names, activations for a packed
// batch, forward, chunked loss head, backward, gradient norm/clipping and AdamW. No N-API here.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device.h"

namespace rls {

// One tensor of the model: its HF name, shape, and where it sits inside each of the parameter-sized blocks
// (parameters, gradients, AdamW first and second moments share the same layout).
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;
  size_t numel = 0;
};

struct LayerPtrs {
  float *ln1_w, *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *o_w, *ln2_w, *gate_w, *up_w, *down_w;
  float *q_norm = nullptr, *k_norm = nullptr;  // Qwen3's per-head norms [head_dim] (qk_norm)
};
// Pointers into one block. lm_head aliases embed when the embeddings are tied.
struct ParamPtrs {
  float* embed = nullptr;
  std::vector<LayerPtrs> layers;
  float* norm_w = nullptr;
  float* lm_head = nullptr;
};

// A packed batch: S sequences of total length T, seq_starts[S+1] (cu_seqlens). Validated by validate_batch.
struct Batch {
  const int32_t* tokens = nullptr;
  int T = 0;
  const int32_t* seq_starts = nullptr;
  int S = 0;
};

// Loss on top of the per-token log-probs and entropies, evaluated chunk by chunk so the vocabulary-sized gradient
// only ever exists for one chunk of tokens. Called in token order.
struct TokenLoss {
  virtual ~TokenLoss() = default;
  // For tokens [t0, t0+n): given logp and entropy, write dL/dlogp and dL/dentropy and accumulate the loss.
  virtual void chunk(int t0, int n, const float* logp, const float* ent, float* dlogp, float* dent) = 0;
  // A loss whose per-token gradient depends on the whole sequence (a sequence-level ratio) sees every log-prob
  // first: forward_backward then runs the logits once more before the chunks, and calls prepare(logp[T]).
  virtual bool needs_logp() const { return false; }
  virtual void prepare(const float* /*logp*/) {}
};

struct AdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

// Host memory shared with JS views (parameters(), gradients(), optimizer state): views keep it alive.
using Block = std::shared_ptr<float>;

// Where the kernels run. On Cuda the four blocks live on the GPU and the host blocks above are mirrors, synced
// explicitly with download()/upload().
enum class Device { Cpu, Cuda };
enum class BlockKind { Params = 0, Grads = 1, ExpAvg = 2, ExpAvgSq = 3 };

// Low-rank adapters (LoRA, as PEFT's): a targeted projection y = x W^T becomes y = x W^T + s (x A^T) B^T with
// A [rank, in], B [out, rank] and s = alpha / rank. With rank > 0 the base weights are frozen: the gradient and
// AdamW blocks hold the adapters only, and the backward computes no base weight gradient.
enum LoraTarget { LoraQ = 0, LoraK, LoraV, LoraO, LoraGate, LoraUp, LoraDown, LoraTargets };
struct LoraConfig {
  int rank = 0;            // 0: no adapters, every parameter trains
  float alpha = 0;         // scale s = alpha / rank
  float dropout = 0;       // dropout on each adapter's input while training (forward_backward), in [0, 1)
  uint64_t seed = 0;       // of the dropout masks: mixed with the training call's count, the layer and the target
  unsigned targets = 0;    // bit LoraTarget per projection that carries an adapter
  float scale() const { return rank > 0 ? alpha / (float)rank : 0.f; }
  bool has(int t) const { return rank > 0 && (targets >> t & 1u); }
};
extern const char* const kLoraTargetNames[LoraTargets];  // "q_proj", ..., "down_proj" (HF module names)

class Model {
 public:
  // trainable false: parameters only, no gradients or optimizer state (a generation-only model takes a quarter
  // of the memory); every training call then throws NativeError.
  Model(const ModelConfig& cfg, int threads, int logit_chunk_tokens, Device device = Device::Cpu, bool trainable = true,
        const LoraConfig& lora = LoraConfig());
  bool trainable() const { return trainable_; }
  const LoraConfig& lora() const { return lora_; }
  // The trained range of the parameter block: [train_offset(), train_offset() + train_numel()). All of it without
  // adapters; with them, the adapter tensors (laid out after the base ones). Gradients and AdamW moments are
  // blocks of train_numel() floats, tensor t at t.offset - train_offset().
  size_t train_offset() const { return train_off_; }
  size_t train_numel() const { return ntrain_; }
  bool trained(const TensorInfo& t) const { return t.offset >= train_off_; }
  // Adapters: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform(a=sqrt(5))), B = 0, from a seed.
  void init_lora(uint64_t seed);
  // Layer l's projection `target` W[out, in] += scale * B A in place, A [rank, in] and B [out, rank] host floats:
  // folds an adapter into the weights (a negative scale takes it out again). On CUDA the product runs in bf16 with
  // fp32 accumulation, as every other product there.
  void merge_lora(int l, int target, const float* A, const float* B, int rank, float scale);
  // Activation recomputation per layer: the forward keeps each layer's input (the residual stream) and one layer's
  // activations, and the backward runs each layer's forward again before its backward (one more forward's work;
  // activations of one layer instead of all). Takes the plain ops on CUDA (not the fused training ops).
  void set_recompute(bool on);
  bool recompute() const { return recompute_; }
  void need_training(const char* op) const;  // throws NativeError naming op on a model that is not trainable
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t num_parameters() const { return nparams_; }
  int threads() const { return threads_; }
  Block params() const { return params_; }
  Block grads() const { return grads_; }
  Block adam_m() const { return m_; }
  Block adam_v() const { return v_; }
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  Device device() const { return device_; }
  // Host mirror <-> device block (no-ops on the CPU, where they are the same memory).
  // flat: the moments as the optimizer holds them (a ZeRO-1 shard's floats where one is set), for a rank's
  // checkpoint; otherwise a sharded model's moments are refused, not being laid out as its tensors.
  void download(BlockKind kind, bool flat = false);
  void upload(BlockKind kind, bool flat = false);

  void init_random(uint64_t seed, float std);
  // The weights of another model of the same shapes on the same device, copied device to device (queued on the
  // default stream, so kernels issued later on either model see the copy complete).
  void copy_params_from(const Model& src);
  // Throws NativeError naming the problem: ids out of range, bad seq_starts, sequences too long.
  void validate_batch(const Batch& b) const;

  // logp[T] of targets[T] (0 where targets[t] < 0) and entropy[T] of the next-token distribution.
  void forward_logprobs(const Batch& b, const int32_t* targets, float* logp, float* ent);
  // Full logits [T, V] into host memory (checks against other implementations; not chunked, so T*V floats).
  void forward_logits(const Batch& b, float* logits);
  // Forward, loss head (chunked), and backward: gradients are accumulated (+=) into grads().
  void forward_backward(const Batch& b, const int32_t* targets, TokenLoss& loss);

  // Incremental decoding over a slot-based KV cache (generation). kv_reserve allocates K and V for `slots`
  // sequences of up to `max_len` tokens per layer (dropping any previous cache); a slot holds the K/V of the tokens
  // appended to it so far, computed by the weights in place at the time (a trainer step changes what later tokens
  // see, not what is cached). extend appends counts[b] tokens to slots[b] for every b (tokens packed in that order:
  // a prefill is a count > 1, a decode step a count of 1, both in one call) and writes, for each b, the next-token
  // distribution after its last token, softmax(logits * inv_temp[b]), into probs[b, V] (host memory).
  void kv_reserve(int slots, int max_len);
  // Bytes of the activations a T-token step allocates (extend, forward or training), so a caller can leave room
  // for them before sizing a KV cache.
  double activation_bytes(int T) const;
  double kv_bytes(int slots, int max_len) const;  // what kv_reserve(slots, max_len) allocates
  int kv_slots() const { return kv_slots_; }
  int kv_max_len() const { return kv_max_len_; }
  int kv_length(int slot) const;
  void kv_truncate(int slot, int len);  // keeps the first len tokens (0: a free slot)
  // Throws NativeError naming the problem (no cache, slots out of range or repeated, a slot overflowing, ids).
  void validate_extend(const int32_t* slots, const int32_t* counts, int B, const int32_t* tokens, int T,
                       const float* inv_temp) const;
  // probs null: draws one token per b on the device instead (Kernels::sample_rows with uniforms u[B]) into
  // token[B] and logp[B], so the rows never leave it.
  void extend(const int32_t* slots, const int32_t* counts, int B, const int32_t* tokens, int T, const float* inv_temp,
              float* probs, const double* u = nullptr, int32_t* token = nullptr, float* logp = nullptr);

  void zero_grad();
  double grad_norm();
  void scale_grads(float s);
  // AdamW over the trained range, or over its optimizer shard where one is set.
  void adamw_step(const AdamWParams& p);

  // Data-parallel training (consumers/trainer/parallel, test/gpu/driver.cpp dp): collectives read and write the
  // blocks in place, queued behind the kernels on queue().
  // Where a block's floats are (device memory on CUDA; null for moments of a model that is not trainable).
  float* block_data(BlockKind kind) const { return dev_[(int)kind]; }
  void* queue() const { return k_->queue(); }
  // Parameters [begin, begin+n) of the block were written by a collective: derived copies are made again.
  void params_written(size_t begin, size_t n);
  // ZeRO-1: this model's AdamW moments cover only trained floats [begin, begin+count) (offsets in the gradient
  // block), so they take 2 x count floats instead of 2 x train_numel(); adamw_step then updates that slice alone, and
  // the other ranks' slices reach this model by an all-gather of the parameters. Drops the moments held so far;
  // only before the first step. The moments' views and transfers are refused while a shard is set.
  void set_optimizer_shard(size_t begin, size_t count);
  bool optimizer_sharded() const { return opt_n_ != ntrain_; }
  size_t optimizer_begin() const { return opt_begin_; }
  size_t optimizer_count() const { return opt_n_; }
  // Over gradient floats [begin, begin+n) only: a rank's slice after a reduce-scatter.
  double grad_sum_squares(size_t begin, size_t n);
  void scale_grads(float s, size_t begin, size_t n);

  // Wall seconds spent per kind of kernel since construction (or reset): where a step's time goes. `graph`: decode
  // steps replayed as one CUDA graph each (the whole step, kernels of every kind, not split).
  enum class Phase { matmul, attention, elementwise, logits, optimizer, graph, count };
  const double* profile() const { return prof_; }
  void reset_profile() {
    for (double& p : prof_) p = 0;
  }

  std::atomic<bool> busy{false};  // one call at a time: set by the glue before scheduling, cleared after

 private:
  struct Acts;
  struct ActLayer;  // one layer's activations
  void ensure_acts(int T, int max_len);
  template <typename Give>
  void walk_acts(int T, Acts& a, Give&& give) const;
  // Through the KV cache when `cached` is given: token t at position cached->pos[t] of slot cached->slot[t].
  struct Cached {
    const int32_t* slot;
    const int32_t* pos;
  };
  void forward_trunk(const Batch& b, const Cached* cached = nullptr);
  void layer_forward(int l, const Batch& b, const Cached* cached);
  ActLayer& layer_acts(int l);
  // One set of layer activations shared by every layer: with recomputation (the backward runs each layer's forward
  // again) and in a model made for inference, which has no backward: at Qwen2.5-7B's shape a 4,224-token step kept
  // 23 GiB of every layer's activations in the generating engine (test/gpu/RESULTS.md, 2026-11-30).
  bool shared_layer_acts() const { return recompute_ || !trainable_; }
  void forward_fused(const Batch& b, const Cached& c);  // extend's trunk where the kernels have fused decode ops
  void forward_train_fused(const Batch& b);             // the trunk without a cache where they have fused training ops
  // extend's head: logits of rows [B, H], softmax(logits * inv_temp), then the rows to probs (host) or one draw
  // per row into token/logp; with neither (probs and token null), the rows stay in the logits buffer.
  void extend_head(const float* rows, int B, const float* inv_temp, float* probs, const double* u, int32_t* token,
                   float* logp);
  // Decode steps (every count 1) as CUDA graphs, one per batch size and kind (rows to the host or sampled): the
  // step's host inputs and outputs sit at fixed addresses the graph copies from and to.
  struct DecodeIO;
  void capture_decode(int id, int B, bool rows);
  void logits_chunk(int t0, int n);
  void logprobs_pass(int T, const int32_t* targets, float* logp, float* ent);
  void logsoftmax_chunk(int t0, int n, const int32_t* targets, float* logp, float* ent);
  ParamPtrs bind(float* base) const;
  // Adapter pointers per layer and target (null where a target has none) into a block laid out as params' adapter
  // range, starting at `base` (the adapter range's first float).
  struct LoraPtrs {
    float* A[LoraTargets] = {};
    float* B[LoraTargets] = {};
  };
  std::vector<LoraPtrs> bind_lora(float* base) const;
  // y[T, OC] += s (x A^T) B^T for layer l's adapter on target t, keeping x A^T s for the backward.
  void lora_forward(int l, int t, float* y, const float* x, int T, int C, int OC);
  // Its backward given dy: dx += ..., dA += ..., dB += ...
  void lora_backward(int l, int t, float* dx, const float* dy, const float* x, int T, int C, int OC);

  ModelConfig cfg_;
  std::vector<float> inv_freq_;  // rotary inverse frequencies [head_dim / 2] (cfg_.rope_inv_freq())
  int threads_;
  int chunk_;
  std::unique_ptr<Kernels> k_;
  std::vector<TensorInfo> tensors_;
  size_t nparams_ = 0;
  Block params_, grads_, m_, v_;
  Device device_ = Device::Cpu;
  bool trainable_ = true;
  LoraConfig lora_;
  bool recompute_ = false;
  bool training_ = false;       // inside forward_backward: adapter dropout applies
  uint64_t train_calls_ = 0;    // forward_backward calls so far: each draws new dropout masks
  uint64_t dropout_seed(int l, int t) const;
  size_t train_off_ = 0, ntrain_ = 0;
  std::vector<LoraPtrs> LP_, LG_;  // adapter parameters and gradients
  float* junk_ = nullptr;          // with adapters: where the frozen norms' weight gradients go (never read)
  size_t junk_n_ = 0;
  float* dev_[4] = {nullptr, nullptr, nullptr, nullptr};  // where kernels read/write each block
  float* dmem_ = nullptr;                                  // the device allocation of parameters and gradients (Cuda)
  float* dmom_ = nullptr;                                  // the device allocation of both moments (Cuda)
  size_t opt_begin_ = 0, opt_n_ = 0;                       // the optimizer shard: all of the trained range unless set
  void alloc_moments(size_t n);
  ParamPtrs P_, G_;
  int64_t step_ = 0;
  std::unique_ptr<Acts> a_;
  float* kv_mem_ = nullptr;  // [L][2][slots][max_len][KD] of Kernels::kv_elem_bytes() each
  void* kv_layer(int l, int which) const;  // layer l's K (which 0) or V (1) cache
  int kv_slots_ = 0, kv_max_len_ = 0;
  std::vector<int> kv_len_;
  std::vector<int32_t> kv_slot_of_;  // per token of an extend call
  std::vector<float> stage_;  // host staging of per-token loss values (device models)
  double prof_[(int)Phase::count] = {};
  bool fused_train_ = false;  // the kernels have fused training ops (Kernels::fused_train): Acts laid out for them
  bool timing_ = true;  // off while capturing a graph (nothing runs then)
  bool graphs_ = false;  // the kernels replay graphs (CUDA, unless RLSTREAM_CUDA_GRAPHS=0 or RLSTREAM_CUDA_SYNC=1)
  std::vector<int32_t> pos_;  // per token of an extend call
  std::map<int, std::unique_ptr<DecodeIO>> dio_;
  std::set<int> graph_failed_;  // ids whose capture failed: decoded without a graph
  std::map<int, int> eager_steps_;  // decode steps run without a graph, per id
  bool graph_log_ = false;          // RLSTREAM_CUDA_GRAPHS=2: each capture on stderr
};

}  // namespace rls
