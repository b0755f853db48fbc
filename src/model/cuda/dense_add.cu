// The one elementwise op the model needs that the kernel library has no CPU twin for: the
// residual sum (model/dense_ops.h's add).
#include "kernels/cuda/runtime.h"
#include "model/cuda/dense_add.h"

namespace parm::model {
namespace {

// fp32 adds, one per element: the same bits as the CPU loop (no contraction is possible).
__global__ void add_kernel(const float* a, const float* b, float* out, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

}  // namespace

void cuda_add(const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<cuda::grid_for(n), 256, 0, cuda::stream()>>>(a, b, out, n);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::model
