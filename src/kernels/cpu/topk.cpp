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

// Above this k, sorting the row beats keeping the best k in order while reading it.
constexpr int kMaxInsertionK = 32;

// idx (k), val (k): the k first of x (cols), by one pass that keeps the best elements seen
// so far in order (math::ranks_before's total order, so the result is math::topk_row's).
// An element enters only when it ranks before the last kept one; as columns are read in
// increasing order, an equal value never does (its index is higher), and a number never
// passes a kept NaN. Most elements of a wide row (fine-grained experts: 64-256 columns,
// k 6-8) cost one comparison, where k selection passes compare every element k times.
void topk_row_insertion(const float* x, int32_t cols, int k, int32_t* idx, float* val) {
  int kept = 0;
  for (int32_t c = 0; c < cols; ++c) {
    const float v = x[c];
    if (kept == k && !math::ranks_before(v, c, val[k - 1], idx[k - 1])) continue;
    int j = kept < k ? kept++ : k - 1;
    for (; j > 0 && math::ranks_before(v, c, val[j - 1], idx[j - 1]); --j) {
      val[j] = val[j - 1];
      idx[j] = idx[j - 1];
    }
    val[j] = v;
    idx[j] = c;
  }
}

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
    if (k <= kMaxInsertionK) {
      topk_row_insertion(xr, n, k, ir, vr);
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
