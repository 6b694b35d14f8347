// N-API glue for Model: argument checks on the main thread, then one JobWorker per long call (forward, backward,
// optimizer step) so the event loop stays free. A model runs one call at a time; a second is rejected here (the
// TS layer queues, so this is the last line of defence).
#include "glue_model.h"

#include <memory>
#include <string>

#include "glue.h"
#include "losses.h"
#include "model.h"

namespace rls {

namespace {

ModelConfig config_from_js(const Napi::Value& v) {
  if (!v.IsObject()) invalid("config must be an object");
  Napi::Object o = v.As<Napi::Object>();
  auto integer = [&](const char* key) {
    Napi::Value x = o.Get(key);
    if (!x.IsNumber()) invalid(std::string("config.") + key + " must be a number");
    const double d = x.As<Napi::Number>().DoubleValue();
    if (!std::isfinite(d) || d != std::floor(d) || d < -2147483648.0 || d > 2147483647.0)
      invalid(std::string("config.") + key + " must be an integer, got " + std::to_string(d));
    return (int)d;
  };
  auto real = [&](const char* key) { return num_arg(o.Get(key), std::string("config.") + key); };
  auto flag = [&](const char* key, bool dflt) {
    Napi::Value x = o.Get(key);
    if (x.IsUndefined() || x.IsNull()) return dflt;
    if (!x.IsBoolean()) invalid(std::string("config.") + key + " must be a boolean");
    return x.As<Napi::Boolean>().Value();
  };
  ModelConfig c;
  c.hidden_size = integer("hidden_size");
  c.num_hidden_layers = integer("num_hidden_layers");
  c.num_attention_heads = integer("num_attention_heads");
  c.num_key_value_heads = integer("num_key_value_heads");
  c.intermediate_size = integer("intermediate_size");
  c.vocab_size = integer("vocab_size");
  c.rope_theta = real("rope_theta");
  c.rms_norm_eps = real("rms_norm_eps");
  c.tie_word_embeddings = flag("tie_word_embeddings", false);
  c.max_position_embeddings = integer("max_position_embeddings");
  c.attention_bias = flag("attention_bias", false);
  // Keys of core/weights/model-config.ts (HF names): head_dim, model_type (qwen3: per-head q/k norms),
  // sliding_window (null: none), rope_scaling (null or { rope_type: 'llama3', factor, ... }).
  auto optional_int = [&](const char* key) {
    Napi::Value x = o.Get(key);
    return x.IsUndefined() || x.IsNull() ? 0 : integer(key);
  };
  c.head_dim_set = optional_int("head_dim");
  c.sliding_window = optional_int("sliding_window");
  Napi::Value mt = o.Get("model_type");
  c.qk_norm = mt.IsString() && mt.As<Napi::String>().Utf8Value() == "qwen3";
  Napi::Value rs = o.Get("rope_scaling");
  if (!rs.IsUndefined() && !rs.IsNull()) {
    if (!rs.IsObject()) invalid("config.rope_scaling must be an object or null");
    Napi::Object r = rs.As<Napi::Object>();
    Napi::Value type = r.Get("rope_type");
    if (!type.IsString() || type.As<Napi::String>().Utf8Value() != "llama3")
      invalid("config.rope_scaling.rope_type must be 'llama3' (the one scaling supported)");
    c.rope_scaling = 1;
    c.rope_factor = num_arg(r.Get("factor"), "config.rope_scaling.factor");
    c.rope_low_freq_factor = num_arg(r.Get("low_freq_factor"), "config.rope_scaling.low_freq_factor");
    c.rope_high_freq_factor = num_arg(r.Get("high_freq_factor"), "config.rope_scaling.high_freq_factor");
    const double om = num_arg(r.Get("original_max_position_embeddings"), "config.rope_scaling.original_max_position_embeddings");
    if (om != std::floor(om) || om < 1 || om > (1 << 24))
      invalid("config.rope_scaling.original_max_position_embeddings must be a positive integer");
    c.rope_original_max_position_embeddings = (int)om;
  }
  validate_config(c);
  return c;
}

Agg agg_from(const std::string& s) {
  if (s == "token-mean") return Agg::TokenMean;
  if (s == "seq-mean-token-sum") return Agg::SeqMeanTokenSum;
  if (s == "seq-mean-token-mean") return Agg::SeqMeanTokenMean;
  invalid("options.aggregation must be 'token-mean', 'seq-mean-token-sum' or 'seq-mean-token-mean', got '" + s + "'");
}

KlType kl_from(const std::string& s) {
  if (s == "k1") return KlType::K1;
  if (s == "k2") return KlType::K2;
  if (s == "k3") return KlType::K3;
  invalid("options.klType must be 'k1', 'k2' or 'k3', got '" + s + "'");
}

}  // namespace

Napi::Function ModelWrap::Init(Napi::Env env) {
  return DefineClass(env, "NativeModel",
                     {InstanceMethod("numParameters", &ModelWrap::NumParameters),
                      InstanceMethod("tensors", &ModelWrap::Tensors),
                      InstanceMethod("upload", &ModelWrap::Upload),
                      InstanceMethod("forward", &ModelWrap::Forward),
                      InstanceMethod("backwardCrossEntropy", &ModelWrap::BackwardCrossEntropy),
                      InstanceMethod("backwardPolicyLoss", &ModelWrap::BackwardPolicyLoss),
                      InstanceMethod("kvReserve", &ModelWrap::KvReserve),
                      InstanceMethod("activationBytes", &ModelWrap::ActivationBytes),
                      InstanceMethod("kvBytes", &ModelWrap::KvBytes),
                      InstanceMethod("kvLength", &ModelWrap::KvLength),
                      InstanceMethod("kvTruncate", &ModelWrap::KvTruncate),
                      InstanceMethod("extend", &ModelWrap::Extend),
                      InstanceMethod("extendSample", &ModelWrap::ExtendSample),
                      InstanceMethod("zeroGrad", &ModelWrap::ZeroGrad),
                      InstanceMethod("copyParamsFrom", &ModelWrap::CopyParamsFrom),
                      InstanceMethod("mergeLora", &ModelWrap::MergeLora),
                      InstanceMethod("gradNorm", &ModelWrap::GradNorm),
                      InstanceMethod("clipGradNorm", &ModelWrap::ClipGradNorm),
                      InstanceMethod("adamwStep", &ModelWrap::AdamwStep),
                      InstanceMethod("getStep", &ModelWrap::GetStep),
                      InstanceMethod("setStep", &ModelWrap::SetStep),
                      InstanceMethod("trainRange", &ModelWrap::TrainRange),
                      InstanceMethod("setOptimizerShard", &ModelWrap::SetOptimizerShard),
                      InstanceMethod("optimizerShard", &ModelWrap::OptimizerShard),
                      InstanceMethod("paramsWritten", &ModelWrap::ParamsWritten),
                      InstanceMethod("blockView", &ModelWrap::BlockView),
                      InstanceMethod("momentShard", &ModelWrap::MomentShard),
                      InstanceMethod("uploadMomentShard", &ModelWrap::UploadMomentShard),
                      InstanceMethod("profile", &ModelWrap::Profile),
                      InstanceMethod("dispose", &ModelWrap::Dispose)});
}

// new NativeModel(config, { seed, threads, initStd, logitChunkTokens, random, device: 'cpu' | 'cuda', trainable })
ModelWrap::ModelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ModelWrap>(info) {
  Napi::Env env = info.Env();
  guard(env, [&] {
    const ModelConfig c = config_from_js(info[0]);
    if (!info[1].IsObject()) invalid("options must be an object");
    Napi::Object o = info[1].As<Napi::Object>();
    const int threads = (int)num_arg(o.Get("threads"), "options.threads");
    const int chunk = o.Get("logitChunkTokens").IsUndefined() ? 0 : (int)num_arg(o.Get("logitChunkTokens"), "options.logitChunkTokens");
    Device device = Device::Cpu;
    const Napi::Value dv = o.Get("device");
    if (!dv.IsUndefined() && !dv.IsNull()) {
      const std::string d = dv.IsString() ? dv.As<Napi::String>().Utf8Value() : "";
      if (d == "cuda") device = Device::Cuda;
      else if (d != "cpu") invalid("options.device must be 'cpu' or 'cuda'");
    }
    const Napi::Value tv = o.Get("trainable");
    const bool trainable = tv.IsUndefined() || tv.ToBoolean().Value();
    // lora: { rank, alpha, targets: ['q_proj', ...], seed } (native/model.ts checks it first, naming the option)
    LoraConfig lora;
    const Napi::Value lv = o.Get("lora");
    double lora_seed = 0;
    if (!lv.IsUndefined() && !lv.IsNull()) {
      if (!lv.IsObject()) invalid("options.lora must be an object");
      Napi::Object lo = lv.As<Napi::Object>();
      const double rank = num_arg(lo.Get("rank"), "options.lora.rank");
      if (rank != std::floor(rank) || rank < 1 || rank > 4096) invalid("options.lora.rank must be an integer in [1, 4096]");
      lora.rank = (int)rank;
      lora.alpha = (float)num_arg(lo.Get("alpha"), "options.lora.alpha");
      const Napi::Value dv = lo.Get("dropout");
      lora.dropout = dv.IsUndefined() ? 0.f : (float)num_arg(dv, "options.lora.dropout");
      lora_seed = num_arg(lo.Get("seed"), "options.lora.seed");
      lora.seed = (uint64_t)(int64_t)lora_seed;
      const Napi::Value tg = lo.Get("targets");
      if (!tg.IsArray()) invalid("options.lora.targets must be an array of projection names");
      Napi::Array arr = tg.As<Napi::Array>();
      for (uint32_t i = 0; i < arr.Length(); i++) {
        const Napi::Value e = arr.Get(i);
        const std::string name = e.IsString() ? e.As<Napi::String>().Utf8Value() : "";
        int found = -1;
        for (int t = 0; t < LoraTargets; t++)
          if (name == kLoraTargetNames[t]) found = t;
        if (found < 0) invalid("options.lora.targets[" + std::to_string(i) + "] is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
        lora.targets |= 1u << found;
      }
    }
    model_ = std::make_unique<Model>(c, threads, chunk, device, trainable, lora);
    const Napi::Value rv = o.Get("recompute");
    if (!rv.IsUndefined() && !rv.IsNull()) {
      const std::string r = rv.IsString() ? rv.As<Napi::String>().Utf8Value() : "";
      if (r != "none" && r != "layer") invalid("options.recompute must be 'none' or 'layer'");
      model_->set_recompute(r == "layer");
    }
    if (o.Get("random").ToBoolean().Value()) {
      const double seed = num_arg(o.Get("seed"), "options.seed");
      const double std_ = num_arg(o.Get("initStd"), "options.initStd");
      if (std_ < 0) invalid("options.initStd must be >= 0");
      model_->init_random((uint64_t)(int64_t)seed, (float)std_);
    }
    if (lora.rank > 0) model_->init_lora((uint64_t)(int64_t)lora_seed);
  });
}

Model& ModelWrap::live(const char* op) {
  if (!model_) invalid(std::string("model.") + op + ": the model was disposed");
  if (model_->busy.load())
    invalid(std::string("model.") + op + ": another call on this model is still running; await it first");
  return *model_;
}

Napi::Value ModelWrap::NumParameters(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    if (!model_) invalid("model.numParameters: the model was disposed");
    size_t n = 0;
    for (const auto& t : model_->tensors()) n += t.numel;
    return Napi::Number::New(info.Env(), (double)n);
  });
}

// tensors(kind): [{ name, shape, data }] with data a zero-copy Float32Array over the block; the block stays alive
// as long as any view does, even after dispose().
// A Float32Array over floats [at, at + n) of `block`, which stays alive as long as the array does.
static Napi::Float32Array block_view(Napi::Env env, const Block& block, size_t at, size_t n) {
  auto* hold = new Block(block);
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, block.get() + at, n * sizeof(float), [](Napi::Env, void*, Block* h) { delete h; }, hold);
  return Napi::Float32Array::New(env, n, ab, 0);
}

Napi::Value ModelWrap::Tensors(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    if (!model_) invalid("model.tensors: the model was disposed");
    const std::string kind = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    Block block;
    BlockKind bk;
    if (kind == "params") block = model_->params(), bk = BlockKind::Params;
    else if (kind == "grads") block = model_->grads(), bk = BlockKind::Grads;
    else if (kind == "exp_avg") block = model_->adam_m(), bk = BlockKind::ExpAvg;
    else if (kind == "exp_avg_sq") block = model_->adam_v(), bk = BlockKind::ExpAvgSq;
    else invalid("tensors(kind): kind must be 'params', 'grads', 'exp_avg' or 'exp_avg_sq'");
    if (bk != BlockKind::Params) model_->need_training("tensors");
    // On the CPU too, not only in download(): the views below would reach past a shard's shorter block.
    if ((bk == BlockKind::ExpAvg || bk == BlockKind::ExpAvgSq) && model_->optimizer_sharded())
      invalid("tensors: this model's AdamW moments are one ZeRO-1 shard, not laid out as its tensors");
    // A device model refreshes the host mirror first: the views are a snapshot of the device block.
    if (model_->device() != Device::Cpu) live("tensors").download(bk);
    const auto& ts = model_->tensors();
    // Gradients and moments cover the trained tensors only (the adapters, where there are any).
    const size_t base = bk == BlockKind::Params ? 0 : model_->train_offset();
    size_t count = 0;
    for (const TensorInfo& t : ts) count += bk == BlockKind::Params || model_->trained(t);
    Napi::Array out = Napi::Array::New(env, count);
    uint32_t j = 0;
    for (size_t i = 0; i < ts.size(); i++) {
      const TensorInfo& t = ts[i];
      if (bk != BlockKind::Params && !model_->trained(t)) continue;
      Napi::Object e = Napi::Object::New(env);
      e.Set("name", t.name);
      // Where it starts in its block (tensors may be padded apart, so this is not the sum of the lengths before it).
      e.Set("offset", (double)(t.offset - base));
      Napi::Array shape = Napi::Array::New(env, t.shape.size());
      for (size_t d = 0; d < t.shape.size(); d++) shape.Set((uint32_t)d, Napi::Number::New(env, (double)t.shape[d]));
      e.Set("shape", shape);
      e.Set("data", block_view(env, block, t.offset - base, t.numel));
      out.Set(j++, e);
    }
    return out;
  });
}

// upload(kind): host mirror -> device block after JS wrote into the views (loading weights or optimizer state).
// A no-op on the CPU, where the views are the model's memory.
Napi::Value ModelWrap::Upload(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("upload");
    const std::string kind = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    if (kind == "params") m.upload(BlockKind::Params);
    else if (kind == "grads") m.upload(BlockKind::Grads);
    else if (kind == "exp_avg") m.upload(BlockKind::ExpAvg);
    else if (kind == "exp_avg_sq") m.upload(BlockKind::ExpAvgSq);
    else invalid("upload(kind): kind must be 'params', 'grads', 'exp_avg' or 'exp_avg_sq'");
    return info.Env().Undefined();
  });
}

struct BatchArgs {
  View<int32_t> tokens, seq_starts, targets;
  Batch batch;
};

// tokens, seqStarts, targets at info[0..2]; targets: -1 or a valid id at every position.
static BatchArgs batch_args(const Napi::CallbackInfo& info, const Model& m) {
  BatchArgs a;
  a.tokens = i32_arg(info[0], "batch.tokens");
  a.seq_starts = i32_arg(info[1], "batch.seqStarts");
  a.targets = i32_arg(info[2], "targets");
  if (a.tokens.length > (size_t)1 << 30) invalid("batch.tokens is too long");
  a.batch.tokens = a.tokens.data;
  a.batch.T = (int)a.tokens.length;
  a.batch.seq_starts = a.seq_starts.data;
  a.batch.S = (int)a.seq_starts.length - 1;
  if (a.seq_starts.length < 2) invalid("batch.seqStarts must hold at least 2 entries (cu_seqlens [0, ..., T])");
  m.validate_batch(a.batch);
  check_length(a.targets.length, a.tokens.length, "targets");
  const int V = m.config().vocab_size;
  for (size_t t = 0; t < a.targets.length; t++)
    if (a.targets.data[t] < -1 || a.targets.data[t] >= V)
      invalid("targets[" + std::to_string(t) + "] = " + std::to_string(a.targets.data[t]) +
              " is out of range [0, " + std::to_string(V) + ") (use -1 for positions without a target)");
  return a;
}

static View<float> response_mask_arg(const Napi::Value& v, const BatchArgs& a) {
  View<float> response_mask = f32_arg(v, "response_mask");
  check_length(response_mask.length, a.tokens.length, "response_mask");
  check_finite(response_mask, "response_mask");
  for (size_t t = 0; t < response_mask.length; t++) {
    if (response_mask.data[t] < 0) invalid("response_mask[" + std::to_string(t) + "] is negative");
    if (response_mask.data[t] != 0 && a.targets.data[t] < 0)
      invalid("targets[" + std::to_string(t) + "] is -1 where response_mask[" + std::to_string(t) + "] is not 0");
  }
  return response_mask;
}

Napi::Promise ModelWrap::launch(Napi::Env env, std::function<void()> job, std::function<Napi::Value(Napi::Env)> done,
                                std::vector<Napi::Value> keep) {
  Model* m = model_.get();
  m->busy.store(true);
  keep.push_back(Value());
  auto* w = new JobWorker(env, std::move(job), std::move(done), [m] { m->busy.store(false); }, keep);
  Napi::Promise p = w->promise();
  w->Queue();
  return p;
}

// forward_backward on a worker. A loss that is not finite rejects the call: the gradients it accumulated are
// unusable, and the caller must know before it steps the optimizer. value() reads the loss after the pass.
Napi::Promise ModelWrap::launch_backward(Napi::Env env, const Batch& b, const int32_t* targets,
                                         std::shared_ptr<TokenLoss> loss, std::function<double()> value,
                                         const char* what, std::function<Napi::Value(Napi::Env)> done,
                                         std::vector<Napi::Value> keep) {
  Model* mp = model_.get();
  return launch(
      env,
      [=] {
        mp->forward_backward(b, targets, *loss);
        const double l = value();
        if (!std::isfinite(l))
          non_finite(std::string(what) + " is not finite (" + std::to_string(l) +
                     "); gradients of this call are unusable: zeroGrad() before the next step");
      },
      std::move(done), std::move(keep));
}

// forward(tokens, seqStarts, targets, outLogprobs, outEntropy) -> Promise<void>
Napi::Value ModelWrap::Forward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("forward");
    BatchArgs a = batch_args(info, m);
    View<float> lp = f32_arg(info[3], "out.logprobs"), ent = f32_arg(info[4], "out.entropy");
    check_length(lp.length, a.tokens.length, "out.logprobs");
    check_length(ent.length, a.tokens.length, "out.entropy");
    Model* mp = &m;
    Batch b = a.batch;
    const int32_t* tg = a.targets.data;
    float *lpp = lp.data, *entp = ent.data;
    return launch(
        env, [=] { mp->forward_logprobs(b, tg, lpp, entp); }, [](Napi::Env e) { return e.Undefined(); },
        {a.tokens.holder, a.seq_starts.holder, a.targets.holder, lp.holder, ent.holder});
  });
}

// backwardCrossEntropy(tokens, seqStarts, targets, response_mask, lossScale) -> Promise<{ loss, tokens }>
Napi::Value ModelWrap::BackwardCrossEntropy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("backwardCrossEntropy");
    m.need_training("backwardCrossEntropy");
    BatchArgs a = batch_args(info, m);
    View<float> response_mask = response_mask_arg(info[3], a);
    const double scale = num_arg(info[4], "options.lossScale");
    auto loss = std::make_shared<CrossEntropyLoss>(response_mask.data, a.seq_starts.data, a.batch.S, a.batch.T, (float)scale);
    return launch_backward(
        env, a.batch, a.targets.data, loss, [loss] { return (double)loss->loss(); }, "cross-entropy loss",
        [loss](Napi::Env e) -> Napi::Value {
          Napi::Object r = Napi::Object::New(e);
          r.Set("loss", loss->loss());
          r.Set("tokens", loss->tokens());
          return r;
        },
        {a.tokens.holder, a.seq_starts.holder, a.targets.holder, response_mask.holder});
  });
}

// backwardPolicyLoss(tokens, seqStarts, targets, response_mask, advantages, behaviour, proximal|null, ref|null, options)
// options: { loss ('ppo' | 'gspo' | 'cispo'), clipLow, clipHigh, dualClipC (0 = off), correction ('off' |
// 'truncate' | 'mask'), correctionLevel ('token' | 'sequence'), iwCap, maskLow, maskHigh, klCoef, klType,
// entropyCoef, aggregation, lossScale } all given (the TS layer fills defaults).
Napi::Value ModelWrap::BackwardPolicyLoss(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("backwardPolicyLoss");
    m.need_training("backwardPolicyLoss");
    BatchArgs a = batch_args(info, m);
    View<float> response_mask = response_mask_arg(info[3], a);
    std::vector<Napi::Value> keep{a.tokens.holder, a.seq_starts.holder, a.targets.holder, response_mask.holder};
    // One finite float per token, kept alive for the worker; an optional one may be null or undefined.
    auto per_token = [&](const Napi::Value& v, const char* what) -> const float* {
      View<float> x = f32_arg(v, what);
      check_length(x.length, a.tokens.length, what);
      check_finite(x, what);
      keep.push_back(x.holder);
      return x.data;
    };
    auto optional = [&](const Napi::Value& v, const char* what) -> const float* {
      return v.IsNull() || v.IsUndefined() ? nullptr : per_token(v, what);
    };
    PolicyLossInputs in;
    in.response_mask = response_mask.data;
    in.advantages = per_token(info[4], "inputs.advantages");
    in.behaviour = per_token(info[5], "inputs.behaviourLogprobs");
    in.proximal = optional(info[6], "inputs.proximalLogprobs");
    in.ref = optional(info[7], "inputs.refLogprobs");
    if (!info[8].IsObject()) invalid("options must be an object");
    Napi::Object o = info[8].As<Napi::Object>();
    PolicyLossOptions opt;
    opt.clip_low = num_arg(o.Get("clipLow"), "options.clipLow");
    opt.clip_high = num_arg(o.Get("clipHigh"), "options.clipHigh");
    opt.dual_clip_c = num_arg(o.Get("dualClipC"), "options.dualClipC");
    opt.iw_cap = num_arg(o.Get("iwCap"), "options.iwCap");
    opt.mask_low = num_arg(o.Get("maskLow"), "options.maskLow");
    opt.mask_high = num_arg(o.Get("maskHigh"), "options.maskHigh");
    if (!o.Get("loss").IsString() || !o.Get("correction").IsString() || !o.Get("correctionLevel").IsString())
      invalid("options.loss, options.correction and options.correctionLevel must be strings");
    const std::string loss_name = o.Get("loss").As<Napi::String>().Utf8Value();
    const PolicyLossEntry* entry = policy_loss_by_name(loss_name.c_str());
    if (!entry) invalid("options.loss: unknown policy loss '" + loss_name + "'");
    opt.kind = entry->kind;
    const std::string corr = o.Get("correction").As<Napi::String>().Utf8Value();
    if (corr == "off") opt.correction = CorrectionMode::Off;
    else if (corr == "truncate") opt.correction = CorrectionMode::Truncate;
    else if (corr == "mask") opt.correction = CorrectionMode::Mask;
    else invalid("options.correction must be 'off', 'truncate' or 'mask', got '" + corr + "'");
    const std::string level = o.Get("correctionLevel").As<Napi::String>().Utf8Value();
    if (level == "token") opt.correction_level = CorrectionLevel::Token;
    else if (level == "sequence") opt.correction_level = CorrectionLevel::Sequence;
    else invalid("options.correctionLevel must be 'token' or 'sequence', got '" + level + "'");
    opt.kl_coef = num_arg(o.Get("klCoef"), "options.klCoef");
    opt.entropy_coef = num_arg(o.Get("entropyCoef"), "options.entropyCoef");
    opt.scale = num_arg(o.Get("lossScale"), "options.lossScale");
    if (!o.Get("klType").IsString() || !o.Get("aggregation").IsString())
      invalid("options.klType and options.aggregation must be strings");
    opt.kl_type = kl_from(o.Get("klType").As<Napi::String>().Utf8Value());
    opt.agg = agg_from(o.Get("aggregation").As<Napi::String>().Utf8Value());
    if (opt.kind == PolicyLossKind::Cispo ? (opt.clip_low < 0 || opt.clip_low > 1) : (opt.clip_low < 0 || opt.clip_low >= 1))
      invalid(opt.kind == PolicyLossKind::Cispo ? "options.clipLow must be in [0, 1] (1: no lower bound)" : "options.clipLow must be in [0, 1)");
    if (opt.clip_high < 0) invalid("options.clipHigh must be >= 0");
    if (opt.dual_clip_c != 0 && opt.dual_clip_c <= 1) invalid("options.dualClipC must be > 1 (or null to disable)");
    if (opt.iw_cap < 0) invalid("options.iwCap must be > 0 (or null to disable)");
    if (opt.correction == CorrectionMode::Mask && !(opt.mask_low >= 0 && opt.mask_low < opt.mask_high))
      invalid("options.maskLow and options.maskHigh must satisfy 0 <= maskLow < maskHigh");
    if (opt.kind != PolicyLossKind::Ppo && opt.dual_clip_c != 0) invalid("options.dualClipC applies to the ppo loss only");
    if (opt.kl_coef != 0 && !in.ref) invalid("options.klCoef is not 0 but inputs.refLogprobs is missing");

    auto loss = std::make_shared<PolicyLoss>(in, opt, a.seq_starts.data, a.batch.S, a.batch.T);
    return launch_backward(
        env, a.batch, a.targets.data, loss, [loss] { return (double)loss->metrics().loss; }, "policy loss",
        [loss](Napi::Env e) -> Napi::Value {
          const PolicyLossMetrics r = loss->metrics();
          Napi::Object o2 = Napi::Object::New(e);
          o2.Set("loss", r.loss);
          o2.Set("pgLoss", r.pg_loss);
          o2.Set("clipFraction", r.clip_fraction);
          o2.Set("dualClipFraction", r.dual_clip_fraction);
          o2.Set("approxKl", r.approx_kl);
          o2.Set("entropy", r.entropy);
          o2.Set("kl", r.kl);
          o2.Set("iwMean", r.iw_mean);
          o2.Set("iwMax", r.iw_max);
          o2.Set("iwTruncatedFraction", r.iw_truncated_fraction);
          o2.Set("iwMaskedFraction", r.iw_masked_fraction);
          o2.Set("tokens", r.tokens);
          return o2;
        },
        keep);
  });
}

static int int_arg(const Napi::Value& v, const std::string& what) {
  const double d = num_arg(v, what);
  if (d != std::floor(d) || d < -2147483648.0 || d > 2147483647.0) invalid(what + " must be an integer, got " + std::to_string(d));
  return (int)d;
}

// activationBytes(tokens) -> bytes of the activations a step of that many tokens allocates.
Napi::Value ModelWrap::ActivationBytes(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), live("activationBytes").activation_bytes(int_arg(info[0], "tokens")));
  });
}

// kvBytes(slots, maxLen) -> bytes kvReserve(slots, maxLen) allocates.
Napi::Value ModelWrap::KvBytes(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), live("kvBytes").kv_bytes(int_arg(info[0], "slots"), int_arg(info[1], "maxLen")));
  });
}

// kvReserve(slots, maxLen): allocates the KV cache (replacing any previous one; every slot starts empty).
Napi::Value ModelWrap::KvReserve(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    live("kvReserve").kv_reserve(int_arg(info[0], "slots"), int_arg(info[1], "maxLen"));
    return info.Env().Undefined();
  });
}

Napi::Value ModelWrap::KvLength(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), live("kvLength").kv_length(int_arg(info[0], "slot")));
  });
}

Napi::Value ModelWrap::KvTruncate(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    live("kvTruncate").kv_truncate(int_arg(info[0], "slot"), int_arg(info[1], "length"));
    return info.Env().Undefined();
  });
}

// extend(slots, counts, tokens, invTemperature, outProbs [B*V]) -> Promise<void>
Napi::Value ModelWrap::Extend(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("extend");
    View<int32_t> slots = i32_arg(info[0], "slots"), counts = i32_arg(info[1], "counts"), tokens = i32_arg(info[2], "tokens");
    View<float> inv = f32_arg(info[3], "invTemperature"), out = f32_arg(info[4], "out.probs");
    if (counts.length != slots.length) invalid("extend: counts has length " + std::to_string(counts.length) + ", slots " + std::to_string(slots.length));
    if (inv.length != slots.length) invalid("extend: invTemperature has length " + std::to_string(inv.length) + ", slots " + std::to_string(slots.length));
    if (tokens.length > (size_t)1 << 30 || slots.length > (size_t)1 << 24) invalid("extend: too many tokens");
    const int B = (int)slots.length, T = (int)tokens.length;
    m.validate_extend(slots.data, counts.data, B, tokens.data, T, inv.data);
    if (out.length != (size_t)B * m.config().vocab_size)
      invalid("extend: out.probs has length " + std::to_string(out.length) + ", expected slots x vocab_size = " +
              std::to_string((size_t)B * m.config().vocab_size));
    Model* mp = &m;
    const int32_t *sp = slots.data, *cp = counts.data, *tp = tokens.data;
    const float* ip = inv.data;
    float* op = out.data;
    return launch(
        env, [=] { mp->extend(sp, cp, B, tp, T, ip, op); }, [](Napi::Env e) { return e.Undefined(); },
        {slots.holder, counts.holder, tokens.holder, inv.holder, out.holder});
  });
}

// extendSample(slots, counts, tokens, invTemperature, uniforms Float64Array [B], outTokens Int32Array [B],
// outLogprobs Float32Array [B]) -> Promise<void>: extend with one token drawn per slot where the rows are.
Napi::Value ModelWrap::ExtendSample(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("extendSample");
    View<int32_t> slots = i32_arg(info[0], "slots"), counts = i32_arg(info[1], "counts"), tokens = i32_arg(info[2], "tokens");
    View<float> inv = f32_arg(info[3], "invTemperature");
    View<double> u = f64_arg(info[4], "uniforms");
    View<int32_t> tok = i32_arg(info[5], "out.tokens");
    View<float> lp = f32_arg(info[6], "out.logprobs");
    const size_t B = slots.length;
    if (counts.length != B || inv.length != B || u.length != B || tok.length != B || lp.length != B)
      invalid("extendSample: counts, invTemperature, uniforms and the outputs must have one entry per slot (" + std::to_string(B) + ")");
    if (tokens.length > (size_t)1 << 30 || B > (size_t)1 << 24) invalid("extendSample: too many tokens");
    for (size_t b = 0; b < B; b++)
      if (!(std::isfinite(u.data[b]) && u.data[b] < 1))
        invalid("extendSample: uniforms[" + std::to_string(b) + "] must be in [0, 1) (or negative for the arg-max), got " + std::to_string(u.data[b]));
    m.validate_extend(slots.data, counts.data, (int)B, tokens.data, (int)tokens.length, inv.data);
    Model* mp = &m;
    const int32_t *sp = slots.data, *cp = counts.data, *tp = tokens.data;
    const float* ip = inv.data;
    const double* up = u.data;
    int32_t* op = tok.data;
    float* lpp = lp.data;
    const int Bi = (int)B, T = (int)tokens.length;
    return launch(
        env, [=] { mp->extend(sp, cp, Bi, tp, T, ip, nullptr, up, op, lpp); }, [](Napi::Env e) { return e.Undefined(); },
        {slots.holder, counts.holder, tokens.holder, inv.holder, u.holder, tok.holder, lp.holder});
  });
}

Napi::Value ModelWrap::ZeroGrad(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    live("zeroGrad").zero_grad();
    return info.Env().Undefined();
  });
}

// copyParamsFrom(other NativeModel): this model's weights become a copy of other's, device to device.
Napi::Value ModelWrap::CopyParamsFrom(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("copyParamsFrom");
    if (!info[0].IsObject()) invalid("copyParamsFrom(model): model must be a NativeModel");
    ModelWrap* other = ModelWrap::Unwrap(info[0].As<Napi::Object>());
    m.copy_params_from(other->live("copyParamsFrom (source)"));
    return info.Env().Undefined();
  });
}

// mergeLora(layer, target, A, B, rank, scale): W += scale * B A on layer's projection `target` (a HF module name).
Napi::Value ModelWrap::MergeLora(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("mergeLora");
    const double layer = num_arg(info[0], "layer");
    const std::string name = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    int target = -1;
    for (int t = 0; t < LoraTargets; t++)
      if (name == kLoraTargetNames[t]) target = t;
    if (target < 0) invalid("mergeLora: target must be one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
    const View<float> A = f32_arg(info[2], "A"), B = f32_arg(info[3], "B");
    const double rank = num_arg(info[4], "rank");
    const double scale = num_arg(info[5], "scale");
    if (rank != std::floor(rank) || rank < 1 || rank > 4096) invalid("mergeLora: rank must be an integer in [1, 4096]");
    if (layer != std::floor(layer) || layer < 0 || layer >= m.config().num_hidden_layers) invalid("mergeLora: layer out of range");
    const ModelConfig& c = m.config();
    const int in[LoraTargets] = {c.hidden_size, c.hidden_size, c.hidden_size, c.q_dim(), c.hidden_size, c.hidden_size, c.intermediate_size};
    const int out[LoraTargets] = {c.q_dim(), c.kv_dim(), c.kv_dim(), c.hidden_size, c.intermediate_size, c.intermediate_size, c.hidden_size};
    check_length(A.length, (size_t)rank * in[target], "A");
    check_length(B.length, (size_t)out[target] * rank, "B");
    check_finite(A, "A");
    check_finite(B, "B");
    m.merge_lora((int)layer, target, A.data, B.data, (int)rank, (float)scale);
    return info.Env().Undefined();
  });
}

Napi::Value ModelWrap::GradNorm(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), live("gradNorm").grad_norm());
  });
}

// clipGradNorm(maxNorm) -> norm before clipping; a non-finite norm throws and leaves the gradients as they are.
Napi::Value ModelWrap::ClipGradNorm(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("clipGradNorm");
    const double max_norm = num_arg(info[0], "maxNorm");
    if (max_norm <= 0) invalid("maxNorm must be > 0");
    const double n = m.grad_norm();
    if (!std::isfinite(n)) non_finite("gradient norm is not finite (" + std::to_string(n) + ")");
    if (n > max_norm) m.scale_grads((float)(max_norm / (n + 1e-6)));
    return Napi::Number::New(info.Env(), n);
  });
}

// adamwStep({ lr, beta1, beta2, eps, weightDecay }) -> Promise<void>
Napi::Value ModelWrap::AdamwStep(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("adamwStep");
    m.need_training("adamwStep");
    if (!info[0].IsObject()) invalid("options must be an object");
    Napi::Object o = info[0].As<Napi::Object>();
    AdamWParams p;
    p.lr = (float)num_arg(o.Get("lr"), "options.lr");
    p.beta1 = (float)num_arg(o.Get("beta1"), "options.beta1");
    p.beta2 = (float)num_arg(o.Get("beta2"), "options.beta2");
    p.eps = (float)num_arg(o.Get("eps"), "options.eps");
    p.weight_decay = (float)num_arg(o.Get("weightDecay"), "options.weightDecay");
    if (p.lr < 0) invalid("options.lr must be >= 0");
    if (p.beta1 < 0 || p.beta1 >= 1) invalid("options.beta1 must be in [0, 1)");
    if (p.beta2 < 0 || p.beta2 >= 1) invalid("options.beta2 must be in [0, 1)");
    if (p.eps <= 0) invalid("options.eps must be > 0");
    if (p.weight_decay < 0) invalid("options.weightDecay must be >= 0");
    Model* mp = &m;
    return launch(env, [=] { mp->adamw_step(p); }, [](Napi::Env e) { return e.Undefined(); }, {});
  });
}

Napi::Value ModelWrap::GetStep(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    if (!model_) invalid("model.step: the model was disposed");
    return Napi::Number::New(info.Env(), (double)model_->step());
  });
}

Napi::Value ModelWrap::SetStep(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const double s = num_arg(info[0], "step");
    if (s < 0 || s != std::floor(s)) invalid("step must be a non-negative integer");
    live("setStep").set_step((int64_t)s);
    return info.Env().Undefined();
  });
}

// trainRange() -> { offset, numel }: the trained floats' place in the parameter block (the gradient block's floats
// 0..numel-1 are parameters offset..offset+numel-1).
Napi::Value ModelWrap::TrainRange(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("trainRange");
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("offset", (double)m.train_offset());
    o.Set("numel", (double)m.train_numel());
    return o;
  });
}

// setOptimizerShard(begin, count): ZeRO-1, this model's AdamW moments for trained floats [begin, begin+count) alone.
Napi::Value ModelWrap::SetOptimizerShard(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    live("setOptimizerShard").set_optimizer_shard(count_arg(info[0], "begin"), count_arg(info[1], "count"));
    return info.Env().Undefined();
  });
}

// optimizerShard() -> { begin, count, sharded }: the trained floats the moments cover.
Napi::Value ModelWrap::OptimizerShard(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("optimizerShard");
    m.need_training("optimizerShard");
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("begin", (double)m.optimizer_begin());
    o.Set("count", (double)m.optimizer_count());
    o.Set("sharded", m.optimizer_sharded());
    return o;
  });
}

// paramsWritten(begin, n): parameters [begin, begin+n) were written by a collective; derived copies are made again.
Napi::Value ModelWrap::ParamsWritten(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    live("paramsWritten").params_written(count_arg(info[0], "begin"), count_arg(info[1], "n"));
    return info.Env().Undefined();
  });
}

// blockView(kind) -> one Float32Array over the whole parameter ('params') or gradient ('grads') block: the
// model's own memory, so only on the CPU (a device model's blocks are reached by collectives on the device).
Napi::Value ModelWrap::BlockView(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("blockView");
    const std::string kind = info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
    if (kind != "params" && kind != "grads") invalid("blockView(kind): kind must be 'params' or 'grads'");
    if (m.device() != Device::Cpu) invalid("blockView: the model is on the GPU; its blocks are device memory, with no host view of their own");
    if (kind == "grads") m.need_training("blockView");
    Block block = kind == "params" ? m.params() : m.grads();
    const size_t n = kind == "params" ? m.num_parameters() : m.train_numel();
    return block_view(env, block, 0, n);
  });
}

static BlockKind moment_kind(const Napi::Value& v, const char* op) {
  const std::string kind = v.IsString() ? v.As<Napi::String>().Utf8Value() : "";
  if (kind == "exp_avg") return BlockKind::ExpAvg;
  if (kind == "exp_avg_sq") return BlockKind::ExpAvgSq;
  invalid(std::string(op) + "(kind): kind must be 'exp_avg' or 'exp_avg_sq'");
}

// momentShard(kind) -> Float32Array of the AdamW moment as the optimizer holds it, flat: optimizerShard().count
// floats from trained float optimizerShard().begin (all of them, in the gradient block's order, when unsharded).
// The model's memory on the CPU; on a GPU a host copy made now (write it back with uploadMomentShard).
Napi::Value ModelWrap::MomentShard(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guard(env, [&]() -> Napi::Value {
    Model& m = live("momentShard");
    m.need_training("momentShard");
    const BlockKind bk = moment_kind(info[0], "momentShard");
    m.download(bk, true);
    Block block = bk == BlockKind::ExpAvg ? m.adam_m() : m.adam_v();
    const size_t n = m.optimizer_count();
    return block_view(env, block, 0, n);
  });
}

// uploadMomentShard(kind): momentShard's host copy back to the device after JS wrote it (a no-op on the CPU).
Napi::Value ModelWrap::UploadMomentShard(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("uploadMomentShard");
    m.need_training("uploadMomentShard");
    m.upload(moment_kind(info[0], "uploadMomentShard"), true);
    return info.Env().Undefined();
  });
}

Model& ModelWrap::idle_model(const Napi::Value& v, const char* op) {
  if (!v.IsObject()) invalid(std::string(op) + ": model must be a NativeModel");
  ModelWrap* w = ModelWrap::Unwrap(v.As<Napi::Object>());
  if (w == nullptr) invalid(std::string(op) + ": model must be a NativeModel");
  return w->live(op);
}

// profile(reset) -> { matmul, attention, elementwise, logits, optimizer, graph } seconds of kernel time
Napi::Value ModelWrap::Profile(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    Model& m = live("profile");
    const double* p = m.profile();
    Napi::Object o = Napi::Object::New(info.Env());
    const char* names[] = {"matmul", "attention", "elementwise", "logits", "optimizer", "graph"};
    for (int i = 0; i < (int)Model::Phase::count; i++) o.Set(names[i], p[i]);
    if (info[0].ToBoolean().Value()) m.reset_profile();
    return o;
  });
}

Napi::Value ModelWrap::Dispose(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    if (model_) {
      live("dispose");
      model_.reset();
    }
    return info.Env().Undefined();
  });
}

}  // namespace rls
