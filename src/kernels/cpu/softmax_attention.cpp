// The attention's masked softmax over one head's (L, L) scores, forward and backward, with
// the 1 / sqrt(D) scale folded in: AVX-512 where the CPU has it, else the row kernels
// (softmax.cpp) called per row as the attention did before. The AVX-512 path keeps their
// arithmetic (the exponential is exp_f32's: the same clamp, reduction and polynomial, with
// FMAs; sums of 16 lanes added in lane order, the tail after them in order), so the two
// agree to a few ulp; one call per head instead of one per row, no pass of its own for the
// scale or the mask, and masked tails instead of scalar ones (a causal row averages L / 2
// entries, so a third of them fell in the scalar tail).
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/avx512.h"
#include "parm/error.h"


namespace parm::cpu {
namespace {

int64_t keys_seen(int64_t row, int64_t L, bool causal) { return causal ? row + 1 : L; }

void forward_rows_scalar(float* p, int64_t L, float scale, bool causal) {
  for (int64_t i = 0; i < L; ++i) {
    float* row = p + i * L;
    const int64_t n = keys_seen(i, L, causal);
    for (int64_t j = 0; j < n; ++j) row[j] *= scale;
    softmax_forward(row, row, 1, n);
    for (int64_t j = n; j < L; ++j) row[j] = 0.0f;
  }
}

void backward_rows_scalar(const float* p, float* ds, int64_t L, float scale, bool causal) {
  for (int64_t i = 0; i < L; ++i) {
    float* row = ds + i * L;
    const int64_t n = keys_seen(i, L, causal);
    softmax_backward(p + i * L, row, row, 1, n);
    for (int64_t j = 0; j < n; ++j) row[j] *= scale;
    for (int64_t j = n; j < L; ++j) row[j] = 0.0f;
  }
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// vec_math.h exp_f32, 16 lanes: exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN.
PARM_AVX512 __m512 exp_avx512(__m512 x) {
  using namespace detail::exp_f32_constants;
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kLo)),
                                  _mm512_set1_ps(kHi));  // NaN -> kLo, fixed below
  const __m512 round = _mm512_set1_ps(kRound);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(kLog2e), round), round);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 q = _mm512_fmadd_ps(r, _mm512_set1_ps(1.0f / 40320.0f), _mm512_set1_ps(1.0f / 5040.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f / 720.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f / 120.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f / 24.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f / 6.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(0.5f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f));
  q = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f));
  const __m512 y = detail::times_pow2_avx512(q, n);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

// row[n, L) = 0: the keys a causal query does not see.
PARM_AVX512 void zero_from(float* row, int64_t n, int64_t L) {
  for (int64_t j = n; j < L; j += 16)
    _mm512_mask_storeu_ps(row + j, detail::first_lanes(L - j), _mm512_setzero_ps());
}

// Rows i0 .. i0 + G - 1, each with the arithmetic of one row alone, in stages over the G
// rows: the G rows' serial chains (the max and sum reductions, the scalar tail sums, the
// division) are independent, so the core overlaps them instead of waiting out one row's
// before the next (a causal row of L = 64 holds 2 vectors on average: latency, not
// throughput, bounds it). G = 1 is the one-row form; every G gives its bits.
template <int G>
PARM_AVX512 void forward_group_avx512(float* p, int64_t i0, int64_t L, float scale, bool causal) {
  const __m512 vs = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
  float* row[G];
  int64_t n[G], body[G];
  __mmask16 tail[G];
  __m512 vmx[G], acc[G], et[G];
  alignas(64) float tail_e[G][16];
  for (int r = 0; r < G; ++r) {
    row[r] = p + (i0 + r) * L;
    n[r] = keys_seen(i0 + r, L, causal);
    body[r] = n[r] / 16 * 16;
    tail[r] = detail::first_lanes(n[r] - body[r]);
  }
  for (int r = 0; r < G; ++r) {
    // The max ignores NaN, as max_f32 does (max_ps returns its second operand on NaN).
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < body[r]; j += 16)
      mx = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(row[r] + j), vs), mx);
    mx = _mm512_mask_max_ps(
        mx, tail[r], _mm512_mul_ps(_mm512_maskz_loadu_ps(tail[r], row[r] + body[r]), vs), mx);
    vmx[r] = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  }
  for (int r = 0; r < G; ++r) {
    acc[r] = zero;
    for (int64_t j = 0; j < body[r]; j += 16) {
      const __m512 e =
          exp_avx512(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(row[r] + j), vs), vmx[r]));
      acc[r] = _mm512_add_ps(acc[r], e);
      _mm512_storeu_ps(row[r] + j, e);
    }
    et[r] = exp_avx512(_mm512_sub_ps(
        _mm512_mul_ps(_mm512_maskz_loadu_ps(tail[r], row[r] + body[r]), vs), vmx[r]));
    _mm512_store_ps(tail_e[r], et[r]);
  }
  for (int r = 0; r < G; ++r) {
    float sum = detail::lane_sum_avx512(acc[r]);
    for (int64_t j = 0; j < n[r] - body[r]; ++j) sum += tail_e[r][j];
    const __m512 inv = _mm512_set1_ps(1.0f / sum);
    for (int64_t j = 0; j < body[r]; j += 16)
      _mm512_storeu_ps(row[r] + j, _mm512_mul_ps(_mm512_loadu_ps(row[r] + j), inv));
    _mm512_mask_storeu_ps(row[r] + body[r], tail[r], _mm512_mul_ps(et[r], inv));
    zero_from(row[r], n[r], L);
  }
}

template <int G>
PARM_AVX512 void backward_group_avx512(const float* p, float* ds, int64_t i0, int64_t L,
                                       float scale, bool causal) {
  const __m512 vs = _mm512_set1_ps(scale), zero = _mm512_setzero_ps();
  const float* y[G];
  float* row[G];
  int64_t n[G], body[G];
  __mmask16 tail[G];
  __m512 acc[G];
  for (int r = 0; r < G; ++r) {
    y[r] = p + (i0 + r) * L;
    row[r] = ds + (i0 + r) * L;
    n[r] = keys_seen(i0 + r, L, causal);
    body[r] = n[r] / 16 * 16;
    tail[r] = detail::first_lanes(n[r] - body[r]);
    acc[r] = zero;
    for (int64_t j = 0; j < body[r]; j += 16)
      acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(y[r] + j), _mm512_loadu_ps(row[r] + j), acc[r]);
  }
  for (int r = 0; r < G; ++r) {
    float dot = detail::lane_sum_avx512(acc[r]);
    for (int64_t j = body[r]; j < n[r]; ++j) dot += y[r][j] * row[r][j];
    const __m512 vdot = _mm512_set1_ps(dot);
    for (int64_t j = 0; j < body[r]; j += 16) {
      const __m512 d = _mm512_mul_ps(_mm512_loadu_ps(y[r] + j),
                                     _mm512_sub_ps(_mm512_loadu_ps(row[r] + j), vdot));
      _mm512_storeu_ps(row[r] + j, _mm512_mul_ps(d, vs));
    }
    const __m512 dt =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(tail[r], y[r] + body[r]),
                      _mm512_sub_ps(_mm512_maskz_loadu_ps(tail[r], row[r] + body[r]), vdot));
    _mm512_mask_storeu_ps(row[r] + body[r], tail[r], _mm512_mul_ps(dt, vs));
    zero_from(row[r], n[r], L);
  }
}

// All L rows, kRowGroup at a time (1 at a time with group 1: the one-row form).
constexpr int kRowGroup = 4;

PARM_AVX512 void forward_rows_avx512(float* p, int64_t L, float scale, bool causal, int group) {
  int64_t i = 0;
  if (group == kRowGroup)
    for (; i + kRowGroup <= L; i += kRowGroup) forward_group_avx512<kRowGroup>(p, i, L, scale, causal);
  for (; i < L; ++i) forward_group_avx512<1>(p, i, L, scale, causal);
}

PARM_AVX512 void backward_rows_avx512(const float* p, float* ds, int64_t L, float scale,
                                      bool causal, int group) {
  int64_t i = 0;
  if (group == kRowGroup)
    for (; i + kRowGroup <= L; i += kRowGroup)
      backward_group_avx512<kRowGroup>(p, ds, i, L, scale, causal);
  for (; i < L; ++i) backward_group_avx512<1>(p, ds, i, L, scale, causal);
}
#pragma GCC diagnostic pop


}  // namespace

void attention_softmax_forward(float* p, int64_t L, float scale, bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_forward: {} keys; need at least 1", L);
  if (detail::have_avx512f())
    forward_rows_avx512(p, L, scale, causal, kRowGroup);
  else
    forward_rows_scalar(p, L, scale, causal);
}

void attention_softmax_forward_one_row_at_a_time(float* p, int64_t L, float scale,
                                                 bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_forward: {} keys; need at least 1", L);
  if (detail::have_avx512f())
    forward_rows_avx512(p, L, scale, causal, 1);
  else
    forward_rows_scalar(p, L, scale, causal);
}

void attention_softmax_backward_one_row_at_a_time(const float* p, float* ds, int64_t L,
                                                  float scale, bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_backward: {} keys; need at least 1", L);
  if (detail::have_avx512f())
    backward_rows_avx512(p, ds, L, scale, causal, 1);
  else
    backward_rows_scalar(p, ds, L, scale, causal);
}

void attention_softmax_forward_reference(float* p, int64_t L, float scale, bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_forward: {} keys; need at least 1", L);
  forward_rows_scalar(p, L, scale, causal);
}

void attention_softmax_backward(const float* p, float* ds, int64_t L, float scale, bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_backward: {} keys; need at least 1", L);
  if (detail::have_avx512f())
    backward_rows_avx512(p, ds, L, scale, causal, kRowGroup);
  else
    backward_rows_scalar(p, ds, L, scale, causal);
}

void attention_softmax_backward_reference(const float* p, float* ds, int64_t L, float scale,
                                          bool causal) {
  PARM_CHECK(L > 0, "attention_softmax_backward: {} keys; need at least 1", L);
  backward_rows_scalar(p, ds, L, scale, causal);
}

}  // namespace parm::cpu
