// Per-row device functions of the dense kernels, run by a group of 16 consecutive threads
// (dense_common.cuh) in the CPU's summation order (dense_math.h lane_partial / finish_lanes).
// Private to src/kernels/cuda/dense_*.
#pragma once

#include <cstdint>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_math.h"

namespace parm::cuda::dense {

// The group's full sum from each thread's lane partial: every thread of the group gets the
// lanes (in lane order) and adds them and the tail f(c), c >= lane_span(n), as the CPU does.
template <class F>
__device__ inline float group_sum(float partial, int64_t n, unsigned mask, F f) {
  float lanes[dense_math::kLanes];
#pragma unroll
  for (int j = 0; j < dense_math::kLanes; ++j) lanes[j] = __shfl_sync(mask, partial, j, 16);
  return dense_math::finish_lanes(lanes, n, f);
}

// y[j] = softmax(scale * x[j]) over j < n (cpu::softmax_forward of the scaled row, with the
// CPU's exp and sums: its bits), and y[j] = 0 for n <= j < zero_to (the masked keys). x may
// alias y.
__device__ inline void softmax_row(const float* x, float* y, int64_t n, int64_t zero_to,
                                   float scale) {
  using namespace dense_math;
  const int lane = group_lane();
  const unsigned mask = group_mask();
  const int64_t span = lane_span(n);
  float mx = -INFINITY;  // the CPU's max_f32: NaN never wins a comparison
  for (int64_t c = lane; c < n; c += kLanes) {
    const float v = mul_nc(x[c], scale);
    mx = v > mx ? v : mx;
  }
#pragma unroll
  for (int off = 8; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(mask, mx, off, 16);
    mx = o > mx ? o : mx;
  }
  // Each thread writes only its own lane's elements before the sum is known; the tail
  // (read by every thread of the group) is written after the group has read it.
  float acc = 0.0f;
  for (int64_t c = lane; c < span; c += kLanes) {
    const float e = exp_f32(mul_nc(x[c], scale) - mx);
    y[c] = e;
    acc += e;
  }
  const float sum =
      group_sum(acc, n, mask, [&](int64_t c) { return exp_f32(mul_nc(x[c], scale) - mx); });
  __syncwarp(mask);
  const float inv = 1.0f / sum;
  for (int64_t c = lane; c < span; c += kLanes) y[c] = mul_nc(y[c], inv);
  if (span + lane < n) y[span + lane] = mul_nc(exp_f32(mul_nc(x[span + lane], scale) - mx), inv);
  for (int64_t c = n + lane; c < zero_to; c += kLanes) y[c] = 0.0f;
}

// dx[j] = (y[j] (dy[j] - sum_i y[i] dy[i])) * scale over j < n (cpu::softmax_backward, then
// the attention's scale), dx[j] = 0 for n <= j < zero_to. dx may alias dy.
__device__ inline void softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n,
                                            int64_t zero_to, float scale) {
  using namespace dense_math;
  const int lane = group_lane();
  const unsigned mask = group_mask();
  float acc = 0.0f;
  for (int64_t c = lane; c < lane_span(n); c += kLanes) acc += mul_nc(y[c], dy[c]);
  const float dot = group_sum(acc, n, mask, [&](int64_t c) { return mul_nc(y[c], dy[c]); });
  __syncwarp(mask);
  for (int64_t c = lane; c < n; c += kLanes) dx[c] = mul_nc(mul_nc(y[c], dy[c] - dot), scale);
  for (int64_t c = n + lane; c < zero_to; c += kLanes) dx[c] = 0.0f;
}

}  // namespace parm::cuda::dense
