// Row gather and scatter-add: the data movement of MoE dispatch and combine.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {

void gather_rows(const float* src, int64_t cols, const int64_t* idx, int64_t n, float* dst) {
  PARM_CHECK(n >= 0 && cols >= 0, "gather_rows: n = {}, cols = {}", n, cols);
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    float* d = dst + i * cols;
    if (idx[i] < 0)
      std::memset(d, 0, row_bytes);
    else
      std::memcpy(d, src + idx[i] * cols, row_bytes);
  }
}

PARM_SIMD_CLONES
void scatter_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                      int64_t n, float* dst) {
  PARM_CHECK(n >= 0 && cols >= 0, "scatter_add_rows: n = {}, cols = {}", n, cols);
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0) continue;
    const float* s = src + i * cols;
    float* d = dst + idx[i] * cols;
    if (scale == nullptr) {
      for (int64_t c = 0; c < cols; ++c) d[c] += s[c];
    } else {
      const float w = scale[i];
      for (int64_t c = 0; c < cols; ++c) d[c] += w * s[c];
    }
  }
}

}  // namespace parm::cpu
