// GeLU for the bf16 path (kernels.h: bias_gelu_bf16). Same tanh form as gelu.cpp,
//   gelu(x) = x s,  gelu'(x) = s + x s (1 - s) 2u'(x),  s = 1 / (1 + 2^t),  1 - s = 2^t s,
//   t = -2u log2(e) = x (kT1 + kT3 x^2),
// with 2^t as 2^n p(f) (n = round(t), |f| <= 1/2, p the degree-5 Taylor polynomial of 2^f,
// relative error < 3e-6; VSCALEFPS applies 2^n) and 1 / (1 + 2^t) by VRCP14PS (relative error
// < 2^-14). No division and no exponent bit tricks: half of gelu.cpp's instructions. Measured
// over x in [-20, 20]: values within 6.3e-5 relative, gradients within 5.3e-5 absolute; the
// products round act and dpre to bf16 (2^-9 relative), 30x coarser.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

using detail::first_lanes;

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr float kT1 = -2.0f * kSqrt2OverPi * kLog2e;
constexpr float kT3 = kT1 * kCubic;
constexpr float kDu1 = 2.0f * kSqrt2OverPi;               // 2u'(x) = kDu1 + kDu3 x^2
constexpr float kDu3 = 2.0f * kSqrt2OverPi * 3.0f * kCubic;
// t stays within +-126: 1 + 2^t and its reciprocal are normal floats. Beyond it s is 1 to
// fp32 precision (t < -126) or below 2^-126 (gelu(x) then rounds to 0 in bf16).
constexpr float kTClamp = 126.0f;
// As in gelu.cpp: gelu(x) rounds to -0 below it (here to -20 x 2^-126 at most), and -inf
// must not meet s = 2^-126.
constexpr float kValueClamp = -20.0f;
// As in gelu.cpp: gelu'(x) is 1 (x > 9.5) or below 2e-31 (x < -9.5) there.
constexpr float kGradClamp = 9.5f;


// 2^t for |t| <= 126.
PARM_AVX512 inline __m512 exp2_avx512(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558e-3f);  // ln2^5 / 120
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));  // ln2^4 / 24
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));  // ln2^3 / 6
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022651f));    // ln2^2 / 2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69314718f));    // ln2
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

PARM_AVX512 inline __m512 clamp(__m512 v, float limit) {
  return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-limit)), _mm512_set1_ps(limit));
}

// Columns c .. c + 16 of a row (fewer at the end: `mask`).
PARM_AVX512 inline __m512 load(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}

// gelu(x + bias) of lanes c .. c + 15 (0 in lanes past the row).
PARM_AVX512 inline __m512 gelu16(const float* xr, const float* bias, int64_t c, __mmask16 m) {
  // max(lo, v) returns v where v is NaN: t clamps to a number, and v s stays NaN.
  const __m512 v = _mm512_max_ps(_mm512_set1_ps(kValueClamp),
                                 _mm512_add_ps(load(xr + c, m), load(bias + c, m)));
  const __m512 v2 = _mm512_mul_ps(v, v);
  const __m512 t = clamp(_mm512_mul_ps(v, _mm512_fmadd_ps(v2, _mm512_set1_ps(kT3),
                                                          _mm512_set1_ps(kT1))),
                         kTClamp);
  const __m512 s = _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), exp2_avx512(t)));
  return _mm512_mul_ps(v, s);
}

// gelu'(x + bias) dact of lanes c .. c + 15 (0 in lanes past the row), added to dbias there.
PARM_AVX512 inline __m512 gelu_grad16(const float* xr, const float* bias, const float* gr,
                                      float* dbias, int64_t c, __mmask16 m) {
  const __m512 raw = _mm512_add_ps(load(xr + c, m), load(bias + c, m));
  const __m512 v = clamp(raw, kGradClamp);
  const __m512 v2 = _mm512_mul_ps(v, v);
  const __m512 e = exp2_avx512(
      _mm512_mul_ps(v, _mm512_fmadd_ps(v2, _mm512_set1_ps(kT3), _mm512_set1_ps(kT1))));
  const __m512 s = _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
  const __m512 du = _mm512_fmadd_ps(v2, _mm512_set1_ps(kDu3), _mm512_set1_ps(kDu1));
  // g = s + v s (2^t s) 2u'
  const __m512 g = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_mul_ps(e, s)),
                                   du, s);
  // The clamp turns NaN into a number: put the NaN back.
  const __mmask16 nan = _mm512_cmp_ps_mask(raw, raw, _CMP_UNORD_Q);
  const __m512 d = _mm512_mask_mov_ps(_mm512_mul_ps(g, load(gr + c, m)), nan, raw);
  _mm512_mask_storeu_ps(dbias + c, m, _mm512_add_ps(load(dbias + c, m), d));
  return d;
}

PARM_AVX512 void bias_gelu_avx512(const float* x, const float* bias, float* act, int64_t rows,
                                  int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      _mm512_mask_storeu_ps(act + r * cols + c, m, gelu16(x + r * cols, bias, c, m));
    }
}

PARM_AVX512 void bias_gelu_backward_avx512(const float* x, const float* bias, const float* dact,
                                           float* dx, float* dbias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      const __m512 d = gelu_grad16(x + r * cols, bias, dact + r * cols, dbias, c, m);
      _mm512_mask_storeu_ps(dx + r * cols + c, m, d);
    }
}

// The two above, 32 values at a time, each 32 also rounded into packed A from the registers
// (the padding columns up to a multiple of 32 hold 0 there: gelu(0) and 0 dact give 0).
PARM_AVX512_BF16 inline void store32(float* out, int64_t c, __mmask16 m0, __mmask16 m1,
                                     __m512 lo, __m512 hi, uint16_t* packed_row) {
  _mm512_mask_storeu_ps(out + c, m0, lo);
  _mm512_mask_storeu_ps(out + c + 16, m1, hi);
  _mm512_storeu_si512(packed_row, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

PARM_AVX512_BF16 void bias_gelu_pack_avx512(const float* x, const float* bias, float* act,
                                            int64_t rows, int64_t cols, uint16_t* packed) {
  const int64_t kp = detail::round_up(cols, detail::kTileK);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    for (int64_t c = 0; c < kp; c += 32) {
      const __mmask16 m0 = first_lanes(cols - c), m1 = first_lanes(cols - (c + 16));
      store32(act + r * cols, c, m0, m1, gelu16(xr, bias, c, m0), gelu16(xr, bias, c + 16, m1),
              packed + detail::packed_a_offset(r, c, kp));
    }
  }
}

PARM_AVX512_BF16 void bias_gelu_backward_pack_avx512(const float* x, const float* bias,
                                                     const float* dact, float* dx, float* dbias,
                                                     int64_t rows, int64_t cols,
                                                     uint16_t* packed) {
  const int64_t kp = detail::round_up(cols, detail::kTileK);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * cols, *gr = dact + r * cols;
    for (int64_t c = 0; c < kp; c += 32) {
      const __mmask16 m0 = first_lanes(cols - c), m1 = first_lanes(cols - (c + 16));
      const __m512 lo = gelu_grad16(xr, bias, gr, dbias, c, m0);
      const __m512 hi = gelu_grad16(xr, bias, gr, dbias, c + 16, m1);
      store32(dx + r * cols, c, m0, m1, lo, hi, packed + detail::packed_a_offset(r, c, kp));
    }
  }
}

// Padding rows rows .. round_up(rows, 16) of packed A: zeros, as bf16_pack_a writes them.
void zero_padding_rows(int64_t rows, int64_t cols, uint16_t* packed) {
  const int64_t kp = detail::round_up(cols, detail::kTileK);
  for (int64_t i = rows; i < detail::round_up(rows, detail::kTileRows); ++i)
    for (int64_t j = 0; j < kp; j += detail::kTileK)
      std::fill_n(packed + detail::packed_a_offset(i, j, kp), detail::kTileK, uint16_t{0});
}

bool fused_packing() {
  return detail::have_avx512f() && detail::have_avx512_bf16() && !detail::bf16_portable_forced();
}

#pragma GCC diagnostic pop

}  // namespace

void bias_gelu_bf16(const float* x, const float* bias, float* act, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_bf16: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f())
    bias_gelu_avx512(x, bias, act, rows, cols);
  else
    bias_gelu(x, bias, act, rows, cols);
}

void bias_gelu_backward_bf16(const float* x, const float* bias, const float* dact, float* dx,
                             float* dbias, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_backward_bf16: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f())
    bias_gelu_backward_avx512(x, bias, dact, dx, dbias, rows, cols);
  else
    bias_gelu_backward(x, bias, dact, dx, dbias, rows, cols);
}

void bias_gelu_pack_a_bf16(const float* x, const float* bias, float* act, int64_t rows,
                           int64_t cols, uint16_t* packed) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_pack_a_bf16: bad shape ({}, {})", rows, cols);
  if (!fused_packing()) {
    bias_gelu_bf16(x, bias, act, rows, cols);
    bf16_pack_a(false, rows, cols, act, std::max<int64_t>(cols, 1), packed);
    return;
  }
  bias_gelu_pack_avx512(x, bias, act, rows, cols, packed);
  zero_padding_rows(rows, cols, packed);
}

void bias_gelu_backward_pack_a_bf16(const float* x, const float* bias, const float* dact,
                                    float* dx, float* dbias, int64_t rows, int64_t cols,
                                    uint16_t* packed) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_backward_pack_a_bf16: bad shape ({}, {})", rows,
             cols);
  if (!fused_packing()) {
    bias_gelu_backward_bf16(x, bias, dact, dx, dbias, rows, cols);
    bf16_pack_a(false, rows, cols, dx, std::max<int64_t>(cols, 1), packed);
    return;
  }
  bias_gelu_backward_pack_avx512(x, bias, dact, dx, dbias, rows, cols, packed);
  zero_padding_rows(rows, cols, packed);
}

}  // namespace parm::cpu
