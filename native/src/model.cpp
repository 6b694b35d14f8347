// Forward and backward of the Llama / Qwen2 decoder on a packed batch, llm.c style: one block per kind of state
// (parameters, gradients, AdamW moments, activations), pointers into it, layers called in order and in reverse.
#include "model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"

#include <unistd.h>

namespace rls {

// Refuses allocations larger than the machine's memory up front: zero-filling them would get the process
// OOM-killed instead of raising an error.
static void check_fits(double bytes, const char* what) {
  const double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (phys > 0 && bytes > phys)
    invalid(std::string(what) + " need " + std::to_string(bytes / (1 << 30)) + " GiB, more than this machine's " +
            std::to_string(phys / (1 << 30)) + " GiB of memory");
}

// Times one kernel call into prof_[category] (wall clock; one steady_clock read per side, ~20 ns).
#define PROF(cat, ...)                                                                         \
  do {                                                                                         \
    if (!timing_) {                                                                            \
      __VA_ARGS__;                                                                             \
      break;                                                                                   \
    }                                                                                          \
    const auto prof_t0_ = std::chrono::steady_clock::now();                                    \
    __VA_ARGS__;                                                                               \
    prof_[(int)Phase::cat] += std::chrono::duration<double>(std::chrono::steady_clock::now() - prof_t0_).count(); \
  } while (0)

struct Model::ActLayer {
  float *ln1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *rstd2, *gate, *up, *act;
  // q/k norms (qk_norm): the heads' inputs [T, QD] and [T, KD], and their rstd [T * NH], [T * NKV]
  float *qpre = nullptr, *kpre = nullptr, *qrstd = nullptr, *krstd = nullptr;
  // Fused training (Kernels::fused_train): ln1, ln2, act and up are not kept; gate holds gate|up rows [T, 2I] in
  // bf16 (uint16_t bit patterns), and the products' operands are kept in bf16 too: ln1h, ln2h [T, H], acth [T, I],
  // atth [T, QD] (att stays fp32 for the attention backward).
  float *ln1h = nullptr, *ln2h = nullptr, *acth = nullptr, *atth = nullptr;
  float* lu[LoraTargets] = {};  // adapters: s * x A^T [T, rank] per target (the B product's input)
};

struct Model::Acts {
  int cap = 0;  // tokens this allocation holds
  float* mem = nullptr;
  Kernels* k = nullptr;
  std::vector<float*> resid;  // L+1 residual streams [T,H]; resid[l] enters layer l
  std::vector<ActLayer> layers;
  float *lnf, *rstdf, *cosb, *sinb;
  float *dres, *dln, *dq, *dk, *dv, *datt, *dgate, *dup, *dact;  // backward scratch
  // fused training's bf16 backward scratch (instead of dgate, dup): d resid [T, H], d gate|up [T, 2I], d q|k|v
  // [T, QD + 2KD]; dact is bf16 there too
  float *dres16 = nullptr, *dgu16 = nullptr, *dqkv16 = nullptr;
  float *logits, *logp, *ent, *dlogp, *dent;                    // loss head: logits [chunk,V], the rest [T]
  float* zlse = nullptr;  // fused training: the log-sum-exp of each row of a chunk of bf16 logits [chunk]
  float* ldu = nullptr;   // adapters' backward scratch [T, rank]
  float *lx = nullptr, *ldx = nullptr;  // adapter dropout: an adapter's dropped input and its gradient [T, widest in]
  std::vector<int32_t> pos;
  ~Acts() {
    if (mem) k->release(mem);
  }
};

const char* const kLoraTargetNames[LoraTargets] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

// A device block's host mirror, zero. calloc, not a memset: the pages of a large one come from the OS untouched and
// take no host memory until a download or a view writes them, so a 7B model's four mirrors (120 GB) cost nothing
// on a host that never reads them (the data-parallel ranks of one machine share its memory).
static Block host_mirror(size_t n) {
  void* p = std::calloc(std::max<size_t>(n, 16), sizeof(float));
  if (!p) throw std::bad_alloc();
  return Block(static_cast<float*>(p), [](float* q) { std::free(q); });
}

Model::Model(const ModelConfig& cfg, int threads, int logit_chunk_tokens, Device device, bool trainable,
             const LoraConfig& lora)
    : cfg_(cfg), device_(device), trainable_(trainable), lora_(lora) {
  validate_config(cfg_);
  if (lora_.rank < 0 || lora_.rank > 4096) invalid("lora.rank must be in [0, 4096], got " + std::to_string(lora_.rank));
  if (lora_.rank > 0) {
    if (!(lora_.alpha > 0) || !std::isfinite(lora_.alpha)) invalid("lora.alpha must be a positive number");
    if (!(lora_.dropout >= 0 && lora_.dropout < 1)) invalid("lora.dropout must be in [0, 1)");
    if (lora_.targets == 0 || lora_.targets >= (1u << LoraTargets)) invalid("lora.targets must name at least one projection");
    if (!trainable_) invalid("lora: adapters are for training; a model made for inference (trainable false) has none");
  }
  inv_freq_ = cfg_.rope_inv_freq();
  if (threads < 1 || threads > 256) invalid("threads must be in [1, 256], got " + std::to_string(threads));
  threads_ = threads;
  // Keep one chunk of logits around 32 MiB, but at least 16 tokens per GEMM. A GPU wants large GEMMs and has the
  // memory: about 512 MiB of logits per chunk there.
  if (device_ == Device::Cuda)
    chunk_ = logit_chunk_tokens > 0 ? logit_chunk_tokens : std::max(64, std::min(16384, (1 << 27) / cfg_.vocab_size));
  else
    chunk_ = logit_chunk_tokens > 0 ? logit_chunk_tokens : std::max(16, std::min(1024, (1 << 23) / cfg_.vocab_size));
  if (device_ == Device::Cuda) {
#ifdef RLSTREAM_CUDA
    k_ = make_cuda_kernels();
#else
    invalid("device 'cuda': this build of the native core has no CUDA support (rebuild with RLSTREAM_CUDA=1 where nvcc is installed)");
#endif
  } else {
    k_ = make_cpu_kernels(threads_);
  }

  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, V = cfg_.vocab_size, QD = cfg_.q_dim(),
                KD = cfg_.kv_dim();
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = name;
    t.shape = shape;
    t.numel = 1;
    for (auto d : shape) t.numel *= (size_t)d;
    t.offset = nparams_;
    nparams_ += (t.numel + 15) / 16 * 16;  // 64-byte aligned tensors
    tensors_.push_back(t);
  };
  add("model.embed_tokens.weight", {V, H});
  for (int l = 0; l < cfg_.num_hidden_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {QD, H});
    if (cfg_.attention_bias) add(p + "self_attn.q_proj.bias", {QD});
    add(p + "self_attn.k_proj.weight", {KD, H});
    if (cfg_.attention_bias) add(p + "self_attn.k_proj.bias", {KD});
    add(p + "self_attn.v_proj.weight", {KD, H});
    if (cfg_.attention_bias) add(p + "self_attn.v_proj.bias", {KD});
    add(p + "self_attn.o_proj.weight", {H, QD});
    if (cfg_.qk_norm) {
      add(p + "self_attn.q_norm.weight", {(int64_t)cfg_.head_dim()});
      add(p + "self_attn.k_norm.weight", {(int64_t)cfg_.head_dim()});
    }
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H});
    add(p + "mlp.down_proj.weight", {H, I});
  }
  add("model.norm.weight", {H});
  if (!cfg_.tie_word_embeddings) add("lm_head.weight", {V, H});
  // Adapters after the base tensors, so the trained range is one contiguous tail of the block.
  train_off_ = lora_.rank > 0 ? nparams_ : 0;
  if (lora_.rank > 0) {
    const int64_t r = lora_.rank;
    const int64_t in[LoraTargets] = {H, H, H, QD, H, H, I}, out[LoraTargets] = {QD, KD, KD, H, I, I, H};
    for (int l = 0; l < cfg_.num_hidden_layers; l++)
      for (int t = 0; t < LoraTargets; t++) {
        if (!lora_.has(t)) continue;
        const std::string p = "model.layers." + std::to_string(l) + (t < LoraGate ? ".self_attn." : ".mlp.") +
                              kLoraTargetNames[t] + ".lora_";
        add(p + "A.weight", {r, in[t]});
        add(p + "B.weight", {out[t], r});
      }
  }
  ntrain_ = trainable_ ? nparams_ - train_off_ : 0;

  const double block_floats = (double)nparams_ + 3.0 * (double)ntrain_;
  check_fits(sizeof(float) * block_floats, trainable_ ? "parameters, gradients and AdamW state" : "parameters");
  // CPU blocks are plain aligned host memory freed with free(), so JS views may outlive the model (a device
  // layer would stage parameters through host copies instead).
  if (k_->host_visible()) {
    auto host_block = [&](size_t n) { return Block(k_->alloc(std::max<size_t>(n, 16)), [](float* q) { std::free(q); }); };
    params_ = host_block(nparams_);
    dev_[0] = params_.get();
    if (trainable_) {
      grads_ = host_block(ntrain_);
      dev_[1] = grads_.get();
    }
  } else {
    // Host mirrors for JS views and files; the device holds parameters and gradients in one allocation.
    params_ = host_mirror(nparams_);
    if (trainable_) grads_ = host_mirror(ntrain_);
    dmem_ = k_->alloc(nparams_ + ntrain_);
    dev_[0] = dmem_;
    if (trainable_) dev_[1] = dmem_ + nparams_;
  }
  if (trainable_) alloc_moments(ntrain_);
  P_ = bind(dev_[0]);
  if (lora_.rank > 0) {
    // Frozen base: no gradient pointers for its tensors (the backward skips their products); the norms' weight
    // gradients, which the norm backward kernels write anyway, go to a scratch row never read.
    G_ = ParamPtrs();
    G_.layers.resize(cfg_.num_hidden_layers);
    junk_n_ = (size_t)std::max<int64_t>(H, cfg_.head_dim());
    junk_ = k_->alloc(junk_n_);
    for (auto& L : G_.layers) L = LayerPtrs{};
    LP_ = bind_lora(dev_[0] + train_off_);
    LG_ = bind_lora(dev_[1]);
  } else if (trainable_) {
    G_ = bind(dev_[1]);
  }
  a_ = std::make_unique<Acts>();
  a_->k = k_.get();
  fused_train_ = k_->fused_train() && lora_.rank == 0;
  graphs_ = k_->graphs();
  const char* g = std::getenv("RLSTREAM_CUDA_GRAPHS");
  graph_log_ = graphs_ && g && g[0] == '2';
}

Model::~Model() {
  a_.reset();  // activations are released through k_, which must still exist
  if (kv_mem_) k_->release(kv_mem_);
  if (junk_) k_->release(junk_);
  if (dmom_) k_->release(dmom_);
  if (dmem_) k_->release(dmem_);
}

// Both moments, zero, for n trained floats: on the CPU two host blocks (the JS views' memory), on CUDA one device
// allocation and two host mirrors.
void Model::alloc_moments(size_t n) {
  opt_n_ = n;
  if (k_->host_visible()) {
    auto host_block = [&](size_t c) { return Block(k_->alloc(std::max<size_t>(c, 16)), [](float* q) { std::free(q); }); };
    m_ = host_block(n);
    v_ = host_block(n);
    dev_[2] = m_.get();
    dev_[3] = v_.get();
    return;
  }
  m_ = host_mirror(n);
  v_ = host_mirror(n);
  if (dmom_) k_->release(dmom_);
  dmom_ = nullptr;
  dmom_ = k_->alloc(std::max<size_t>(2 * n, 1));
  dev_[2] = dmom_;
  dev_[3] = dmom_ + n;
}

void Model::set_optimizer_shard(size_t begin, size_t count) {
  need_training("setOptimizerShard");
  if (step_ != 0) invalid("setOptimizerShard: the model has taken " + std::to_string(step_) + " optimizer step(s); a shard is set before the first");
  if (begin > ntrain_ || count > ntrain_ - begin)
    invalid("setOptimizerShard: [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") is not inside the " +
            std::to_string(ntrain_) + " trained floats");
  alloc_moments(count);
  opt_begin_ = begin;
}

void Model::params_written(size_t begin, size_t n) {
  if (begin > nparams_ || n > nparams_ - begin) invalid("paramsWritten: range outside the parameter block");
  k_->written(dev_[0] + begin, n);
}

double Model::grad_sum_squares(size_t begin, size_t n) {
  need_training("gradSumSquares");
  if (begin > ntrain_ || n > ntrain_ - begin) invalid("gradSumSquares: range outside the gradient block");
  k_->set_threads(threads_);
  double ss = 0;
  PROF(optimizer, ss = k_->sum_squares(dev_[1] + begin, n));
  return ss;
}

void Model::scale_grads(float s, size_t begin, size_t n) {
  need_training("scaleGrads");
  if (begin > ntrain_ || n > ntrain_ - begin) invalid("scaleGrads: range outside the gradient block");
  k_->set_threads(threads_);
  PROF(optimizer, k_->scale(dev_[1] + begin, n, s));
}

static Block& block_of(BlockKind kind, Block& p, Block& g, Block& m, Block& v) {
  switch (kind) {
    case BlockKind::Params: return p;
    case BlockKind::Grads: return g;
    case BlockKind::ExpAvg: return m;
    default: return v;
  }
}

void Model::need_training(const char* op) const {
  if (!trainable_)
    invalid(std::string(op) + ": this model was made for inference (parameters only): it has no gradients or optimizer state");
}

// Floats of a block: the moments hold the optimizer shard's.
static size_t block_floats_of(BlockKind kind, size_t nparams, size_t ntrain, size_t nopt) {
  return kind == BlockKind::Params ? nparams : kind == BlockKind::Grads ? ntrain : nopt;
}

void Model::download(BlockKind kind, bool flat) {
  if (kind != BlockKind::Params) need_training("tensors");
  if ((kind == BlockKind::ExpAvg || kind == BlockKind::ExpAvgSq) && optimizer_sharded() && !flat)
    invalid("tensors: this model's AdamW moments are one ZeRO-1 shard, not laid out as its tensors");
  if (k_->host_visible()) return;
  k_->to_host(block_of(kind, params_, grads_, m_, v_).get(), dev_[(int)kind], block_floats_of(kind, nparams_, ntrain_, opt_n_));
}

void Model::copy_params_from(const Model& src) {
  if (&src == this) return;
  if (src.device_ != device_) invalid("copyParamsFrom: the source model is on another device");
  if (src.nparams_ != nparams_ || src.tensors_.size() != tensors_.size()) invalid("copyParamsFrom: the source model has other shapes");
  for (size_t i = 0; i < tensors_.size(); i++)
    if (src.tensors_[i].shape != tensors_[i].shape) invalid("copyParamsFrom: tensor " + tensors_[i].name + " has another shape in the source model");
  k_->copy(dev_[0], src.dev_[0], nparams_);
}

void Model::upload(BlockKind kind, bool flat) {
  if (kind != BlockKind::Params) need_training("upload");
  if ((kind == BlockKind::ExpAvg || kind == BlockKind::ExpAvgSq) && optimizer_sharded() && !flat)
    invalid("upload: this model's AdamW moments are one ZeRO-1 shard, not laid out as its tensors");
  if (k_->host_visible()) return;
  k_->from_host(dev_[(int)kind], block_of(kind, params_, grads_, m_, v_).get(), block_floats_of(kind, nparams_, ntrain_, opt_n_));
}

std::vector<Model::LoraPtrs> Model::bind_lora(float* base) const {
  std::vector<LoraPtrs> out(cfg_.num_hidden_layers);
  if (lora_.rank <= 0) return out;
  size_t i = 0;
  while (i < tensors_.size() && tensors_[i].offset < train_off_) i++;
  for (int l = 0; l < cfg_.num_hidden_layers; l++)
    for (int t = 0; t < LoraTargets; t++) {
      if (!lora_.has(t)) continue;
      out[l].A[t] = base + (tensors_[i++].offset - train_off_);
      out[l].B[t] = base + (tensors_[i++].offset - train_off_);
    }
  return out;
}

void Model::init_lora(uint64_t seed) {
  if (lora_.rank <= 0) invalid("initLora: this model has no adapters");
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  auto next_u = [&]() {  // splitmix64, as init_random: the same adapters for a seed everywhere
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  float* base = params_.get();
  for (const auto& t : tensors_) {
    if (!trained(t)) continue;
    float* p = base + t.offset;
    const bool is_a = t.name.find(".lora_A.") != std::string::npos;
    const double bound = 1.0 / std::sqrt((double)t.shape[1]);
    for (size_t i = 0; i < t.numel; i++) p[i] = is_a ? (float)((2.0 * next_u() - 1.0) * bound) : 0.0f;
  }
  upload(BlockKind::Params);
}

void Model::merge_lora(int l, int target, const float* A, const float* B, int rank, float scale) {
  if (lora_.rank > 0) invalid("mergeLora: this model trains its own adapters; merge into a model without any");
  if (l < 0 || l >= cfg_.num_hidden_layers) invalid("mergeLora: layer " + std::to_string(l) + " is out of range");
  if (target < 0 || target >= LoraTargets) invalid("mergeLora: target out of range");
  if (rank < 1 || rank > 4096) invalid("mergeLora: rank must be in [1, 4096]");
  if (!std::isfinite(scale)) invalid("mergeLora: scale must be finite");
  const int H = cfg_.hidden_size, I = cfg_.intermediate_size, QD = cfg_.q_dim(), KD = cfg_.kv_dim();
  const int in[LoraTargets] = {H, H, H, QD, H, H, I}, out[LoraTargets] = {QD, KD, KD, H, I, I, H};
  const int C = in[target], OC = out[target];
  const LayerPtrs& w = P_.layers[l];
  float* W[LoraTargets] = {w.q_w, w.k_w, w.v_w, w.o_w, w.gate_w, w.up_w, w.down_w};
  // D[OC, C] = (scale B^T)^T A through matmul_backward's weight-gradient product (N = rank), then W += D (an op
  // that also drops any cached bf16 copy of W).
  std::vector<float> bt((size_t)rank * OC);
  for (int o = 0; o < OC; o++)
    for (int j = 0; j < rank; j++) bt[(size_t)j * OC + o] = scale * B[(size_t)o * rank + j];
  const size_t na = (size_t)rank * C, nb = bt.size(), nd = (size_t)OC * C;
  float* scratch = k_->alloc(na + nb + nd);
  try {
    float *dA = scratch, *dBt = scratch + na, *D = dBt + nb;
    k_->from_host(dA, A, na);
    k_->from_host(dBt, bt.data(), nb);
    k_->zero(D, nd);
    k_->set_threads(threads_);
    k_->matmul_backward(nullptr, D, nullptr, dBt, dA, nullptr, rank, C, OC);
    k_->add_inplace(W[target], D, nd);
  } catch (...) {
    k_->release(scratch);
    throw;
  }
  k_->release(scratch);
  // the host mirror follows on a device (parameters() reads the device block again when asked)
}

uint64_t Model::dropout_seed(int l, int t) const {
  return lora_.seed * 0x100000001B3ull + train_calls_ * 1000003ull + (uint64_t)l * 131ull + (uint64_t)t;
}

void Model::lora_forward(int l, int t, float* y, const float* x, int T, int C, int OC) {
  if (!lora_.has(t)) return;
  Kernels& k = *k_;
  const int r = lora_.rank;
  if (training_ && lora_.dropout > 0) {  // PEFT's lora_dropout on the adapter's input (train mode only)
    PROF(elementwise, k.dropout(a_->lx, x, (size_t)T * C, lora_.dropout, dropout_seed(l, t)));
    x = a_->lx;
  }
  float* u = layer_acts(l).lu[t];
  PROF(matmul, k.matmul_forward(u, x, LP_[l].A[t], nullptr, T, C, r, false));
  PROF(elementwise, k.scale(u, (size_t)T * r, lora_.scale()));
  PROF(matmul, k.matmul_forward(y, u, LP_[l].B[t], nullptr, T, r, OC, true));
}

void Model::lora_backward(int l, int t, float* dx, const float* dy, const float* x, int T, int C, int OC) {
  if (!lora_.has(t)) return;
  Kernels& k = *k_;
  const int r = lora_.rank;
  float* du = a_->ldu;
  // u = s x A^T, y += u B^T:  du = dy B, dB += dy^T u;  then d(x A^T) = s du:  dx += s du A, dA += s du^T x
  PROF(elementwise, k.zero(du, (size_t)T * r));
  PROF(matmul, k.matmul_backward(du, LG_[l].B[t], nullptr, dy, layer_acts(l).lu[t], LP_[l].B[t], T, r, OC));
  PROF(elementwise, k.scale(du, (size_t)T * r, lora_.scale()));
  if (training_ && lora_.dropout > 0) {
    // the same mask again: dA from the dropped input, and dx through the mask
    PROF(elementwise, k.dropout(a_->lx, x, (size_t)T * C, lora_.dropout, dropout_seed(l, t)));
    PROF(elementwise, k.zero(a_->ldx, (size_t)T * C));
    PROF(matmul, k.matmul_backward(a_->ldx, LG_[l].A[t], nullptr, du, a_->lx, LP_[l].A[t], T, C, r));
    PROF(elementwise, k.dropout(a_->ldx, a_->ldx, (size_t)T * C, lora_.dropout, dropout_seed(l, t)));
    PROF(elementwise, k.add_inplace(dx, a_->ldx, (size_t)T * C));
    return;
  }
  PROF(matmul, k.matmul_backward(dx, LG_[l].A[t], nullptr, du, x, LP_[l].A[t], T, C, r));
}

ParamPtrs Model::bind(float* base) const {
  ParamPtrs p;
  size_t i = 0;
  auto next = [&]() { return base + tensors_[i++].offset; };
  p.embed = next();
  for (int l = 0; l < cfg_.num_hidden_layers; l++) {
    LayerPtrs L{};
    L.ln1_w = next();
    L.q_w = next();
    L.q_b = cfg_.attention_bias ? next() : nullptr;
    L.k_w = next();
    L.k_b = cfg_.attention_bias ? next() : nullptr;
    L.v_w = next();
    L.v_b = cfg_.attention_bias ? next() : nullptr;
    L.o_w = next();
    if (cfg_.qk_norm) {
      L.q_norm = next();
      L.k_norm = next();
    }
    L.ln2_w = next();
    L.gate_w = next();
    L.up_w = next();
    L.down_w = next();
    p.layers.push_back(L);
  }
  p.norm_w = next();
  p.lm_head = cfg_.tie_word_embeddings ? p.embed : next();
  return p;
}

void Model::init_random(uint64_t seed, float std) {
  // splitmix64 + Box-Muller: the same weights for a seed on every platform and thread count. splitmix64's k-th draw
  // is a function of k alone, so the r-th random element (counting only the tensors drawn at random, in order)
  // takes draws 2r+1 and 2r+2 wherever it is computed: the tensors are cut into ranges filled on threads_ threads
  // (a 7B model's 7.6e9 draws one after another take minutes), with the weights of the one-after-another order.
  const uint64_t s0 = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto draw = [s0](uint64_t k) {
    uint64_t z = s0 + k * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  };
  struct Range {
    float* p;
    size_t n;
    int kind;         // 0 random, 1 one (norm weights), 2 zero (biases)
    uint64_t first;   // index of the range's first random element
  };
  std::vector<Range> ranges;
  const size_t piece = (size_t)1 << 22;
  uint64_t r = 0;
  float* base = params_.get();
  for (const auto& t : tensors_) {
    const bool norm = t.name.find("layernorm") != std::string::npos || t.name == "model.norm.weight" ||
                      t.name.find("_norm.weight") != std::string::npos;
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    const int kind = norm ? 1 : bias ? 2 : 0;
    for (size_t a = 0; a < t.numel; a += piece) {
      const size_t n = std::min(piece, t.numel - a);
      ranges.push_back({base + t.offset + a, n, kind, r});
      if (kind == 0) r += n;
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < ranges.size();) {
      const Range& g = ranges[i];
      for (size_t j = 0; j < g.n; j++) {
        if (g.kind == 1) g.p[j] = 1.0f;
        else if (g.kind == 2) g.p[j] = 0.0f;
        else {
          const uint64_t k = 2 * (g.first + j);
          const double u1 = draw(k + 1), u2 = draw(k + 2);
          g.p[j] = (float)(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
        }
      }
    }
  };
  const int n = (int)std::min<size_t>((size_t)threads_, ranges.size());
  std::vector<std::thread> pool;
  for (int i = 1; i < n; i++) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  upload(BlockKind::Params);
}

void Model::validate_batch(const Batch& b) const {
  if (b.T < 1) invalid("batch.tokens is empty");
  if (b.S < 1) invalid("batch.seqStarts must hold at least 2 entries (cu_seqlens [0, ..., T])");
  if (b.seq_starts[0] != 0) invalid("batch.seqStarts[0] must be 0, got " + std::to_string(b.seq_starts[0]));
  for (int s = 0; s < b.S; s++) {
    const int a = b.seq_starts[s], e = b.seq_starts[s + 1];
    if (e <= a)
      invalid("batch.seqStarts must be strictly increasing: seqStarts[" + std::to_string(s + 1) + "] = " +
              std::to_string(e) + " <= seqStarts[" + std::to_string(s) + "] = " + std::to_string(a));
    if (e - a > cfg_.max_sequence())
      invalid("sequence " + std::to_string(s) + " has length " + std::to_string(e - a) + " > " +
              (cfg_.max_sequence() < cfg_.max_position_embeddings
                   ? "sliding_window " + std::to_string(cfg_.sliding_window) + " (attention beyond the window is not supported)"
                   : "max_position_embeddings " + std::to_string(cfg_.max_position_embeddings)));
  }
  if (b.seq_starts[b.S] != b.T)
    invalid("batch.seqStarts must end at the number of tokens " + std::to_string(b.T) + ", got " +
            std::to_string(b.seq_starts[b.S]));
  for (int t = 0; t < b.T; t++)
    if (b.tokens[t] < 0 || b.tokens[t] >= cfg_.vocab_size)
      invalid("batch.tokens[" + std::to_string(t) + "] = " + std::to_string(b.tokens[t]) + " is out of range [0, " +
              std::to_string(cfg_.vocab_size) + ")");
}

// Every activation buffer of a T-token step, in one walk used both to size the block and to lay it out, so the
// size a caller plans with (activation_bytes) is the size allocated.
template <typename Give>
void Model::walk_acts(int T, Acts& a, Give&& give) const {
  const size_t H = cfg_.hidden_size, I = cfg_.intermediate_size, V = cfg_.vocab_size, QD = cfg_.q_dim(),
               KD = cfg_.kv_dim(), NH = cfg_.num_attention_heads, L = cfg_.num_hidden_layers, hd = cfg_.head_dim();
  const size_t t = T, ch = std::min<size_t>(chunk_, t);
  a.resid.resize(L + 1);  // L+1 residual streams; resid[l] enters layer l
  // one layer's activations at a time with recomputation, and in a model made for inference (no backward reads them)
  a.layers.resize(shared_layer_acts() ? 1 : L);
  {
    auto each = [&](size_t n, std::initializer_list<float**> slots) {
      for (float** slot : slots) give(*slot, n);
    };
    auto half = [](size_t n) { return (n + 1) / 2; };  // floats holding n bf16
    for (auto& r : a.resid) give(r, t * H);
    for (auto& l : a.layers) {
      if (fused_train_) {
        each(t * H, {&l.mid});
        each(half(t * H), {&l.ln1h, &l.ln2h});
      } else {
        each(t * H, {&l.ln1, &l.mid, &l.ln2});
      }
      each(t, {&l.rstd1, &l.rstd2});
      if (cfg_.qk_norm) {
        each(t * QD, {&l.qpre});
        each(t * KD, {&l.kpre});
        each(NH * t, {&l.qrstd});
        each(t * cfg_.num_key_value_heads, {&l.krstd});
      }
      each(t * QD, {&l.q, &l.att});
      each(t * KD, {&l.k, &l.v});
      each(NH * t, {&l.lse});
      if (fused_train_) {
        each(half(2 * t * I), {&l.gate});
        each(half(t * I), {&l.acth});
        each(half(t * QD), {&l.atth});
      } else {
        each(t * I, {&l.gate, &l.up, &l.act});
      }
      for (int g = 0; g < LoraTargets; g++)
        if (lora_.has(g)) give(l.lu[g], t * lora_.rank);
    }
    if (lora_.rank > 0) each(t * lora_.rank, {&a.ldu});
    if (lora_.rank > 0 && lora_.dropout > 0) each(t * std::max({H, I, QD}), {&a.lx, &a.ldx});
    each(t * H, {&a.lnf, &a.dres, &a.dln});
    each(t, {&a.rstdf, &a.logp, &a.ent, &a.dlogp, &a.dent});
    each(t * hd / 2, {&a.cosb, &a.sinb});
    each(t * QD, {&a.dq, &a.datt});
    each(t * KD, {&a.dk, &a.dv});
    if (fused_train_) {
      each(half(t * I), {&a.dact});
      each(half(t * H), {&a.dres16});
      each(half(2 * t * I), {&a.dgu16});
      each(half(t * (QD + 2 * KD)), {&a.dqkv16});
      each(ch, {&a.zlse});
    } else {
      each(t * I, {&a.dgate, &a.dup, &a.dact});
    }
    each(ch * V, {&a.logits});
  }
}

static size_t align16(size_t n) { return (n + 15) / 16 * 16; }

double Model::activation_bytes(int T) const {
  if (T < 1) invalid("activationBytes: tokens must be >= 1, got " + std::to_string(T));
  Acts scratch;
  size_t total = 0;
  walk_acts(T, scratch, [&](float*&, size_t n) { total += align16(n); });
  return (double)total * sizeof(float);
}

void Model::ensure_acts(int T, int /*max_len*/) {
  Acts& a = *a_;
  if (a.cap >= T) return;
  size_t total = 0;
  walk_acts(T, a, [&](float*&, size_t n) { total += align16(n); });
  check_fits((double)total * sizeof(float), "activations for this batch");
  // allocate before releasing: if this throws, the previous (smaller) activations stay valid
  float* fresh = k_->alloc(total);
  if (a.mem) k_->release(a.mem);
  a.mem = fresh;
  a.cap = T;
  float* p = a.mem;
  walk_acts(T, a, [&](float*& slot, size_t n) {
    slot = p;
    p += align16(n);
  });
}

// extend's trunk on a device with fused decode ops: per layer one norm (with the residual add before it), one
// product for q, k and v together, rotary and the cache append in one kernel, attention, the o product, the second
// norm with its residual, one product for gate and up, SwiGLU, the down product. Same arithmetic as the plain ops.
void Model::forward_fused(const Batch& b, const Cached& c) {
  const int T = b.T, H = cfg_.hidden_size, I = cfg_.intermediate_size, QD = cfg_.q_dim(), KD = cfg_.kv_dim(),
            NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads, hd = cfg_.head_dim(),
            L = cfg_.num_hidden_layers;
  const float eps = (float)cfg_.rms_norm_eps;
  ensure_acts(T, 0);
  Acts& a = *a_;
  Kernels& k = *k_;
  // Its own buffers are the backward's scratch, unused in an extend (so activation_bytes is the same): q|k|v rows
  // [T, QD+2KD] over dq, datt, dk, dv (laid out one after the other), the product before each residual add [T, H]
  // over dres; gate|up rows [T, 2I] in the layer's gate (the fused training layout, walk_acts).
  float* qkv = a.dq;
  float* tmp = a.dres;
  if (!fused_train_) invalid("extend: the fused decode path needs the fused training layout");
  if (a.dv + (size_t)a.cap * KD < qkv + (size_t)T * (QD + 2 * KD))
    invalid("extend: the fused decode path's buffers do not fit the backward scratch");
  PROF(elementwise, k.rope_table(a.cosb, a.sinb, c.pos, T, hd, inv_freq_.data()));
  PROF(elementwise, k.embedding_forward(a.resid[0], b.tokens, P_.embed, T, H));
  for (int l = 0; l < L; l++) {
    const LayerPtrs& w = P_.layers[l];
    auto& x = layer_acts(l);
    void *kc = kv_layer(l, 0), *vc = kv_layer(l, 1);
    // resid[l] = mid + down product of the layer before (tmp); resid[0] is the embedding
    uint16_t *ln1h = (uint16_t*)x.ln1h, *ln2h = (uint16_t*)x.ln2h, *acth = (uint16_t*)x.acth;
    uint16_t* gu = (uint16_t*)x.gate;
    if (l == 0)
      PROF(elementwise, k.add_rmsnorm16(a.resid[0], ln1h, x.rstd1, a.resid[0], nullptr, w.ln1_w, T, H, eps));
    else
      PROF(elementwise, k.add_rmsnorm16(a.resid[l], ln1h, x.rstd1, layer_acts(l - 1).mid, tmp, w.ln1_w, T, H, eps));
    PROF(matmul, k.matmul16(qkv, ln1h, w.q_w, QD, w.k_w, KD, w.v_w, KD, T, H, false));
    if (cfg_.qk_norm) {  // in place in the q|k|v rows, before the rotation (nothing kept: no backward)
      PROF(elementwise, k.head_rmsnorm(qkv, QD + 2 * KD, nullptr, x.qrstd, w.q_norm, T, NH, hd, eps));
      PROF(elementwise, k.head_rmsnorm(qkv + QD, QD + 2 * KD, nullptr, x.krstd, w.k_norm, T, NKV, hd, eps));
    }
    PROF(elementwise, k.qkv_rope_store(x.q, kc, vc, qkv, w.q_b, w.k_b, w.v_b, a.cosb, a.sinb, c.slot, c.pos, T, NH,
                                       NKV, hd, kv_max_len_));
    PROF(attention, k.attention_cached(x.att, x.q, kc, vc, c.slot, c.pos, T, NH, NKV, hd, kv_max_len_));
    PROF(matmul, k.matmul_cat(tmp, x.att, w.o_w, H, nullptr, 0, nullptr, 0, T, QD, true));
    PROF(elementwise, k.add_rmsnorm16(x.mid, ln2h, x.rstd2, a.resid[l], tmp, w.ln2_w, T, H, eps));
    PROF(matmul, k.matmul16_to16(gu, ln2h, w.gate_w, I, w.up_w, I, nullptr, 0, T, H));
    PROF(elementwise, k.swiglu16(acth, gu, T, I));
    PROF(matmul, k.matmul16(tmp, acth, w.down_w, H, nullptr, 0, nullptr, 0, T, I, false));
  }
  PROF(elementwise, k.add_rmsnorm(a.resid[L], a.lnf, a.rstdf, layer_acts(L - 1).mid, tmp, P_.norm_w, T, H, eps));
}

// The training forward on a device with fused training ops: per layer the first norm with the residual add before
// it (writing the bf16 operand only), one product for q|k|v, rotary and the split in one kernel, attention (and
// its bf16 copy), the o product, the second norm with its residual, one product for gate|up, SwiGLU into bf16, the
// down product. resid[l+1] = mid + down product is formed by the next norm. Same arithmetic as the plain ops.
void Model::forward_train_fused(const Batch& b) {
  const int T = b.T, H = cfg_.hidden_size, I = cfg_.intermediate_size, QD = cfg_.q_dim(), KD = cfg_.kv_dim(),
            NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads, hd = cfg_.head_dim(),
            L = cfg_.num_hidden_layers;
  const float eps = (float)cfg_.rms_norm_eps;
  ensure_acts(T, 0);
  Acts& a = *a_;
  Kernels& k = *k_;
  // q|k|v rows [T, QD+2KD] over the backward's dq, datt, dk, dv; the product before each residual add over dres
  float* qkv = a.dq;
  float* tmp = a.dres;
  if (a.dv + (size_t)a.cap * KD < qkv + (size_t)T * (QD + 2 * KD))
    invalid("forward: the fused path's buffers do not fit the backward scratch");
  a.pos.resize(T);
  for (int s = 0; s < b.S; s++)
    for (int t = b.seq_starts[s]; t < b.seq_starts[s + 1]; t++) a.pos[t] = t - b.seq_starts[s];
  PROF(elementwise, k.rope_table(a.cosb, a.sinb, a.pos.data(), T, hd, inv_freq_.data()));
  PROF(elementwise, k.embedding_forward(a.resid[0], b.tokens, P_.embed, T, H));
  for (int l = 0; l < L; l++) {
    const LayerPtrs& w = P_.layers[l];
    auto& x = layer_acts(l);
    uint16_t *ln1h = (uint16_t*)x.ln1h, *ln2h = (uint16_t*)x.ln2h, *acth = (uint16_t*)x.acth,
             *atth = (uint16_t*)x.atth, *gu = (uint16_t*)x.gate;
    if (l == 0)
      PROF(elementwise, k.add_rmsnorm16(a.resid[0], ln1h, x.rstd1, a.resid[0], nullptr, w.ln1_w, T, H, eps));
    else
      PROF(elementwise, k.add_rmsnorm16(a.resid[l], ln1h, x.rstd1, layer_acts(l - 1).mid, tmp, w.ln1_w, T, H, eps));
    PROF(matmul, k.matmul16(qkv, ln1h, w.q_w, QD, w.k_w, KD, w.v_w, KD, T, H, false));
    if (cfg_.qk_norm) {  // in place in the q|k|v rows, their inputs kept for the backward
      PROF(elementwise, k.head_rmsnorm(qkv, QD + 2 * KD, x.qpre, x.qrstd, w.q_norm, T, NH, hd, eps));
      PROF(elementwise, k.head_rmsnorm(qkv + QD, QD + 2 * KD, x.kpre, x.krstd, w.k_norm, T, NKV, hd, eps));
    }
    PROF(elementwise, k.qkv_rope_split(x.q, x.k, x.v, qkv, w.q_b, w.k_b, w.v_b, a.cosb, a.sinb, T, NH, NKV, hd));
    PROF(attention, k.attention_forward16(x.att, atth, x.lse, x.q, x.k, x.v, b.seq_starts, b.S, T, NH, NKV, hd));
    PROF(matmul, k.matmul16(tmp, atth, w.o_w, H, nullptr, 0, nullptr, 0, T, QD, false));
    PROF(elementwise, k.add_rmsnorm16(x.mid, ln2h, x.rstd2, a.resid[l], tmp, w.ln2_w, T, H, eps));
    PROF(matmul, k.matmul16_to16(gu, ln2h, w.gate_w, I, w.up_w, I, nullptr, 0, T, H));
    PROF(elementwise, k.swiglu16(acth, gu, T, I));
    PROF(matmul, k.matmul16(tmp, acth, w.down_w, H, nullptr, 0, nullptr, 0, T, I, false));
  }
  PROF(elementwise, k.add_rmsnorm(a.resid[L], a.lnf, a.rstdf, layer_acts(L - 1).mid, tmp, P_.norm_w, T, H, eps));
}

void Model::forward_trunk(const Batch& b, const Cached* cached) {
  // (adapters are applied by the plain ops only: a model with them takes the plain path, cached or not)
  if (cached && fused_train_ && k_->fused_decode()) return forward_fused(b, *cached);
  if (!cached && fused_train_) return forward_train_fused(b);
  const int T = b.T, H = cfg_.hidden_size, hd = cfg_.head_dim();
  const float eps = (float)cfg_.rms_norm_eps;
  ensure_acts(T, 0);
  Acts& a = *a_;
  Kernels& k = *k_;
  k.set_threads(threads_);
  // positions restart at 0 in every packed sequence; a cached token sits after its slot's cached ones
  a.pos.resize(T);
  if (cached)
    std::copy(cached->pos, cached->pos + T, a.pos.begin());
  else
    for (int s = 0; s < b.S; s++)
      for (int t = b.seq_starts[s]; t < b.seq_starts[s + 1]; t++) a.pos[t] = t - b.seq_starts[s];
  // (a cached call's own positions: the caller's array, at a fixed address while capturing a graph)
  PROF(elementwise, k.rope_table(a.cosb, a.sinb, cached ? cached->pos : a.pos.data(), T, hd, inv_freq_.data()));

  PROF(elementwise, k.embedding_forward(a.resid[0], b.tokens, P_.embed, T, H));
  for (int l = 0; l < cfg_.num_hidden_layers; l++) layer_forward(l, b, cached);
  PROF(elementwise, k.rmsnorm_forward(a.lnf, a.rstdf, a.resid[cfg_.num_hidden_layers], P_.norm_w, T, H, eps));
}

Model::ActLayer& Model::layer_acts(int l) { return a_->layers[shared_layer_acts() ? 0 : l]; }

void Model::set_recompute(bool on) {
  if (on == recompute_) return;
  // the layout changes: drop the activations (the next step allocates them anew)
  a_ = std::make_unique<Acts>();
  a_->k = k_.get();
  recompute_ = on;
  fused_train_ = k_->fused_train() && lora_.rank == 0 && !recompute_;
}

// Layer l of the plain trunk: resid[l] -> resid[l+1], its activations into layer_acts(l) (one shared set with
// recomputation, where the backward runs this again from resid[l] before the layer's own backward).
void Model::layer_forward(int l, const Batch& b, const Cached* cached) {
  const int T = b.T, H = cfg_.hidden_size, I = cfg_.intermediate_size, QD = cfg_.q_dim(), KD = cfg_.kv_dim(),
            NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads, hd = cfg_.head_dim();
  const float eps = (float)cfg_.rms_norm_eps;
  Acts& a = *a_;
  Kernels& k = *k_;
  const LayerPtrs& w = P_.layers[l];
  auto& x = layer_acts(l);
  PROF(elementwise, k.rmsnorm_forward(x.ln1, x.rstd1, a.resid[l], w.ln1_w, T, H, eps));
  PROF(matmul, k.matmul_forward(x.q, x.ln1, w.q_w, w.q_b, T, H, QD, false));
  PROF(matmul, k.matmul_forward(x.k, x.ln1, w.k_w, w.k_b, T, H, KD, false));
  PROF(matmul, k.matmul_forward(x.v, x.ln1, w.v_w, w.v_b, T, H, KD, false));
  lora_forward(l, LoraQ, x.q, x.ln1, T, H, QD);
  lora_forward(l, LoraK, x.k, x.ln1, T, H, KD);
  lora_forward(l, LoraV, x.v, x.ln1, T, H, KD);
  if (cfg_.qk_norm) {
    PROF(elementwise, k.head_rmsnorm(x.q, QD, x.qpre, x.qrstd, w.q_norm, T, NH, hd, eps));
    PROF(elementwise, k.head_rmsnorm(x.k, KD, x.kpre, x.krstd, w.k_norm, T, NKV, hd, eps));
  }
  PROF(elementwise, k.rope_forward(x.q, a.cosb, a.sinb, T, NH, hd));
  PROF(elementwise, k.rope_forward(x.k, a.cosb, a.sinb, T, NKV, hd));
  if (cached) {
    void *kc = kv_layer(l, 0), *vc = kv_layer(l, 1);
    PROF(attention, k.kv_store(kc, vc, x.k, x.v, cached->slot, cached->pos, T, KD, kv_max_len_));
    PROF(attention, k.attention_cached(x.att, x.q, kc, vc, cached->slot, cached->pos, T, NH, NKV, hd, kv_max_len_));
  } else {
    PROF(attention, k.attention_forward(x.att, x.lse, x.q, x.k, x.v, b.seq_starts, b.S, T, NH, NKV, hd));
  }
  PROF(elementwise, k.copy(x.mid, a.resid[l], (size_t)T * H));
  PROF(matmul, k.matmul_forward(x.mid, x.att, w.o_w, nullptr, T, QD, H, true));
  lora_forward(l, LoraO, x.mid, x.att, T, QD, H);
  PROF(elementwise, k.rmsnorm_forward(x.ln2, x.rstd2, x.mid, w.ln2_w, T, H, eps));
  PROF(matmul, k.matmul_forward(x.gate, x.ln2, w.gate_w, nullptr, T, H, I, false));
  PROF(matmul, k.matmul_forward(x.up, x.ln2, w.up_w, nullptr, T, H, I, false));
  lora_forward(l, LoraGate, x.gate, x.ln2, T, H, I);
  lora_forward(l, LoraUp, x.up, x.ln2, T, H, I);
  PROF(elementwise, k.swiglu_forward(x.act, x.gate, x.up, (size_t)T * I));
  PROF(elementwise, k.copy(a.resid[l + 1], x.mid, (size_t)T * H));
  PROF(matmul, k.matmul_forward(a.resid[l + 1], x.act, w.down_w, nullptr, T, I, H, true));
  lora_forward(l, LoraDown, a.resid[l + 1], x.act, T, I, H);
}

// Logits [n, V] of tokens [t0, t0+n) into the chunk buffer: the final norm's output times lm_head.
void Model::logits_chunk(int t0, int n) {
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  PROF(matmul, k_->matmul_forward(a_->logits, a_->lnf + (size_t)t0 * H, P_.lm_head, nullptr, n, H, V, false));
}

// Log-prob of every target and entropy of every position, chunk by chunk, into logp[T] and ent[T] (where the
// kernels write: host memory on the CPU, device memory on a GPU).
void Model::logprobs_pass(int T, const int32_t* targets, float* logp, float* ent) {
  for (int t0 = 0; t0 < T; t0 += chunk_) {
    const int n = std::min(chunk_, T - t0);
    logsoftmax_chunk(t0, n, targets + t0, logp + t0, ent + t0);
  }
}

// Log-prob of each target and entropy of tokens [t0, t0+n). With the fused training ops the logits stay bf16 in the
// chunk buffer (their log-sum-exp in zlse) for logits16_backward; otherwise they are fp32 and replaced by their
// log-probs (logsoftmax_forward).
void Model::logsoftmax_chunk(int t0, int n, const int32_t* targets, float* logp, float* ent) {
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  if (fused_train_) {
    PROF(logits, k_->logits16_forward((uint16_t*)a_->logits, a_->zlse, logp, ent, a_->lnf + (size_t)t0 * H,
                                      P_.lm_head, targets, n, H, V));
    return;
  }
  logits_chunk(t0, n);
  PROF(logits, k_->logsoftmax_forward(a_->logits, logp, ent, targets, n, V));
}

void Model::forward_logprobs(const Batch& b, const int32_t* targets, float* logp, float* ent) {
  forward_trunk(b);
  Acts& a = *a_;
  // On a device the per-token outputs are written there and copied out once.
  const bool host = k_->host_visible();
  logprobs_pass(b.T, targets, host ? logp : a.logp, host ? ent : a.ent);
  if (!host) {
    k_->to_host(logp, a.logp, (size_t)b.T);
    k_->to_host(ent, a.ent, (size_t)b.T);
  }
}

void Model::forward_logits(const Batch& b, float* logits) {
  forward_trunk(b);
  Acts& a = *a_;
  const int V = cfg_.vocab_size;
  for (int t0 = 0; t0 < b.T; t0 += chunk_) {
    const int n = std::min(chunk_, b.T - t0);
    logits_chunk(t0, n);
    k_->to_host(logits + (size_t)t0 * V, a.logits, (size_t)n * V);
  }
}

void Model::forward_backward(const Batch& b, const int32_t* targets, TokenLoss& loss) {
  need_training("backward");
  // train mode for this call (adapter dropout); the next call draws new masks, also after an exception
  struct TrainMode {
    Model& m;
    explicit TrainMode(Model& mm) : m(mm) { m.training_ = true; }
    ~TrainMode() {
      m.training_ = false;
      m.train_calls_++;
    }
  } train_mode(*this);
  forward_trunk(b);
  Acts& a = *a_;
  Kernels& k = *k_;
  const int T = b.T, H = cfg_.hidden_size, I = cfg_.intermediate_size, V = cfg_.vocab_size, QD = cfg_.q_dim(),
            KD = cfg_.kv_dim(), NH = cfg_.num_attention_heads, NKV = cfg_.num_key_value_heads, hd = cfg_.head_dim(),
            L = cfg_.num_hidden_layers;

  if (loss.needs_logp()) {
    // Sequence-level losses: every log-prob before any gradient (costs one more lm_head pass).
    logprobs_pass(T, targets, a.logp, a.ent);
    if (k_->host_visible()) {
      loss.prepare(a.logp);
    } else {
      std::vector<float> lp((size_t)T);
      k_->to_host(lp.data(), a.logp, (size_t)T);
      loss.prepare(lp.data());
    }
  }

  // Loss head, one chunk of tokens at a time: logits -> log-softmax -> loss -> dlogits -> d lnf, d lm_head.
  PROF(elementwise, k.zero(a.dln, (size_t)T * H));
  if (junk_) PROF(elementwise, k.zero(junk_, junk_n_));  // so the scratch never overflows to inf over many steps
  for (int t0 = 0; t0 < T; t0 += chunk_) {
    const int n = std::min(chunk_, T - t0);
    const float* xf = a.lnf + (size_t)t0 * H;
    logsoftmax_chunk(t0, n, targets + t0, a.logp + t0, a.ent + t0);
    if (k_->host_visible()) {
      loss.chunk(t0, n, a.logp + t0, a.ent + t0, a.dlogp, a.dent);
    } else {
      // The per-token loss is O(T) host code: stage n floats each way.
      stage_.resize((size_t)4 * n);
      float *hl = stage_.data(), *he = hl + n, *hdl = he + n, *hde = hdl + n;
      k_->to_host(hl, a.logp + t0, (size_t)n);
      k_->to_host(he, a.ent + t0, (size_t)n);
      loss.chunk(t0, n, hl, he, hdl, hde);
      k_->from_host(a.dlogp, hdl, (size_t)n);
      k_->from_host(a.dent, hde, (size_t)n);
    }
    if (fused_train_) {  // dlogits in bf16 only, straight into the lm_head's products (counted as logits)
      PROF(logits, k.logits16_backward(a.dln + (size_t)t0 * H, G_.lm_head, (uint16_t*)a.logits, a.zlse, a.dlogp,
                                       a.dent, a.ent + t0, targets + t0, xf, P_.lm_head, n, H, V));
      continue;
    }
    PROF(logits, k.logsoftmax_backward(a.logits, a.dlogp, a.dent, a.ent + t0, targets + t0, n, V));
    PROF(matmul, k.matmul_backward(a.dln + (size_t)t0 * H, G_.lm_head, nullptr, a.logits, xf, P_.lm_head, n, H, V));
  }
  PROF(elementwise, k.zero(a.dres, (size_t)T * H));
  if (fused_train_) {
    // The layers in reverse with the fused ops: every product's gradient operand in bf16 from the op producing it,
    // one product each for d(q|k|v) and d(gate|up) and for their weights' gradients.
    uint16_t *dres16 = (uint16_t*)a.dres16, *dgu16 = (uint16_t*)a.dgu16, *dqkv16 = (uint16_t*)a.dqkv16,
             *dact16 = (uint16_t*)a.dact;
    PROF(elementwise, k.rmsnorm_backward16(a.dres, dres16, G_.norm_w, a.dln, a.resid[L], P_.norm_w, a.rstdf, T, H));
    for (int l = L - 1; l >= 0; l--) {
      const LayerPtrs& w = P_.layers[l];
      const LayerPtrs& g = G_.layers[l];
      auto& x = a.layers[l];
      PROF(matmul, k.matmul16_backward(nullptr, dact16, g.down_w, nullptr, nullptr, dres16, (uint16_t*)x.acth,
                                       w.down_w, H, nullptr, 0, nullptr, 0, T, I));
      PROF(elementwise, k.swiglu_back16(dgu16, dact16, (uint16_t*)x.gate, T, I));
      PROF(matmul, k.matmul16_backward(a.dln, nullptr, g.gate_w, g.up_w, nullptr, dgu16, (uint16_t*)x.ln2h, w.gate_w, I, w.up_w,
                                       I, nullptr, 0, T, H));
      PROF(elementwise, k.rmsnorm_backward16(a.dres, dres16, g.ln2_w, a.dln, x.mid, w.ln2_w, x.rstd2, T, H));
      PROF(matmul, k.matmul16_backward(a.datt, nullptr, g.o_w, nullptr, nullptr, dres16, (uint16_t*)x.atth, w.o_w, H, nullptr,
                                       0, nullptr, 0, T, QD));
      PROF(attention, k.attention_backward(a.dq, a.dk, a.dv, a.datt, x.q, x.k, x.v, x.att, x.lse, b.seq_starts, b.S, T,
                                           NH, NKV, hd));
      if (cfg_.qk_norm) {  // rotated back, through the norms, then packed as they are
        PROF(elementwise, k.rope_backward(a.dq, a.cosb, a.sinb, T, NH, hd));
        PROF(elementwise, k.rope_backward(a.dk, a.cosb, a.sinb, T, NKV, hd));
        PROF(elementwise, k.head_rmsnorm_backward(a.dq, QD, g.q_norm, x.qpre, w.q_norm, x.qrstd, T, NH, hd));
        PROF(elementwise, k.head_rmsnorm_backward(a.dk, KD, g.k_norm, x.kpre, w.k_norm, x.krstd, T, NKV, hd));
        PROF(elementwise, k.qkv_rope_back16(dqkv16, a.dq, a.dk, a.dv, g.q_b, g.k_b, g.v_b, nullptr, nullptr, T, NH,
                                            NKV, hd));
      } else {
        PROF(elementwise, k.qkv_rope_back16(dqkv16, a.dq, a.dk, a.dv, g.q_b, g.k_b, g.v_b, a.cosb, a.sinb, T, NH,
                                            NKV, hd));
      }
      PROF(matmul, k.matmul16_backward(a.dln, nullptr, g.q_w, g.k_w, g.v_w, dqkv16, (uint16_t*)x.ln1h, w.q_w, QD, w.k_w, KD,
                                       w.v_w, KD, T, H));
      PROF(elementwise, k.rmsnorm_backward16(a.dres, dres16, g.ln1_w, a.dln, a.resid[l], w.ln1_w, x.rstd1, T, H));
    }
    PROF(elementwise, k.embedding_backward(G_.embed, a.dres, b.tokens, T, H));
    return;
  }
  float* const junk = junk_;  // adapters: the frozen norms' weight gradients (written, never read)
  auto dnorm = [junk](float* g) { return g ? g : junk; };
  PROF(elementwise, k.rmsnorm_backward(a.dres, dnorm(G_.norm_w), a.dln, a.resid[L], P_.norm_w, a.rstdf, T, H));

  for (int l = L - 1; l >= 0; l--) {
    const LayerPtrs& w = P_.layers[l];
    const LayerPtrs& g = G_.layers[l];
    if (recompute_ && l < L - 1) layer_forward(l, b, nullptr);  // (the last layer's are still there)
    auto& x = layer_acts(l);
    // MLP: resid[l+1] = mid + down(silu(gate(ln2)) * up(ln2))
    PROF(elementwise, k.zero(a.dact, (size_t)T * I));
    PROF(matmul, k.matmul_backward(a.dact, g.down_w, nullptr, a.dres, x.act, w.down_w, T, I, H));
    lora_backward(l, LoraDown, a.dact, a.dres, x.act, T, I, H);
    PROF(elementwise, k.swiglu_backward(a.dgate, a.dup, a.dact, x.gate, x.up, (size_t)T * I));
    PROF(elementwise, k.zero(a.dln, (size_t)T * H));
    PROF(matmul, k.matmul_backward(a.dln, g.gate_w, nullptr, a.dgate, x.ln2, w.gate_w, T, H, I));
    PROF(matmul, k.matmul_backward(a.dln, g.up_w, nullptr, a.dup, x.ln2, w.up_w, T, H, I));
    lora_backward(l, LoraGate, a.dln, a.dgate, x.ln2, T, H, I);
    lora_backward(l, LoraUp, a.dln, a.dup, x.ln2, T, H, I);
    PROF(elementwise, k.rmsnorm_backward(a.dres, dnorm(g.ln2_w), a.dln, x.mid, w.ln2_w, x.rstd2, T, H));  // dres: d mid
    // Attention: mid = resid[l] + o(attn(rope(q), rope(k), v))
    PROF(elementwise, k.zero(a.datt, (size_t)T * QD));
    PROF(matmul, k.matmul_backward(a.datt, g.o_w, nullptr, a.dres, x.att, w.o_w, T, QD, H));
    lora_backward(l, LoraO, a.datt, a.dres, x.att, T, QD, H);
    PROF(attention, k.attention_backward(a.dq, a.dk, a.dv, a.datt, x.q, x.k, x.v, x.att, x.lse, b.seq_starts, b.S, T, NH, NKV, hd));
    PROF(elementwise, k.rope_backward(a.dq, a.cosb, a.sinb, T, NH, hd));
    PROF(elementwise, k.rope_backward(a.dk, a.cosb, a.sinb, T, NKV, hd));
    if (cfg_.qk_norm) {
      PROF(elementwise, k.head_rmsnorm_backward(a.dq, QD, dnorm(g.q_norm), x.qpre, w.q_norm, x.qrstd, T, NH, hd));
      PROF(elementwise, k.head_rmsnorm_backward(a.dk, KD, dnorm(g.k_norm), x.kpre, w.k_norm, x.krstd, T, NKV, hd));
    }
    PROF(elementwise, k.zero(a.dln, (size_t)T * H));
    PROF(matmul, k.matmul_backward(a.dln, g.q_w, g.q_b, a.dq, x.ln1, w.q_w, T, H, QD));
    PROF(matmul, k.matmul_backward(a.dln, g.k_w, g.k_b, a.dk, x.ln1, w.k_w, T, H, KD));
    PROF(matmul, k.matmul_backward(a.dln, g.v_w, g.v_b, a.dv, x.ln1, w.v_w, T, H, KD));
    lora_backward(l, LoraQ, a.dln, a.dq, x.ln1, T, H, QD);
    lora_backward(l, LoraK, a.dln, a.dk, x.ln1, T, H, KD);
    lora_backward(l, LoraV, a.dln, a.dv, x.ln1, T, H, KD);
    PROF(elementwise, k.rmsnorm_backward(a.dres, dnorm(g.ln1_w), a.dln, a.resid[l], w.ln1_w, x.rstd1, T, H));  // d resid[l]
  }
  if (G_.embed) PROF(elementwise, k.embedding_backward(G_.embed, a.dres, b.tokens, T, H));
}

void Model::kv_reserve(int slots, int max_len) {
  if (slots < 1) invalid("kv cache: slots must be >= 1, got " + std::to_string(slots));
  if (max_len < 1 || max_len > cfg_.max_position_embeddings)
    invalid("kv cache: maxLen must be in [1, max_position_embeddings = " + std::to_string(cfg_.max_position_embeddings) +
            "], got " + std::to_string(max_len));
  const double floats = std::ceil(kv_bytes(slots, max_len) / sizeof(float));
  if (k_->host_visible()) check_fits(floats * sizeof(float), "kv cache");
  if (kv_mem_) k_->release(kv_mem_);
  kv_mem_ = nullptr;
  kv_slots_ = kv_max_len_ = 0;
  kv_len_.clear();
  kv_mem_ = k_->alloc((size_t)floats);
  kv_slots_ = slots;
  kv_max_len_ = max_len;
  kv_len_.assign((size_t)slots, 0);
}

double Model::kv_bytes(int slots, int max_len) const {
  return 2.0 * cfg_.num_hidden_layers * (double)slots * max_len * cfg_.kv_dim() * k_->kv_elem_bytes();
}

void* Model::kv_layer(int l, int which) const {
  const size_t one = (size_t)kv_slots_ * kv_max_len_ * cfg_.kv_dim() * k_->kv_elem_bytes();
  return (char*)kv_mem_ + (2 * (size_t)l + which) * one;
}

static void check_slot(int slot, int slots) {
  if (slots == 0) invalid("kv cache: none reserved (call kvReserve first)");
  if (slot < 0 || slot >= slots)
    invalid("kv cache: slot " + std::to_string(slot) + " is out of range [0, " + std::to_string(slots) + ")");
}

int Model::kv_length(int slot) const {
  check_slot(slot, kv_slots_);
  return kv_len_[slot];
}

void Model::kv_truncate(int slot, int len) {
  check_slot(slot, kv_slots_);
  if (len < 0 || len > kv_len_[slot])
    invalid("kv cache: slot " + std::to_string(slot) + " holds " + std::to_string(kv_len_[slot]) +
            " tokens, cannot keep " + std::to_string(len));
  kv_len_[slot] = len;
}

void Model::validate_extend(const int32_t* slots, const int32_t* counts, int B, const int32_t* tokens, int T,
                            const float* inv_temp) const {
  if (kv_slots_ == 0) invalid("extend: no kv cache reserved (call kvReserve first)");
  if (B < 1) invalid("extend: slots is empty");
  long total = 0;
  std::vector<char> seen((size_t)kv_slots_, 0);
  for (int b = 0; b < B; b++) {
    const int s = slots[b];
    check_slot(s, kv_slots_);
    if (seen[s]) invalid("extend: slot " + std::to_string(s) + " appears twice in one call");
    seen[s] = 1;
    if (counts[b] < 1) invalid("extend: counts[" + std::to_string(b) + "] must be >= 1, got " + std::to_string(counts[b]));
    if (cfg_.max_sequence() < cfg_.max_position_embeddings && (long)kv_len_[s] + counts[b] > cfg_.max_sequence())
      invalid("extend: slot " + std::to_string(s) + " would hold " + std::to_string(kv_len_[s] + counts[b]) +
              " tokens, more than sliding_window " + std::to_string(cfg_.sliding_window) +
              " (attention beyond the window is not supported)");
    if ((long)kv_len_[s] + counts[b] > kv_max_len_)
      invalid("extend: slot " + std::to_string(s) + " holds " + std::to_string(kv_len_[s]) + " tokens; " +
              std::to_string(counts[b]) + " more exceed maxLen " + std::to_string(kv_max_len_));
    if (!(std::isfinite(inv_temp[b]) && inv_temp[b] > 0))
      invalid("extend: invTemperature[" + std::to_string(b) + "] must be finite and > 0, got " + std::to_string(inv_temp[b]));
    total += counts[b];
  }
  if (total != T) invalid("extend: counts add up to " + std::to_string(total) + " but tokens has " + std::to_string(T));
  for (int t = 0; t < T; t++)
    if (tokens[t] < 0 || tokens[t] >= cfg_.vocab_size)
      invalid("extend: tokens[" + std::to_string(t) + "] = " + std::to_string(tokens[t]) + " is out of range [0, " +
              std::to_string(cfg_.vocab_size) + ")");
}

struct Model::DecodeIO {
  std::vector<int32_t> tokens, slot, pos, token;
  std::vector<float> inv, logp;
  std::vector<double> u;
  explicit DecodeIO(int B) : tokens(B), slot(B), pos(B), token(B), inv(B), logp(B), u(B) {}
};

void Model::extend_head(const float* rows, int B, const float* inv_temp, float* probs, const double* u,
                        int32_t* token, float* logp) {
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  Acts& a = *a_;
  for (int b0 = 0; b0 < B; b0 += chunk_) {
    const int n = std::min(chunk_, B - b0);
    if (k_->fused_decode())  // the final norm's rows (decode) are still in the products' precision
      PROF(matmul, k_->matmul_cat(a.logits, rows + (size_t)b0 * H, P_.lm_head, V, nullptr, 0, nullptr, 0, n, H, rows == a.lnf));
    else
      PROF(matmul, k_->matmul_forward(a.logits, rows + (size_t)b0 * H, P_.lm_head, nullptr, n, H, V, false));
    PROF(logits, k_->softmax_rows(a.logits, inv_temp + b0, n, V));
    if (probs)
      PROF(logits, k_->to_host(probs + (size_t)b0 * V, a.logits, (size_t)n * V));
    else if (token)
      PROF(logits, k_->sample_rows(a.logits, u + b0, n, V, token + b0, logp + b0));
  }
}

void Model::capture_decode(int id, int B, bool rows) {
  std::unique_ptr<DecodeIO>& slot = dio_[id];
  if (!slot) slot = std::make_unique<DecodeIO>(B);
  DecodeIO& io = *slot;
  // tokens, slots, positions, inv_temp, u in; token, logp out; each rounded up to 256 bytes
  const size_t stage = (size_t)B * (3 * sizeof(int32_t) + sizeof(float) + sizeof(double) + sizeof(int32_t) + sizeof(float)) + 16 * 256;
  timing_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    k_->capture_begin(stage);
    const Batch batch{io.tokens.data(), B, nullptr, 0};
    const Cached c{io.slot.data(), io.pos.data()};
    forward_trunk(batch, &c);
    extend_head(a_->lnf, B, io.inv.data(), nullptr, io.u.data(), rows ? nullptr : io.token.data(), io.logp.data());
    k_->capture_end(id);
    if (graph_log_)
      std::fprintf(stderr, "rlstream: decode graph captured: batch %d, %s, %.2f ms\n", B, rows ? "rows" : "sampled",
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  } catch (const std::exception& e) {
    k_->capture_abort();
    graph_failed_.insert(id);
    std::fprintf(stderr, "rlstream: decode steps of batch %d run without a CUDA graph: %s\n", B, e.what());
  }
  timing_ = true;
}

void Model::extend(const int32_t* slots, const int32_t* counts, int B, const int32_t* tokens, int T,
                   const float* inv_temp, float* probs, const double* u, int32_t* token, float* logp) {
  const int H = cfg_.hidden_size, V = cfg_.vocab_size;
  pos_.resize((size_t)T);
  kv_slot_of_.resize((size_t)T);
  for (int b = 0, t = 0; b < B; b++)
    for (int i = 0; i < counts[b]; i++, t++) {
      kv_slot_of_[t] = slots[b];
      pos_[t] = kv_len_[slots[b]] + i;
    }
  // A decode step (one token per slot) replays the CUDA graph of its batch size and kind, captured after the
  // first such step ran normally (and again whenever memory it captured was reallocated).
  const bool graphable = graphs_ && T == B && (!probs || B <= chunk_);
  const int id = 2 * B + (probs ? 0 : 1);
  if (graphable && !graph_failed_.count(id) && k_->graph_ready(id)) {
    DecodeIO& io = *dio_.at(id);
    std::copy(tokens, tokens + T, io.tokens.begin());
    std::copy(kv_slot_of_.begin(), kv_slot_of_.end(), io.slot.begin());
    std::copy(pos_.begin(), pos_.end(), io.pos.begin());
    std::copy(inv_temp, inv_temp + B, io.inv.begin());
    if (!probs) std::copy(u, u + B, io.u.begin());
    const auto t0 = std::chrono::steady_clock::now();
    k_->replay(id);
    if (probs) {
      k_->to_host(probs, a_->logits, (size_t)B * V);
    } else {
      std::copy(io.token.begin(), io.token.end(), token);
      std::copy(io.logp.begin(), io.logp.end(), logp);
    }
    prof_[(int)Phase::graph] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int b = 0; b < B; b++) kv_len_[slots[b]] += 1;
    return;
  }
  const Batch batch{tokens, T, nullptr, 0};
  const Cached c{kv_slot_of_.data(), pos_.data()};
  forward_trunk(batch, &c);
  for (int b = 0; b < B; b++) kv_len_[slots[b]] += counts[b];
  Acts& a = *a_;
  // The last token of each slot: contiguous when every count is 1 (decode), gathered into scratch otherwise.
  const float* rows = a.lnf;
  if (T != B) {
    for (int b = 0, t = 0; b < B; b++) {
      t += counts[b];
      k_->copy(a.dln + (size_t)b * H, a.lnf + (size_t)(t - 1) * H, (size_t)H);
    }
    rows = a.dln;
  }
  extend_head(rows, B, inv_temp, probs, u, token, logp);
  // captured on the second such step of a batch size (a size seen once, as while requests join, costs no capture)
  if (graphable && !graph_failed_.count(id) && ++eager_steps_[id] >= 2) capture_decode(id, B, probs != nullptr);
}

void Model::zero_grad() {
  need_training("zeroGrad");
  k_->zero(dev_[1], ntrain_);
}

double Model::grad_norm() {
  need_training("gradNorm");
  k_->set_threads(threads_);
  double ss = 0;
  PROF(optimizer, ss = k_->sum_squares(dev_[1], ntrain_));
  return std::sqrt(ss);
}

void Model::scale_grads(float s) {
  need_training("scaleGrads");
  k_->set_threads(threads_);
  PROF(optimizer, k_->scale(dev_[1], ntrain_, s));
}

void Model::adamw_step(const AdamWParams& p) {
  need_training("adamwStep");
  k_->set_threads(threads_);
  step_ += 1;
  const float bc1 = (float)(1.0 - std::pow((double)p.beta1, (double)step_));
  const float bc2 = (float)(1.0 - std::pow((double)p.beta2, (double)step_));
  // Padding between tensors stays zero in params, grads and moments, so one pass over the block is exact.
  PROF(optimizer, k_->adamw(dev_[0] + train_off_ + opt_begin_, dev_[1] + opt_begin_, dev_[2], dev_[3], opt_n_, p.lr,
                            p.beta1, p.beta2, p.eps, p.weight_decay, bc1, bc2));
}

}  // namespace rls
