// Row-wise softmax and its adjoint.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {

PARM_SIMD_CLONES
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "softmax_forward: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    // Subtracting the row max keeps every exponent <= 0: no overflow, and the sum is >= 1.
    const float mx = detail::max_f32(xr, cols);
    for (int64_t c = 0; c < cols; ++c) yr[c] = detail::exp_f32(xr[c] - mx);
    const float inv = 1.0f / detail::sum_f32(yr, cols);
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}

PARM_SIMD_CLONES
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "softmax_backward: bad shape ({}, {})", rows, cols);
  constexpr int kL = detail::kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    float acc[kL] = {};
    int64_t c = 0;
    for (; c + kL <= cols; c += kL)
      for (int j = 0; j < kL; ++j) acc[j] += yr[c + j] * dyr[c + j];
    float dot = 0.0f;
    for (int j = 0; j < kL; ++j) dot += acc[j];
    for (; c < cols; ++c) dot += yr[c] * dyr[c];
    for (c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
  }
}

}  // namespace parm::cpu
