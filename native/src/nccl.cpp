// NCCL for the data-parallel trainer, loaded at run time: dlopen of libnccl.so.2 (or RLSTREAM_NCCL_LIBRARY), so that
// the addon builds without NCCL's headers or library and a machine without NCCL gets a refusal naming what is
// missing instead of a load failure. The NCCL types below are the library's stable C ABI (nccl.h since 2.10: the
// 128-byte unique id, ncclSum = 0, ncclFloat32 = 7, ncclBfloat16 = 9); nothing here reduces by hand.
//
// The collectives take host typed arrays and stage them through a device buffer of the communicator's GPU: the
// model's device gradient block is not exposed to this file, so the zero-copy path over it is not built (see
// docs/scaling.md). Without the CUDA layer (a build without RLSTREAM_CUDA=1) the probe still loads the library
// and reads its version, and every communicator call refuses, naming the build.
#include "nccl_glue.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "glue.h"

#ifdef RLSTREAM_CUDA
#include <cuda_runtime.h>
#endif

namespace rls {
namespace {

struct NcclUniqueId {
  char internal[128];
};
using NcclComm = void*;
using NcclResult = int;
using NcclStream = void*;
constexpr int kNcclSum = 0;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclBfloat16 = 9;

struct NcclApi {
  void* lib = nullptr;
  std::string path;
  std::string error;  // why it is not usable; empty when it is
  int version = 0;
  NcclResult (*getVersion)(int*) = nullptr;
  NcclResult (*getUniqueId)(NcclUniqueId*) = nullptr;
  NcclResult (*commInitRank)(NcclComm*, int, NcclUniqueId, int) = nullptr;
  NcclResult (*allReduce)(const void*, void*, size_t, int, int, NcclComm, NcclStream) = nullptr;
  NcclResult (*broadcast)(const void*, void*, size_t, int, int, NcclComm, NcclStream) = nullptr;
  NcclResult (*allGather)(const void*, void*, size_t, int, NcclComm, NcclStream) = nullptr;
  NcclResult (*reduceScatter)(const void*, void*, size_t, int, int, NcclComm, NcclStream) = nullptr;
  NcclResult (*commDestroy)(NcclComm) = nullptr;
  NcclResult (*commAbort)(NcclComm) = nullptr;
  const char* (*errorString)(NcclResult) = nullptr;
};

template <typename F>
bool sym(NcclApi& a, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(a.lib, name));
  if (fn == nullptr) a.error = a.path + " has no symbol " + name + " (NCCL 2.10 or newer is needed)";
  return fn != nullptr;
}

NcclApi& api() {
  static NcclApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("RLSTREAM_NCCL_LIBRARY");
    a.path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    a.lib = dlopen(a.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (a.lib == nullptr) {
      const char* why = dlerror();
      a.error = "NCCL is not loadable: dlopen(" + a.path + ") failed: " + (why ? why : "unknown error") +
                ". Install NCCL (the libnccl2 package, or pip's nvidia-nccl-cu12 with its lib directory on "
                "LD_LIBRARY_PATH) or point RLSTREAM_NCCL_LIBRARY at libnccl.so.2";
      return;
    }
    if (!sym(a, a.getVersion, "ncclGetVersion") || !sym(a, a.getUniqueId, "ncclGetUniqueId") ||
        !sym(a, a.commInitRank, "ncclCommInitRank") || !sym(a, a.allReduce, "ncclAllReduce") ||
        !sym(a, a.broadcast, "ncclBroadcast") || !sym(a, a.allGather, "ncclAllGather") ||
        !sym(a, a.reduceScatter, "ncclReduceScatter") || !sym(a, a.commDestroy, "ncclCommDestroy") ||
        !sym(a, a.commAbort, "ncclCommAbort") || !sym(a, a.errorString, "ncclGetErrorString"))
      return;
    if (a.getVersion(&a.version) != 0) a.error = a.path + ": ncclGetVersion failed";
    else if (a.version < 21000) a.error = a.path + " is NCCL " + std::to_string(a.version) + "; 2.10 or newer is needed (bf16)";
  });
  return a;
}

NcclApi& usable() {
  NcclApi& a = api();
  if (!a.error.empty()) invalid(a.error);
#ifndef RLSTREAM_CUDA
  invalid("NCCL is loaded but this addon is built without the CUDA layer: build it with RLSTREAM_CUDA=1 (native/README.md)");
#endif
  return a;
}

void check(NcclApi& a, NcclResult r, const char* what) {
  if (r != 0) invalid(std::string(what) + " failed: " + a.errorString(r) + " (ncclResult " + std::to_string(r) + ")");
}

#ifdef RLSTREAM_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) invalid(std::string(what) + " failed: " + cudaGetErrorString(e));
}
#endif

// One communicator: its rank, size, GPU, stream and a device staging buffer grown on demand.
struct Comm {
  NcclComm comm = nullptr;
  int rank = 0, size = 0, device = 0;
  void* stream = nullptr;
  void* staging = nullptr;
  size_t staging_bytes = 0;
  std::mutex busy;  // one collective at a time per communicator, in the order JS issued them
};

std::mutex comms_mu;
std::map<int, std::shared_ptr<Comm>> comms;
int next_comm = 1;

std::shared_ptr<Comm> comm_arg(const Napi::Value& v) {
  const int id = (int)num_arg(v, "comm");
  std::lock_guard<std::mutex> g(comms_mu);
  auto it = comms.find(id);
  if (it == comms.end()) invalid("comm " + std::to_string(id) + " is not an open NCCL communicator (destroyed or never made)");
  return it->second;
}

#ifdef RLSTREAM_CUDA
void* staging(Comm& c, size_t bytes) {
  if (bytes > c.staging_bytes) {
    if (c.staging != nullptr) cudaFree(c.staging);
    c.staging = nullptr;
    c.staging_bytes = 0;
    cuda_check(cudaMalloc(&c.staging, bytes), "cudaMalloc (NCCL staging buffer)");
    c.staging_bytes = bytes;
  }
  return c.staging;
}
#endif

// The element type of a host buffer: Float32Array is fp32, Uint16Array holds bf16 bit patterns.
struct HostBuf {
  void* data = nullptr;
  size_t count = 0, elem = 0;
  int dtype = 0;
  Napi::Value holder;
};
HostBuf host_arg(const Napi::Value& v, const std::string& what) {
  if (!v.IsTypedArray()) invalid(what + " must be a Float32Array (fp32) or a Uint16Array (bf16 bits)");
  auto ta = v.As<Napi::TypedArray>();
  HostBuf b;
  if (ta.TypedArrayType() == napi_float32_array) b.elem = 4, b.dtype = kNcclFloat32;
  else if (ta.TypedArrayType() == napi_uint16_array) b.elem = 2, b.dtype = kNcclBfloat16;
  else invalid(what + " must be a Float32Array (fp32) or a Uint16Array (bf16 bits)");
  b.count = ta.ElementLength();
  b.data = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
  b.holder = v;
  return b;
}

enum class Op { AllReduce, Broadcast, AllGather, ReduceScatter };

// Runs one collective off the main thread: host -> device, the NCCL call, stream sync, device -> host.
Napi::Value collective(const Napi::CallbackInfo& info, Op op) {
  NcclApi& a = usable();
  auto c = comm_arg(info[0]);
  HostBuf send = host_arg(info[1], "send");
  HostBuf recv = op == Op::AllReduce || op == Op::Broadcast ? send : host_arg(info[2], "recv");
  const int root = op == Op::Broadcast ? (int)num_arg(info[2], "root") : 0;
  if (send.dtype != recv.dtype) invalid("send and recv must have the same element type");
  if (op == Op::AllGather && recv.count != send.count * c->size)
    invalid("allGather: recv has " + std::to_string(recv.count) + " elements, expected send (" + std::to_string(send.count) + ") x ranks (" + std::to_string(c->size) + ")");
  if (op == Op::ReduceScatter && send.count != recv.count * c->size)
    invalid("reduceScatter: send has " + std::to_string(send.count) + " elements, expected recv (" + std::to_string(recv.count) + ") x ranks (" + std::to_string(c->size) + ")");
  if (op == Op::Broadcast && (root < 0 || root >= c->size)) invalid("broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(c->size));
  auto job = [&a, c, send, recv, root, op] {
#ifdef RLSTREAM_CUDA
    std::lock_guard<std::mutex> g(c->busy);
    cuda_check(cudaSetDevice(c->device), "cudaSetDevice");
    const size_t sb = send.count * send.elem, rb = recv.count * recv.elem;
    const bool separate = op == Op::AllGather || op == Op::ReduceScatter;
    uint8_t* dev = static_cast<uint8_t*>(staging(*c, separate ? sb + rb : sb));
    uint8_t* dsend = dev;
    uint8_t* drecv = separate ? dev + sb : dev;
    auto stream = static_cast<cudaStream_t>(c->stream);
    cuda_check(cudaMemcpyAsync(dsend, send.data, sb, cudaMemcpyHostToDevice, stream), "cudaMemcpy to the GPU");
    switch (op) {
      case Op::AllReduce: check(a, a.allReduce(dsend, drecv, send.count, send.dtype, kNcclSum, c->comm, stream), "ncclAllReduce"); break;
      case Op::Broadcast: check(a, a.broadcast(dsend, drecv, send.count, send.dtype, root, c->comm, stream), "ncclBroadcast"); break;
      case Op::AllGather: check(a, a.allGather(dsend, drecv, send.count, send.dtype, c->comm, stream), "ncclAllGather"); break;
      case Op::ReduceScatter: check(a, a.reduceScatter(dsend, drecv, recv.count, send.dtype, kNcclSum, c->comm, stream), "ncclReduceScatter"); break;
    }
    cuda_check(cudaMemcpyAsync(recv.data, drecv, rb, cudaMemcpyDeviceToHost, stream), "cudaMemcpy from the GPU");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (NCCL collective)");
#else
    (void)a;
#endif
  };
  auto* w = new JobWorker(info.Env(), job, [](Napi::Env e) { return e.Undefined(); }, [] {}, {send.holder, recv.holder});
  w->Queue();
  return w->promise();
}

}  // namespace

// ncclProbe() -> { library, version, error }: what dlopen found; error null when the communicator calls can run.
Napi::Value NcclProbe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  NcclApi& a = api();
  Napi::Object o = Napi::Object::New(env);
  o.Set("library", Napi::String::New(env, a.path));
  o.Set("version", a.version > 0 ? Napi::Number::New(env, a.version) : env.Null());
  std::string error = a.error;
#ifndef RLSTREAM_CUDA
  if (error.empty()) error = "NCCL is loaded but this addon is built without the CUDA layer: build it with RLSTREAM_CUDA=1 (native/README.md)";
#endif
  o.Set("error", error.empty() ? env.Null() : Napi::String::New(env, error));
  return o;
}

// ncclUniqueId() -> Uint8Array(128): made by rank 0, handed to every rank (ncclGetUniqueId).
Napi::Value NcclUniqueIdNew(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    NcclApi& a = usable();
    NcclUniqueId id;
    check(a, a.getUniqueId(&id), "ncclGetUniqueId");
    auto out = Napi::Uint8Array::New(info.Env(), sizeof(id));
    std::memcpy(out.Data(), &id, sizeof(id));
    return out;
  });
}

// ncclCommInit(id, ranks, rank, device) -> comm number. Blocks until every rank joined (ncclCommInitRank).
Napi::Value NcclCommInit(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    NcclApi& a = usable();
    const View<uint8_t> idv = u8_arg(info[0], "id");
    if (idv.length != sizeof(NcclUniqueId)) invalid("id must be the 128 bytes of ncclUniqueId()");
    const int ranks = (int)num_arg(info[1], "ranks"), rank = (int)num_arg(info[2], "rank"), device = (int)num_arg(info[3], "device");
    if (ranks < 1 || rank < 0 || rank >= ranks) invalid("rank " + std::to_string(rank) + " is not in [0, " + std::to_string(ranks) + ")");
    auto c = std::make_shared<Comm>();
    c->rank = rank, c->size = ranks, c->device = device;
#ifdef RLSTREAM_CUDA
    int found = 0;
    cuda_check(cudaGetDeviceCount(&found), "cudaGetDeviceCount");
    if (device < 0 || device >= found) invalid("device " + std::to_string(device) + " is not one of the " + std::to_string(found) + " GPUs the CUDA runtime sees");
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t s;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    c->stream = s;
    NcclUniqueId id;
    std::memcpy(&id, idv.data, sizeof(id));
    const NcclResult r = a.commInitRank(&c->comm, ranks, id, rank);
    if (r != 0) {
      cudaStreamDestroy(s);
      check(a, r, "ncclCommInitRank");
    }
#else
    (void)a;
#endif
    std::lock_guard<std::mutex> g(comms_mu);
    const int handle = next_comm++;
    comms[handle] = c;
    return Napi::Number::New(info.Env(), handle);
  });
}

// ncclCommDestroy(comm, abort): frees the communicator; abort=true does not wait for peers (a rank died).
Napi::Value NcclCommDestroy(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&]() -> Napi::Value {
    NcclApi& a = usable();
    auto c = comm_arg(info[0]);
    const bool abort = info.Length() > 1 && info[1].ToBoolean().Value();
    {
      std::lock_guard<std::mutex> g(comms_mu);
      comms.erase((int)info[0].As<Napi::Number>().DoubleValue());
    }
#ifdef RLSTREAM_CUDA
    if (abort) a.commAbort(c->comm);
    else check(a, a.commDestroy(c->comm), "ncclCommDestroy");
    if (c->staging != nullptr) cudaFree(c->staging);
    cudaStreamDestroy(static_cast<cudaStream_t>(c->stream));
#else
    (void)a;
    (void)abort;
#endif
    return info.Env().Undefined();
  });
}

Napi::Value NcclAllReduce(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&] { return collective(info, Op::AllReduce); });
}
Napi::Value NcclBroadcast(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&] { return collective(info, Op::Broadcast); });
}
Napi::Value NcclAllGather(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&] { return collective(info, Op::AllGather); });
}
Napi::Value NcclReduceScatter(const Napi::CallbackInfo& info) {
  return guard(info.Env(), [&] { return collective(info, Op::ReduceScatter); });
}

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

void InitNccl(Napi::Env env, Napi::Object exports) {
  Napi::Object n = Napi::Object::New(env);
  n.Set("probe", Napi::Function::New(env, NcclProbe));
  n.Set("uniqueId", Napi::Function::New(env, NcclUniqueIdNew));
  n.Set("commInit", Napi::Function::New(env, NcclCommInit));
  n.Set("commDestroy", Napi::Function::New(env, NcclCommDestroy));
  n.Set("allReduce", Napi::Function::New(env, NcclAllReduce));
  n.Set("broadcast", Napi::Function::New(env, NcclBroadcast));
  n.Set("allGather", Napi::Function::New(env, NcclAllGather));
  n.Set("reduceScatter", Napi::Function::New(env, NcclReduceScatter));
  exports.Set("nccl", n);
  exports.Set("cudaDeviceCount", Napi::Function::New(env, CudaDeviceCount));
}

}  // namespace rls
