// The dense kernels' grow-only workspace (dense_scratch.h).
#include "kernels/cuda/dense_scratch.h"

#include <array>

#include "kernels/cuda/runtime.h"

namespace parm::cuda::dense {
namespace {

struct Block {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Process-wide, as the compute stream is. Never freed: the blocks live as long as the
// process's CUDA context.
std::array<Block, static_cast<size_t>(Slot::kCount)>& blocks() {
  static std::array<Block, static_cast<size_t>(Slot::kCount)> b;
  return b;
}

}  // namespace

void* scratch(Slot slot, size_t bytes) {
  Block& b = blocks()[static_cast<size_t>(slot)];
  if (bytes <= b.bytes) return b.ptr;
  // A quarter more than asked: shapes that creep up (the experts' row counts) do not grow the
  // block at every call.
  const size_t want = bytes + bytes / 4;
  cudaStream_t s = stream();
  if (b.ptr != nullptr) PARM_CUDA_CHECK(cudaFreeAsync(b.ptr, s));
  b.ptr = nullptr;
  b.bytes = 0;
  PARM_CUDA_CHECK(cudaMallocAsync(&b.ptr, want, s));
  b.bytes = want;
  return b.ptr;
}

}  // namespace parm::cuda::dense
