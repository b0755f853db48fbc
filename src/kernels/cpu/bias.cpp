// Bias add over rows and its adjoint (column sums); the elementwise sum of two arrays.
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {

PARM_SIMD_CLONES
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "add_bias: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) yr[c] += bias[c];
  }
}

PARM_SIMD_CLONES
void add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

PARM_SIMD_CLONES
void bias_backward(const float* dy, float* dbias, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_backward: bad shape ({}, {})", rows, cols);
  // Row-major walk: each column is its own running sum, so the inner loop vectorises
  // without reordering any addition.
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) dbias[c] += dyr[c];
  }
}

}  // namespace parm::cpu
