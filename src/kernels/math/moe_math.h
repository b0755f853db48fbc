// The per-row and per-element maths of the MoE gate, dispatch and combine, written once for
// the CPU gate (moe/gate.cpp, kernels/cpu/topk.cpp), the CUDA kernels (cuda/moe_kernels.cu)
// and a CPU test that drives the kernels' rows with a serial loop
// (tests/unit/test_cuda_moe_math.cpp) against the CPU functions of moe/moe_ops.h.
//
// Every function reproduces the CPU kernels' operation order, so that a GPU result is the
// CPU result bit for bit where the CPU's own rounding is fixed:
// the CPU library is built with -ffp-contract=off (CMakeLists.txt), so no CPU kernel, and no
// target clone of vec_math.h on any CPU, fuses a multiply into an add; mul_nc() (exp_math.h)
// keeps the device compiler from fusing one too (nvcc contracts by default). The exp is
// exp_math.h's, the one the CPU kernels use.
//
// Plain C++ with no CUDA include (the CPU build includes it): under nvcc the functions are
// __host__ __device__.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/math/exp_math.h"
#include "parm/host_device.h"
#include "shape/packed_rows.h"

namespace parm::math {

// The CPU kernels reduce in 16 independent lanes (element i goes to lane i % 16 for every
// full group of 16) and then add the lanes in order.
constexpr int kLanes = 16;

// ---- softmax of one row (cpu::softmax_forward / softmax_backward) -------------------------

// y (cols) = softmax(x); y may alias x. The max ignores NaN, as the CPU's does.
PARM_HD inline void softmax_row(const float* x, float* y, int64_t cols) {
  const float neg_inf = -INFINITY;
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = neg_inf;
  int64_t i = 0;
  for (; i + kLanes <= cols; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float mx = neg_inf;
  for (int j = 0; j < kLanes; ++j) mx = acc[j] > mx ? acc[j] : mx;
  for (; i < cols; ++i) mx = x[i] > mx ? x[i] : mx;

  for (int64_t c = 0; c < cols; ++c) y[c] = exp_f32(x[c] - mx);

  for (int j = 0; j < kLanes; ++j) acc[j] = 0.0f;
  i = 0;
  for (; i + kLanes <= cols; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += y[i + j];
  float sum = 0.0f;
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
  for (; i < cols; ++i) sum += y[i];
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < cols; ++c) y[c] = mul_nc(y[c], inv);
}

// dx (cols) = y * (dy - <y, dy>); dx may alias dy.
PARM_HD inline void softmax_backward_row(const float* y, const float* dy, float* dx,
                                         int64_t cols) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = 0.0f;
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = (mul_nc(y[c + j], dy[c + j]) + acc[j]);
  float dot = 0.0f;
  for (int j = 0; j < kLanes; ++j) dot += acc[j];
  for (; c < cols; ++c) dot = (mul_nc(y[c], dy[c]) + dot);
  for (c = 0; c < cols; ++c) dx[c] = mul_nc(y[c], dy[c] - dot);
}

// ---- top-k and combine weights of one token (cpu::topk, moe::gate_forward) ----------------

// Strict total order on (value, column): larger first, NaN above every number, ties to the
// lower column.
PARM_HD inline bool ranks_before(float va, int32_t ia, float vb, int32_t ib) {
  const bool na = is_nan(va);
  const bool nb = is_nan(vb);
  if (na || nb) return na && (!nb || ia < ib);
  if (va != vb) return va > vb;
  return ia < ib;
}

// idx (k), val (k): the k first of x (cols) in that order. k selection passes, each picking
// the best element ranked strictly after the previous pick: the same result as the CPU's
// one-pass insertion (k <= 32) and partial sort (k > 32), the order being total.
// 1 <= k <= cols.
PARM_HD inline void topk_row(const float* x, int64_t cols, int k, int32_t* idx, float* val) {
  const auto n = static_cast<int32_t>(cols);
  int32_t prev_i = -1;
  float prev_v = 0.0f;
  for (int j = 0; j < k; ++j) {
    int32_t best = -1;
    float best_v = 0.0f;
    for (int32_t c = 0; c < n; ++c) {
      const float v = x[c];
      if (j > 0 && !ranks_before(prev_v, prev_i, v, c)) continue;
      if (best < 0 || ranks_before(v, c, best_v, best)) {
        best = c;
        best_v = v;
      }
    }
    idx[j] = best;
    val[j] = best_v;
    prev_i = best;
    prev_v = best_v;
  }
}

// w (k) = p (k) when k == 1, else p / sum(p) (summed in order, before any drop).
// norm false (the router's top-k normalisation off) keeps p as k = 1 does; scale multiplies
// every weight (docs/spec.md §7; 1: §2's weights, bit for bit).
PARM_HD inline void combine_weights(const float* p, int k, float* w, bool norm = true,
                                    float scale = 1.0f) {
  if (k == 1 || !norm) {
    for (int j = 0; j < k; ++j) w[j] = mul_nc(scale, p[j]);
    return;
  }
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += p[j];
  for (int j = 0; j < k; ++j) w[j] = mul_nc(scale, p[j] / sum);
}

// ---- GShard slots -------------------------------------------------------------------------

// Priority position i in [0, k * tokens) (all 1st choices in token order, then all 2nd
// choices, ...) -> the choice index t * k + j of the routing arrays.
PARM_HD inline int64_t priority_choice(int64_t i, int64_t tokens, int k) {
  const int64_t j = i / tokens;
  const int64_t t = i - j * tokens;
  return t * k + j;
}

// Dispatch-buffer row of the choice that takes expert e's `pos`-th place in priority order:
// e * slots + pos while pos < capacity, else -1 (dropped).
PARM_HD inline int32_t slot_row(int64_t e, int64_t pos, int64_t capacity, int64_t slots) {
  return pos < capacity ? static_cast<int32_t>(e * slots + pos) : -1;
}

// The slot scan (one block of kSlotThreads threads per expert) walks the priority order in
// chunks of kSlotThreads * kSlotItems positions; thread i of a chunk owns its positions
// [i * kSlotItems, (i + 1) * kSlotItems).
constexpr int kSlotThreads = 512;
constexpr int kSlotItems = 8;
constexpr int kSlotChunk = kSlotThreads * kSlotItems;

// One thread's items of the slot scan of expert e: flag[u] says whether priority position
// i0 + u chose e; `pos` is the number of choices of e before i0 (an exclusive scan). Writes
// row (and source, for kept ones) of each flagged choice, counts its 1st choices into
// *first, returns pos past them.
PARM_HD inline int64_t assign_slots(const unsigned char* flag, int items, int64_t i0,
                                    int64_t tokens, int k, int64_t e, int64_t pos,
                                    int64_t capacity, int64_t slots, int32_t* row,
                                    int32_t* source, int* first) {
  for (int u = 0; u < items; ++u) {
    if (!flag[u]) continue;
    const int64_t i = i0 + u;
    const int64_t c = priority_choice(i, tokens, k);
    if (i < tokens) ++*first;
    row[c] = slot_row(e, pos, capacity, slots);
    if (pos < capacity) source[e * tokens + pos] = static_cast<int32_t>(c);
    ++pos;
  }
  return pos;
}

// ---- the packed layout of dropless routing (shape/packed_rows.h, moe::pack_routing) --------

// The experts' starts: parm::packed_starts (shape/packed_rows.h, host and device).

// A choice's row in the packed layout: its slot in expert e (row - e * slots, the slot scan's
// numbering) after the rows of the experts before e (first_e); a drop (-1) stays -1.
PARM_HD inline int32_t packed_row(int32_t row, int64_t e, int64_t slots, int32_t first_e) {
  return row < 0 ? -1 : static_cast<int32_t>(row - e * slots + first_e);
}

// The token whose x row choice c (= t * k + j) carries.
PARM_HD inline int64_t choice_token(int64_t c, int k) { return c / k; }

// ---- gate backward of one token (moe::gate_backward) --------------------------------------

// dp (E) = dpsum (E), then += the adjoint of the combine weights w.r.t. the chosen
// probabilities: k == 1: dp[e_0] += g_0; k > 1 (w_j = p_j / S): dp[e_j] += g_j / S -
// sum_i g_i p_i / S^2. Overwrites dp.
PARM_HD inline void weights_backward_row(const int32_t* expert, const float* prob,
                                         const float* dweight, int k, const float* dpsum,
                                         int64_t experts, float* dp, bool norm = true,
                                         float scale = 1.0f) {
  for (int64_t e = 0; e < experts; ++e) dp[e] = dpsum[e];
  if (k == 1 || !norm) {
    for (int j = 0; j < k; ++j) dp[expert[j]] += mul_nc(scale, dweight[j]);
    return;
  }
  float s = 0.0f, gp = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float dw = mul_nc(scale, dweight[j]);
    s += prob[j];
    gp += mul_nc(dw, prob[j]);
  }
  const float s2 = mul_nc(s, s);
  for (int j = 0; j < k; ++j) dp[expert[j]] += mul_nc(scale, dweight[j]) / s - gp / s2;
}

// ---- dispatch / combine of one element (moe dispatch_combine.cpp) -------------------------

// out[t, m] = sum over kept choices j of weight_j * buf[row_j, m], from 0 in choice order.
// row / weight: the token's k entries.
PARM_HD inline float combine_element(const int32_t* row, const float* weight, int k,
                                     const float* buf, int64_t model_dim, int64_t m) {
  float acc = 0.0f;
  for (int j = 0; j < k; ++j)
    if (row[j] >= 0) acc += mul_nc(weight[j], buf[static_cast<int64_t>(row[j]) * model_dim + m]);
  return acc;
}

// dx[t, m] + sum over kept choices of dbuf[row_j, m], added in choice order.
PARM_HD inline float dispatch_backward_element(float dx, const int32_t* row, int k,
                                               const float* dbuf, int64_t model_dim,
                                               int64_t m) {
  for (int j = 0; j < k; ++j)
    if (row[j] >= 0) dx += dbuf[static_cast<int64_t>(row[j]) * model_dim + m];
  return dx;
}

// Lane `lane` (< kLanes) of <a, b> over n floats: the elements i = lane (mod kLanes) in
// increasing order. sum_lanes() then adds the kLanes partials in order: together exactly the
// CPU combine's dot product (dispatch_combine.cpp dot_lanes).
PARM_HD inline float dot_lane(const float* a, const float* b, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t i = lane; i < n; i += kLanes) acc += mul_nc(a[i], b[i]);
  return acc;
}

PARM_HD inline float sum_lanes(const float* partial) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += partial[j];
  return s;
}

}  // namespace parm::math
