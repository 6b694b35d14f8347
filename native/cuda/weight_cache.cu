// The bf16 weight cache of the CUDA layer (weight_cache.cuh).
#include "weight_cache.cuh"

#include "ops.cuh"

namespace rls::cuda {

void WeightCache::Cat::convert(cudaStream_t st) const {
  size_t off = 0;
  for (int i = 0; i < 3; i++) {
    if (!n[i]) continue;
    to_bf16(p + off, src[i], n[i], "weights fp32 -> bf16 (stacked)", st);
    off += n[i];
  }
}

const bf16* WeightCache::single(const float* w, size_t n, cudaStream_t st) {
  auto it = wcache_.find(w);
  if (it != wcache_.end() && it->second.n == n && it->second.valid) return it->second.p;
  if (it != wcache_.end() && it->second.n != n) {
    ++*gen_;
    cudaFree(it->second.p);
    wcache_.erase(it);
    it = wcache_.end();
  }
  if (it == wcache_.end()) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(bf16)));
    it = wcache_.emplace(w, Cached{(bf16*)p, n, false}).first;
  }
  to_bf16(it->second.p, w, n, "weight fp32 -> bf16", st);
  it->second.valid = true;
  return it->second.p;
}

const bf16* WeightCache::stacked(const float* w0, int oc0, const float* w1, int oc1, const float* w2, int oc2, int C,
                                 cudaStream_t st) {
  return oc1 || oc2 ? cat(w0, (size_t)oc0 * C, w1, (size_t)oc1 * C, w2, (size_t)oc2 * C, st)
                    : single(w0, (size_t)oc0 * C, st);
}

const bf16* WeightCache::cat(const float* w0, size_t n0, const float* w1, size_t n1, const float* w2, size_t n2,
                             cudaStream_t st) {
  auto it = wcat_.find(w0);
  const bool same = it != wcat_.end() && it->second.src[1] == w1 && it->second.src[2] == w2 &&
                    it->second.n[0] == n0 && it->second.n[1] == n1 && it->second.n[2] == n2;
  if (same && it->second.valid) return it->second.p;
  if (it != wcat_.end() && !same) {
    ++*gen_;
    cudaFree(it->second.p);
    wcat_.erase(it);
    it = wcat_.end();
  }
  if (it == wcat_.end()) {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n0 + n1 + n2, 1) * sizeof(bf16)));
    it = wcat_.emplace(w0, Cat{(bf16*)p, {w0, w1, w2}, {n0, n1, n2}, false}).first;
  }
  it->second.convert(st);
  it->second.valid = true;
  return it->second.p;
}

void WeightCache::evict(const float* p, size_t n, bool drop) {
  const float* e = p + n;
  for (auto it = wcat_.begin(); it != wcat_.end();) {
    if (it->second.overlaps(p, e)) {
      if (drop) {
        ++*gen_;
        cudaFree(it->second.p);
        it = wcat_.erase(it);
        continue;
      }
      if (it->second.valid) stale_ = true;
      it->second.valid = false;
    }
    ++it;
  }
  for (auto it = wcache_.begin(); it != wcache_.end();) {
    const float* a = it->first;
    if (a < e && p < a + it->second.n) {
      if (drop) {
        ++*gen_;
        cudaFree(it->second.p);
        it = wcache_.erase(it);
        continue;
      }
      if (it->second.valid) stale_ = true;
      it->second.valid = false;
    }
    ++it;
  }
}

void WeightCache::refresh(cudaStream_t st) {
  if (!stale_) return;
  for (auto& e : wcache_)
    if (!e.second.valid) {
      to_bf16(e.second.p, e.first, e.second.n, "weight fp32 -> bf16", st);
      e.second.valid = true;
    }
  for (auto& e : wcat_)
    if (!e.second.valid) {
      e.second.convert(st);
      e.second.valid = true;
    }
  stale_ = false;
}

void WeightCache::clear() {
  for (auto& e : wcache_) cudaFree(e.second.p);
  for (auto& e : wcat_) cudaFree(e.second.p);
  wcache_.clear();
  wcat_.clear();
}

}  // namespace rls::cuda
