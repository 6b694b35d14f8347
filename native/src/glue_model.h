// N-API wrapper class of Model (declarations): one method per operation, each a thin layer over model.h.
#pragma once
#include <napi.h>

#include <functional>
#include <memory>
#include <vector>

#include "model.h"

namespace rls {

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit ModelWrap(const Napi::CallbackInfo& info);
  // The live Model behind a NativeModel object passed to another part of the addon (the NCCL glue's collectives
  // over a model's blocks); throws naming `op` where v is not a NativeModel, the model was disposed, or it is busy.
  static Model& idle_model(const Napi::Value& v, const char* op);

 private:
  Model& live(const char* op);
  Napi::Promise launch(Napi::Env env, std::function<void()> job, std::function<Napi::Value(Napi::Env)> done,
                       std::vector<Napi::Value> keep);
  Napi::Promise launch_backward(Napi::Env env, const Batch& b, const int32_t* targets, std::shared_ptr<TokenLoss> loss,
                                std::function<double()> value, const char* what,
                                std::function<Napi::Value(Napi::Env)> done, std::vector<Napi::Value> keep);
  Napi::Value NumParameters(const Napi::CallbackInfo& info);
  Napi::Value Tensors(const Napi::CallbackInfo& info);
  Napi::Value Upload(const Napi::CallbackInfo& info);
  Napi::Value Forward(const Napi::CallbackInfo& info);
  Napi::Value BackwardCrossEntropy(const Napi::CallbackInfo& info);
  Napi::Value BackwardPolicyLoss(const Napi::CallbackInfo& info);
  Napi::Value KvReserve(const Napi::CallbackInfo& info);
  Napi::Value ActivationBytes(const Napi::CallbackInfo& info);
  Napi::Value KvBytes(const Napi::CallbackInfo& info);
  Napi::Value KvLength(const Napi::CallbackInfo& info);
  Napi::Value KvTruncate(const Napi::CallbackInfo& info);
  Napi::Value Extend(const Napi::CallbackInfo& info);
  Napi::Value ExtendSample(const Napi::CallbackInfo& info);
  Napi::Value ZeroGrad(const Napi::CallbackInfo& info);
  Napi::Value CopyParamsFrom(const Napi::CallbackInfo& info);
  Napi::Value MergeLora(const Napi::CallbackInfo& info);
  Napi::Value GradNorm(const Napi::CallbackInfo& info);
  Napi::Value ClipGradNorm(const Napi::CallbackInfo& info);
  Napi::Value AdamwStep(const Napi::CallbackInfo& info);
  Napi::Value GetStep(const Napi::CallbackInfo& info);
  Napi::Value SetStep(const Napi::CallbackInfo& info);
  Napi::Value TrainRange(const Napi::CallbackInfo& info);
  Napi::Value SetOptimizerShard(const Napi::CallbackInfo& info);
  Napi::Value OptimizerShard(const Napi::CallbackInfo& info);
  Napi::Value ParamsWritten(const Napi::CallbackInfo& info);
  Napi::Value BlockView(const Napi::CallbackInfo& info);
  Napi::Value MomentShard(const Napi::CallbackInfo& info);
  Napi::Value UploadMomentShard(const Napi::CallbackInfo& info);
  Napi::Value Profile(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);

  std::unique_ptr<Model> model_;
};

}  // namespace rls
