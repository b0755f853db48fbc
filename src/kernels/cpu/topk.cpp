// Top-k per row: largest first, ties to the lower column index. NaN ranks above every
// number (as in PyTorch), so a diverged gate shows up in the chosen experts instead of
// being silently skipped.
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/math/moe_math.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

// Above this k, sorting the row beats k selection passes over it.
constexpr int kMaxSelectionK = 8;

}  // namespace

void topk(const float* x, int64_t rows, int64_t cols, int k, int32_t* idx, float* val) {
  PARM_CHECK(rows >= 0, "topk: rows = {}", rows);
  PARM_CHECK(k >= 1 && k <= cols, "topk: k = {} must be in [1, cols = {}]", k, cols);
  PARM_CHECK(cols <= INT32_MAX, "topk: cols = {} does not fit the int32 indices", cols);
  const auto n = static_cast<int32_t>(cols);
  std::vector<int32_t> order;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    int32_t* ir = idx + r * k;
    float* vr = val + r * k;
    if (k <= kMaxSelectionK) {
      math::topk_row(xr, cols, k, ir, vr);  // k selection passes: O(k cols), no buffer
    } else {
      order.resize(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [xr](int32_t a, int32_t b) {
                          return math::ranks_before(xr[a], a, xr[b], b);
                        });
      for (int j = 0; j < k; ++j) {
        ir[j] = order[j];
        vr[j] = xr[order[j]];
      }
    }
  }
}

}  // namespace parm::cpu
