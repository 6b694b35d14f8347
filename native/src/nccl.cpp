// N-API glue of NCCL loaded at run time (nccl_core.cpp): the addon's `nccl` object and cudaDeviceCount. Glue only:
// argument checks, typed arrays in and out, collectives run off the main thread.
#include "nccl_glue.h"

#include <cstring>

#include "glue.h"
#include "glue_model.h"
#include "nccl_core.h"

#ifdef RLSTREAM_CUDA
#include <cuda_runtime.h>
#endif

namespace rls {
namespace {

// A host buffer: Float32Array is fp32, Uint16Array holds bf16 bit patterns.
struct HostBuf {
  void* data = nullptr;
  size_t count = 0;
  NcclType type = NcclType::F32;
  Napi::Value holder;
};

HostBuf host_arg(const Napi::Value& v, const std::string& what) {
  const std::string want = what + " must be a Float32Array (fp32) or a Uint16Array (bf16 bits)";
  if (!v.IsTypedArray()) invalid(want);
  auto ta = v.As<Napi::TypedArray>();
  HostBuf b;
  if (ta.TypedArrayType() == napi_float32_array) b.type = NcclType::F32;
  else if (ta.TypedArrayType() == napi_uint16_array) b.type = NcclType::BF16;
  else invalid(want);
  b.count = ta.ElementLength();
  b.data = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
  b.holder = v;
  return b;
}

Napi::Value collective(const Napi::CallbackInfo& info, NcclOp op) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const int comm = (int)num_arg(info[0], "comm");
    const HostBuf send = host_arg(info[1], "send");
    const bool in_place = op == NcclOp::AllReduce || op == NcclOp::Broadcast;
    const HostBuf recv = in_place ? send : host_arg(info[2], "recv");
    const int root = op == NcclOp::Broadcast ? (int)num_arg(info[2], "root") : 0;
    if (send.type != recv.type) invalid("send and recv must have the same element type");
    nccl_check(comm, op, send.count, recv.count, root);
    auto job = [=] { nccl_run(comm, op, send.type, send.data, send.count, recv.data, recv.count, root); };
    auto* w = new JobWorker(info.Env(), job, [](Napi::Env e) { return e.Undefined(); }, [] {}, {send.holder, recv.holder});
    w->Queue();
    return w->promise();
  });
}

// blockCollective(comm, op, model, kind, sendBegin, sendCount, recvBegin, recvCount, root): a collective over a
// CUDA model's own fp32 block ('params' or 'grads'), in place, queued on the model's stream behind its kernels with
// no host copy (nccl_run_device). Offsets count floats from the block's start. Returns once it is queued: the
// model's next call runs after it, and a value read back to the host waits for it.
Napi::Value BlockCollective(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const int comm = (int)num_arg(info[0], "comm");
    const std::string name = info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
    NcclOp op;
    if (name == "allReduce") op = NcclOp::AllReduce;
    else if (name == "broadcast") op = NcclOp::Broadcast;
    else if (name == "allGather") op = NcclOp::AllGather;
    else if (name == "reduceScatter") op = NcclOp::ReduceScatter;
    else invalid("blockCollective: op must be allReduce, broadcast, allGather or reduceScatter");
    Model& m = ModelWrap::idle_model(info[2], "blockCollective");
    if (m.device() != Device::Cuda) invalid("blockCollective: the model is on the CPU; NCCL reduces GPU memory (the CPU path reads the model's host views)");
    const std::string kind = info[3].IsString() ? info[3].As<Napi::String>().Utf8Value() : "";
    if (kind != "params" && kind != "grads") invalid("blockCollective: kind must be 'params' or 'grads'");
    if (kind == "grads") m.need_training("blockCollective");
    const size_t size = kind == "params" ? m.num_parameters() : m.train_numel();
    const size_t sb = count_arg(info[4], "blockCollective: sendBegin"), sc = count_arg(info[5], "blockCollective: sendCount"),
                 rb = count_arg(info[6], "blockCollective: recvBegin"), rc = count_arg(info[7], "blockCollective: recvCount");
    const int root = (int)num_arg(info[8], "root");
    if (sb > size || sc > size - sb || rb > size || rc > size - rb)
      invalid("blockCollective: [" + std::to_string(sb) + ", " + std::to_string(sb + sc) + ") and [" + std::to_string(rb) + ", " +
              std::to_string(rb + rc) + ") must lie inside the " + kind + " block's " + std::to_string(size) + " floats");
    float* base = m.block_data(kind == "params" ? BlockKind::Params : BlockKind::Grads);
    nccl_run_device(comm, op, NcclType::F32, base + sb, sc, base + rb, rc, root, m.queue());
    return info.Env().Undefined();
  });
}

// probe() -> { library, version, error }: what dlopen found; error null when communicators can be made here.
Napi::Value Probe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const NcclStatusInfo s = nccl_status();
  Napi::Object o = Napi::Object::New(env);
  o.Set("library", Napi::String::New(env, s.library));
  o.Set("version", s.version > 0 ? Napi::Number::New(env, s.version) : env.Null());
  o.Set("error", s.error.empty() ? env.Null() : Napi::String::New(env, s.error));
  return o;
}

// uniqueId() -> Uint8Array(128): made by rank 0, handed to every rank.
Napi::Value UniqueId(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    auto out = Napi::Uint8Array::New(info.Env(), 128);
    nccl_unique_id(out.Data());
    return out;
  });
}

// commInit(id, ranks, rank, device) -> comm number; blocks until every rank joined.
Napi::Value CommInit(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    const View<uint8_t> id = u8_arg(info[0], "id");
    if (id.length != 128) invalid("id must be the 128 bytes of uniqueId()");
    const int ranks = (int)num_arg(info[1], "ranks"), rank = (int)num_arg(info[2], "rank"), device = (int)num_arg(info[3], "device");
    return Napi::Number::New(info.Env(), nccl_comm_init(id.data, ranks, rank, device));
  });
}

// commDestroy(comm, abort): abort=true does not wait for peers (a rank died).
Napi::Value CommDestroy(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    nccl_comm_destroy((int)num_arg(info[0], "comm"), info.Length() > 1 && info[1].ToBoolean().Value());
    return info.Env().Undefined();
  });
}

Napi::Value AllReduce(const Napi::CallbackInfo& info) { return collective(info, NcclOp::AllReduce); }
Napi::Value Broadcast(const Napi::CallbackInfo& info) { return collective(info, NcclOp::Broadcast); }
Napi::Value AllGather(const Napi::CallbackInfo& info) { return collective(info, NcclOp::AllGather); }
Napi::Value ReduceScatter(const Napi::CallbackInfo& info) { return collective(info, NcclOp::ReduceScatter); }

// cudaDeviceCount() -> GPUs the CUDA runtime sees (honours CUDA_VISIBLE_DEVICES); null without the CUDA layer.
Napi::Value CudaDeviceCount(const Napi::CallbackInfo& info) {
#ifdef RLSTREAM_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  return Napi::Number::New(info.Env(), n);
#else
  return info.Env().Null();
#endif
}

}  // namespace

void InitNccl(Napi::Env env, Napi::Object exports) {
  Napi::Object n = Napi::Object::New(env);
  n.Set("probe", Napi::Function::New(env, Probe));
  n.Set("uniqueId", Napi::Function::New(env, UniqueId));
  n.Set("commInit", Napi::Function::New(env, CommInit));
  n.Set("commDestroy", Napi::Function::New(env, CommDestroy));
  n.Set("allReduce", Napi::Function::New(env, AllReduce));
  n.Set("broadcast", Napi::Function::New(env, Broadcast));
  n.Set("allGather", Napi::Function::New(env, AllGather));
  n.Set("reduceScatter", Napi::Function::New(env, ReduceScatter));
  n.Set("blockCollective", Napi::Function::New(env, BlockCollective));
  exports.Set("nccl", n);
  exports.Set("cudaDeviceCount", Napi::Function::New(env, CudaDeviceCount));
}

}  // namespace rls
