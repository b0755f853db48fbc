// The dense kernels' device workspace (private to src/kernels/cuda/dense_*): one grow-only
// block per slot, so that a function's scratch costs no allocation once its shapes have been
// seen. Growing a slot frees the old block and takes a new one stream-ordered
// (cudaFreeAsync / cudaMallocAsync on cuda::stream()): work queued earlier that still uses the
// old block finishes first, and the host does not wait. A slot holds one function's scratch
// for the duration of that function's queued work; functions that call each other use
// different slots (named below by their user).
#pragma once

#include <cstddef>
#include <cstdint>

namespace parm::cuda::dense {

enum class Slot {
  kGemmA,        // dense_gemm: bf16 copy of A
  kGemmB,        // dense_gemm: bf16 copy of B
  kPartials,     // column sums (bias_backward, layernorm_backward), sum_squares
  kPartials2,    // layernorm_backward's second column sum
  kAttnQ,        // attention: bf16 q (forward, backward)
  kAttnK,        // attention: bf16 k
  kAttnV,        // attention: bf16 v
  kAttnP,        // attention: bf16 probs
  kAttnDout,     // attention backward: bf16 dout
  kAttnScores,   // attention backward: one head's (B, L, L) fp32 dscores
  kAttnScores16, // attention backward: their bf16 copy
  kRowLoss,      // cross_entropy: per-row losses (double)
  kSortKeys,     // scatter-add / embedding backward: keys in, keys sorted
  kSortValues,   // ...: positions in, positions sorted
  kSortTemp,     // ...: CUB's temporary storage
  kCount
};

// At least `bytes` of device memory for `slot` (aligned as cudaMallocAsync aligns), valid
// until the next call
// for the same slot.
void* scratch(Slot slot, size_t bytes);
template <class T>
T* scratch_as(Slot slot, int64_t count) {
  return static_cast<T*>(scratch(slot, static_cast<size_t>(count < 1 ? 1 : count) * sizeof(T)));
}

}  // namespace parm::cuda::dense
