// CUDA graph capture and replay of the CUDA layer (graphs.cuh).
#include "graphs.cuh"

#include <algorithm>
#include <cstring>

#include "../src/errors.h"
#include "check.cuh"

namespace rls::cuda {

void CudaGraphs::sync_gen() {
  if (graphs_gen_ != *gen_) {
    graphs_.clear();
    graphs_gen_ = *gen_;
  }
}

bool CudaGraphs::ready(int id) {
  sync_gen();
  return graphs_.count(id) != 0;
}

void CudaGraphs::begin(size_t stage_bytes) {
  if (cap_) invalid("CUDA graph: a capture is already in progress");
  sync_gen();
  if (!cap_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&cap_stream_, cudaStreamNonBlocking));
  auto g = std::make_unique<Graph>();
  g->cap = std::max<size_t>(256, (stage_bytes + 255) / 256 * 256);
  CUDA_CHECK(cudaHostAlloc((void**)&g->pin, g->cap, cudaHostAllocDefault));
  CUDA_CHECK(cudaMalloc((void**)&g->dev, g->cap));
  CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
  refresh_weights_();  // the graph must find every bf16 weight copy valid (none re-made inside it)
  cap_used_ = 0;
  cap_gen_ = *gen_;
  use_stream_(cap_stream_);
  const cudaError_t e = cudaStreamBeginCapture(cap_stream_, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    use_stream_(nullptr);
    cudaGetLastError();
    fail("cudaStreamBeginCapture", cudaGetErrorString(e), __FILE__, __LINE__);
  }
  cap_ = std::move(g);
}

void CudaGraphs::end(int id) {
  if (!cap_) invalid("CUDA graph: no capture in progress");
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(cap_stream_, &graph);
  use_stream_(nullptr);
  std::unique_ptr<Graph> g = std::move(cap_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    fail("cudaStreamEndCapture", cudaGetErrorString(e), __FILE__, __LINE__);
  }
  if (*gen_ != cap_gen_) {  // something was reallocated while capturing: the graph may hold a freed address
    cudaGraphDestroy(graph);
    invalid("CUDA graph: a buffer was reallocated during the capture");
  }
  const cudaError_t ie = cudaGraphInstantiateWithFlags(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    g->exec = nullptr;
    cudaGetLastError();
    fail("cudaGraphInstantiate", cudaGetErrorString(ie), __FILE__, __LINE__);
  }
  graphs_[id] = std::move(g);
}

void CudaGraphs::abort() {
  if (!cap_) return;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(cap_stream_, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
  use_stream_(nullptr);
  cap_.reset();
}

void CudaGraphs::replay(int id) {
  auto it = graphs_.find(id);
  if (it == graphs_.end() || *gen_ != graphs_gen_) invalid("CUDA graph: replay of a graph that is not ready");
  Graph& g = *it->second;
  CUDA_CHECK(cudaEventSynchronize(g.done));  // the last replay no longer reads or writes the pinned staging
  refresh_weights_();
  for (const Xfer& x : g.in) std::memcpy(g.pin + x.off, x.host, x.bytes);
  CUDA_CHECK(cudaGraphLaunch(g.exec, 0));
  CUDA_CHECK(cudaEventRecord(g.done, 0));
  if (!g.out.empty()) {
    CUDA_CHECK(cudaEventSynchronize(g.done));
    for (const Xfer& x : g.out) std::memcpy(x.host, g.pin + x.off, x.bytes);
  }
}

size_t CudaGraphs::take(size_t bytes) {
  const size_t off = cap_used_, want = (bytes + 255) / 256 * 256;
  if (off + want > cap_->cap) invalid("CUDA graph: staging for the captured inputs is full");
  cap_used_ += want;
  return off;
}

// (while cap_ is set the owner launches on cap_stream_: begin routes it there before setting cap_)
const void* CudaGraphs::stage_in(const void* host, size_t bytes) {
  for (const Xfer& x : cap_->in)
    if (x.host == host && x.bytes == bytes) return cap_->dev + x.off;
  const size_t off = take(bytes);
  std::memcpy(cap_->pin + off, host, bytes);
  CUDA_CHECK(cudaMemcpyAsync(cap_->dev + off, cap_->pin + off, bytes, cudaMemcpyHostToDevice, cap_stream_));
  cap_->in.push_back({const_cast<void*>(host), off, bytes});
  return cap_->dev + off;
}

void CudaGraphs::stage_out(void* host, const void* dsrc, size_t bytes) {
  const size_t off = take(bytes);
  CUDA_CHECK(cudaMemcpyAsync(cap_->pin + off, dsrc, bytes, cudaMemcpyDeviceToHost, cap_stream_));
  cap_->out.push_back({host, off, bytes});
}

void CudaGraphs::clear() {
  graphs_.clear();
  cap_.reset();
  if (cap_stream_) cudaStreamDestroy(cap_stream_);
  cap_stream_ = nullptr;
}

}  // namespace rls::cuda
