// NCCL for the data-parallel trainer, loaded at run time: dlopen of libnccl.so.2 (or RLSTREAM_NCCL_LIBRARY), so that
// the addon builds without NCCL's headers or library and a machine without NCCL gets a refusal naming what is
// missing instead of a load failure. The NCCL types below are the library's stable C ABI (nccl.h since 2.10: the
// 128-byte unique id, ncclSum = 0, ncclFloat32 = 7, ncclBfloat16 = 9); nothing here reduces by hand.
//
// Two paths: nccl_run takes host buffers and stages them through a device buffer of the communicator's GPU (the
// Node interface, whose model views are host memory); nccl_run_device takes device pointers (a CUDA model's blocks)
// and queues the collective on the model's stream, with no copy and no wait. Without
// the CUDA layer (a build without RLSTREAM_CUDA=1) the status still loads the library and reads its version, and
// every communicator call refuses, naming the build.
#include "nccl_core.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "errors.h"

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
  if (fn == nullptr) a.error = a.path + " has no symbol " + name + " (not NCCL, or older than 2.10)";
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

[[maybe_unused]] constexpr const char* kNoCuda = "NCCL is loaded but this addon is built without the CUDA layer: build it with RLSTREAM_CUDA=1 (native/README.md)";

NcclApi& usable() {
  NcclApi& a = api();
  if (!a.error.empty()) invalid(a.error);
#ifndef RLSTREAM_CUDA
  invalid(kNoCuda);
#endif
  return a;
}

[[maybe_unused]] void check(NcclApi& a, NcclResult r, const char* what) {
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
  std::mutex busy;  // one collective at a time per communicator
};

std::mutex comms_mu;
std::map<int, std::shared_ptr<Comm>> comms;
int next_comm = 1;

std::shared_ptr<Comm> find(int id) {
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

}  // namespace

NcclStatusInfo nccl_status() {
  NcclApi& a = api();
  NcclStatusInfo s{a.path, a.version, a.error};
#ifndef RLSTREAM_CUDA
  if (s.error.empty()) s.error = kNoCuda;
#endif
  return s;
}

void nccl_unique_id(uint8_t out[128]) {
  NcclApi& a = usable();
  NcclUniqueId id;
  check(a, a.getUniqueId(&id), "ncclGetUniqueId");
  std::memcpy(out, &id, sizeof(id));
}

int nccl_comm_init(const uint8_t id_bytes[128], int ranks, int rank, int device) {
  NcclApi& a = usable();
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
  std::memcpy(&id, id_bytes, sizeof(id));
  const NcclResult r = a.commInitRank(&c->comm, ranks, id, rank);
  if (r != 0) {
    cudaStreamDestroy(s);
    check(a, r, "ncclCommInitRank");
  }
#else
  (void)a;
  (void)id_bytes;
#endif
  std::lock_guard<std::mutex> g(comms_mu);
  const int handle = next_comm++;
  comms[handle] = c;
  return handle;
}

void nccl_comm_destroy(int id, bool abort) {
  NcclApi& a = usable();
  auto c = find(id);
  {
    std::lock_guard<std::mutex> g(comms_mu);
    comms.erase(id);
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
}

int nccl_comm_size(int id) { return find(id)->size; }

void nccl_check(int id, NcclOp op, size_t send_count, size_t recv_count, int root) {
  usable();
  auto c = find(id);
  const size_t n = (size_t)c->size;
  if (op == NcclOp::AllGather && recv_count != send_count * n)
    invalid("allGather: recv has " + std::to_string(recv_count) + " elements, expected send (" + std::to_string(send_count) + ") x ranks (" + std::to_string(n) + ")");
  if (op == NcclOp::ReduceScatter && send_count != recv_count * n)
    invalid("reduceScatter: send has " + std::to_string(send_count) + " elements, expected recv (" + std::to_string(recv_count) + ") x ranks (" + std::to_string(n) + ")");
  if (op == NcclOp::Broadcast && (root < 0 || root >= c->size)) invalid("broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(n));
}

void nccl_run(int id, NcclOp op, NcclType type, const void* send, size_t send_count, void* recv, size_t recv_count, int root) {
  NcclApi& a = usable();
  auto c = find(id);
#ifdef RLSTREAM_CUDA
  std::lock_guard<std::mutex> g(c->busy);
  const size_t elem = type == NcclType::F32 ? 4 : 2;
  const int dtype = type == NcclType::F32 ? kNcclFloat32 : kNcclBfloat16;
  cuda_check(cudaSetDevice(c->device), "cudaSetDevice");
  const size_t sb = send_count * elem, rb = recv_count * elem;
  const bool separate = op == NcclOp::AllGather || op == NcclOp::ReduceScatter;
  uint8_t* dev = static_cast<uint8_t*>(staging(*c, separate ? sb + rb : sb));
  uint8_t* dsend = dev;
  uint8_t* drecv = separate ? dev + sb : dev;
  auto stream = static_cast<cudaStream_t>(c->stream);
  cuda_check(cudaMemcpyAsync(dsend, send, sb, cudaMemcpyHostToDevice, stream), "cudaMemcpy to the GPU");
  switch (op) {
    case NcclOp::AllReduce: check(a, a.allReduce(dsend, drecv, send_count, dtype, kNcclSum, c->comm, stream), "ncclAllReduce"); break;
    case NcclOp::Broadcast: check(a, a.broadcast(dsend, drecv, send_count, dtype, root, c->comm, stream), "ncclBroadcast"); break;
    case NcclOp::AllGather: check(a, a.allGather(dsend, drecv, send_count, dtype, c->comm, stream), "ncclAllGather"); break;
    case NcclOp::ReduceScatter: check(a, a.reduceScatter(dsend, drecv, recv_count, dtype, kNcclSum, c->comm, stream), "ncclReduceScatter"); break;
  }
  cuda_check(cudaMemcpyAsync(recv, drecv, rb, cudaMemcpyDeviceToHost, stream), "cudaMemcpy from the GPU");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (NCCL collective)");
#else
  (void)a, (void)c, (void)op, (void)type, (void)send, (void)send_count, (void)recv, (void)recv_count, (void)root;
#endif
}

void nccl_run_device(int id, NcclOp op, NcclType type, const void* send, size_t send_count, void* recv, size_t recv_count,
                     int root, void* queue) {
  NcclApi& a = usable();
  auto c = find(id);
  nccl_check(id, op, send_count, recv_count, root);
#ifdef RLSTREAM_CUDA
  std::lock_guard<std::mutex> g(c->busy);
  const int dtype = type == NcclType::F32 ? kNcclFloat32 : kNcclBfloat16;
  cuda_check(cudaSetDevice(c->device), "cudaSetDevice");
  switch (op) {
    case NcclOp::AllReduce: check(a, a.allReduce(send, recv, send_count, dtype, kNcclSum, c->comm, queue), "ncclAllReduce"); break;
    case NcclOp::Broadcast: check(a, a.broadcast(send, recv, send_count, dtype, root, c->comm, queue), "ncclBroadcast"); break;
    case NcclOp::AllGather: check(a, a.allGather(send, recv, send_count, dtype, c->comm, queue), "ncclAllGather"); break;
    case NcclOp::ReduceScatter: check(a, a.reduceScatter(send, recv, recv_count, dtype, kNcclSum, c->comm, queue), "ncclReduceScatter"); break;
  }
#else
  (void)a, (void)c, (void)op, (void)type, (void)send, (void)send_count, (void)recv, (void)recv_count, (void)root, (void)queue;
#endif
}

}  // namespace rls
