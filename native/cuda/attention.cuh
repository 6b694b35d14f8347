// Causal grouped-query attention over packed variable-length sequences on the GPU (declarations). Layouts follow
// device.h: q/out [T, NH*hd], k/v [T, NKV*hd], lse [NH, T]; seq_starts is a device copy of cu_seqlens [S+1].
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace rls::cuda {

// Scratch the backward needs: [NH*T] floats for rowsum(dO*O).
size_t attention_backward_scratch(int T, int NH);

// out16 (may be null) gets a bf16 copy of out from the same kernel where the tensor-core path runs; the return value
// says whether it did (false: the caller converts).
bool attention_forward(float* out, __nv_bfloat16* out16, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_starts, int S, int max_len, int T, int NH, int NKV, int hd, cudaStream_t st);
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse, const int* seq_starts, int S,
                        int max_len, int T, int NH, int NKV, int hd, cudaStream_t st);

}  // namespace rls::cuda
