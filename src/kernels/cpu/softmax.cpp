// Row-wise softmax and its adjoint; the cross-entropy of softmax rows.
#include <cmath>

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

// Per row: the max (every exponent <= 0), the exponentials in fp32 summed in double lanes
// (written to dlogits when it is given: it may alias logits, so the target's logit is read
// first), then dlogits scaled by scale / sum in place.
PARM_SIMD_CLONES
double cross_entropy_rows(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                          int64_t vocab, float scale) {
  PARM_CHECK(n >= 0 && vocab > 0, "cross_entropy: bad shape ({}, {})", n, vocab);
  constexpr int kL = detail::kLanes;
  double loss = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * vocab;
    const int32_t y = targets[r];
    const float mx = detail::max_f32(x, vocab);
    const float xy = x[y];
    double acc[kL] = {};
    int64_t c = 0;
    if (dlogits == nullptr) {
      for (; c + kL <= vocab; c += kL)
        for (int j = 0; j < kL; ++j) acc[j] += detail::exp_f32(x[c + j] - mx);
      for (; c < vocab; ++c) acc[0] += detail::exp_f32(x[c] - mx);
    } else {
      float* d = dlogits + r * vocab;
      for (; c + kL <= vocab; c += kL)
        for (int j = 0; j < kL; ++j) {
          const float e = detail::exp_f32(x[c + j] - mx);
          acc[j] += e;
          d[c + j] = e;
        }
      for (; c < vocab; ++c) {
        const float e = detail::exp_f32(x[c] - mx);
        acc[0] += e;
        d[c] = e;
      }
    }
    double sum = 0.0;
    for (int j = 0; j < kL; ++j) sum += acc[j];
    loss += std::log(sum) + static_cast<double>(mx) - static_cast<double>(xy);
    if (dlogits != nullptr) {
      float* d = dlogits + r * vocab;
      const float k = static_cast<float>(static_cast<double>(scale) / sum);
      for (c = 0; c < vocab; ++c) d[c] *= k;
      d[y] -= scale;
    }
  }
  return loss;
}

// The three passes of the vocabulary-parallel cross-entropy (kernels.h): the arithmetic of
// cross_entropy_rows, split where the caller reduces over the vocabulary's blocks.
PARM_SIMD_CLONES
void ce_row_max(const float* logits, int64_t n, int64_t cols, float* row_max) {
  PARM_CHECK(n >= 0 && cols > 0, "ce_row_max: bad shape ({}, {})", n, cols);
  for (int64_t r = 0; r < n; ++r) row_max[r] = detail::max_f32(logits + r * cols, cols);
}

PARM_SIMD_CLONES
void ce_row_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t n,
                 int64_t cols, double* stats) {
  PARM_CHECK(n >= 0 && cols > 0, "ce_row_sums: bad shape ({}, {})", n, cols);
  constexpr int kL = detail::kLanes;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * cols;
    const float mx = row_max[r];
    double acc[kL] = {};
    int64_t c = 0;
    for (; c + kL <= cols; c += kL)
      for (int j = 0; j < kL; ++j) acc[j] += detail::exp_f32(x[c + j] - mx);
    for (; c < cols; ++c) acc[0] += detail::exp_f32(x[c] - mx);
    double sum = 0.0;
    for (int j = 0; j < kL; ++j) sum += acc[j];
    const int32_t y = targets[r];
    stats[2 * r] = sum;
    stats[2 * r + 1] = y >= 0 && y < cols ? static_cast<double>(x[y]) : 0.0;
  }
}

PARM_SIMD_CLONES
double ce_finish(const float* logits, const float* row_max, const double* stats,
                 const int32_t* targets, float* dlogits, int64_t n, int64_t cols, float scale) {
  PARM_CHECK(n >= 0 && cols > 0, "ce_finish: bad shape ({}, {})", n, cols);
  double loss = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const float mx = row_max[r];
    const double sum = stats[2 * r];
    loss += std::log(sum) + static_cast<double>(mx) - stats[2 * r + 1];
    if (dlogits == nullptr) continue;
    const float* x = logits + r * cols;
    float* d = dlogits + r * cols;
    const float k = static_cast<float>(static_cast<double>(scale) / sum);
    for (int64_t c = 0; c < cols; ++c) d[c] = detail::exp_f32(x[c] - mx) * k;
    const int32_t y = targets[r];
    if (y >= 0 && y < cols) d[y] -= scale;
  }
  return loss;
}

}  // namespace parm::cpu
