// CUDA graphs of the CUDA kernels object (device.h's capture_begin .. replay). A capture runs on a stream of its own
// (non-blocking, so that work other threads queue on the legacy stream meanwhile neither joins nor breaks it);
// replays are launched on the legacy stream, in order with every other call of the owner. Host inputs the captured
// kernels take are copied by memcpy nodes from pinned staging, refilled from the same host addresses before each
// replay; host outputs likewise after it. A graph made under another generation of the owner's memory (a buffer
// released or reallocated, a cached bf16 weight freed) is dropped, never replayed.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace rls::cuda {

class CudaGraphs {
 public:
  // gen: the owner's memory generation; use_stream routes the owner's launches and cuBLAS to a stream (nullptr: the
  // legacy stream); refresh_weights re-makes stale bf16 weight copies in place on the owner's current stream.
  CudaGraphs(const uint64_t* gen, std::function<void(cudaStream_t)> use_stream,
             std::function<void()> refresh_weights)
      : gen_(gen), use_stream_(std::move(use_stream)), refresh_weights_(std::move(refresh_weights)) {}
  CudaGraphs(const CudaGraphs&) = delete;
  CudaGraphs& operator=(const CudaGraphs&) = delete;
  ~CudaGraphs() { clear(); }

  bool ready(int id);
  bool capturing() const { return cap_ != nullptr; }
  void begin(size_t stage_bytes);
  void end(int id);
  void abort();
  void replay(int id);
  // While capturing: a host input of the step, copied in by the graph from pinned staging (one copy per address).
  const void* stage_in(const void* host, size_t bytes);
  // While capturing: a host output, copied to pinned staging by the graph and to `host` after each replay.
  void stage_out(void* host, const void* dsrc, size_t bytes);
  // every graph, the capture in progress and the capture stream destroyed
  void clear();

 private:
  struct Xfer {
    void* host;
    size_t off, bytes;
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    char* pin = nullptr;  // pinned host staging
    char* dev = nullptr;  // its device side
    size_t cap = 0;
    std::vector<Xfer> in, out;
    cudaEvent_t done = nullptr;
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
      if (done) cudaEventDestroy(done);
      if (dev) cudaFree(dev);
      if (pin) cudaFreeHost(pin);
    }
  };
  void sync_gen();
  size_t take(size_t bytes);

  const uint64_t* gen_;
  std::function<void(cudaStream_t)> use_stream_;
  std::function<void()> refresh_weights_;
  std::map<int, std::unique_ptr<Graph>> graphs_;
  std::unique_ptr<Graph> cap_;  // the graph being captured
  size_t cap_used_ = 0;
  cudaStream_t cap_stream_ = nullptr;
  // the owner's generation the graphs were made under, and the capture began under
  uint64_t graphs_gen_ = 0, cap_gen_ = 0;
};

}  // namespace rls::cuda
