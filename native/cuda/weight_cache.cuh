// The bf16 copies of fp32 weights that the cuBLAS products take as operands: made on first use, kept while the fp32
// original is unchanged, marked stale when anything writes over it (evict) and re-made in place (refresh, so that a
// captured CUDA graph's addresses stay valid), freed when its memory is released. Owned by the CUDA kernels object.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>

#include "common.cuh"

namespace rls::cuda {

class WeightCache {
 public:
  // gen: the owner's generation, bumped when a copy is freed (a CUDA graph may hold its address)
  explicit WeightCache(uint64_t* gen) : gen_(gen) {}
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;
  ~WeightCache() { clear(); }

  // the bf16 copy of w[0, n)
  const bf16* single(const float* w, size_t n, cudaStream_t st);
  // the bf16 copy of up to three weights [oc_i, C] stacked by rows ([w0; w1; w2]: q, k and v, or gate and up);
  // w0's own copy where oc1 and oc2 are 0
  const bf16* stacked(const float* w0, int oc0, const float* w1, int oc1, const float* w2, int oc2, int C,
                      cudaStream_t st);
  // Cached copies overlapping [p, p+n) become stale; with drop, they are freed (their source memory is going away).
  void evict(const float* p, size_t n, bool drop = false);
  // every stale copy re-made in place (same address)
  void refresh(cudaStream_t st);
  // every copy freed
  void clear();

 private:
  struct Cached {
    bf16* p;
    size_t n;
    bool valid;
  };
  // keyed by w0, apart from the single copies
  struct Cat {
    bf16* p;
    const float* src[3];
    size_t n[3];
    bool valid;
    bool overlaps(const float* a, const float* e) const {
      for (int i = 0; i < 3; i++)
        if (n[i] && src[i] < e && a < src[i] + n[i]) return true;
      return false;
    }
    void convert(cudaStream_t st) const;
  };
  const bf16* cat(const float* w0, size_t n0, const float* w1, size_t n1, const float* w2, size_t n2, cudaStream_t st);

  uint64_t* gen_;
  std::map<const float*, Cached> wcache_;
  std::map<const float*, Cat> wcat_;  // stacked weights (matmul_cat)
  bool stale_ = false;                // some cached bf16 weight copy is out of date
};

}  // namespace rls::cuda
