// GeLU for the bf16 path (kernels.h: bias_gelu_bf16). Same tanh form, constants and clamps
// as gelu.cpp (kernels/math/gelu_math.h),
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
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "kernels/math/gelu_math.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

using detail::first_lanes;
using detail::kTileK;
using detail::kTileRows;

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it (as
// -Wuninitialized where constant operands fold).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

using gelu::kCubic;
using gelu::kGradClamp;
using gelu::kSqrt2OverPi;
using gelu::kValueClamp;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kT1 = -2.0f * kSqrt2OverPi * kLog2e;
constexpr float kT3 = kT1 * kCubic;
constexpr float kDu1 = 2.0f * kSqrt2OverPi;               // 2u'(x) = kDu1 + kDu3 x^2
constexpr float kDu3 = 2.0f * kSqrt2OverPi * 3.0f * kCubic;
// t stays within +-126: 1 + 2^t and its reciprocal are normal floats. Beyond it s is 1 to
// fp32 precision (t < -126) or below 2^-126 (gelu(x) then rounds to 0 in bf16).
constexpr float kTClamp = 126.0f;
// kValueClamp: gelu(x) rounds to -0 below it (here to -20 x 2^-126 at most), and -inf must
// not meet s = 2^-126. kGradClamp: gelu'(x) is 1 (x > 9.5) or below 2e-31 (x < -9.5) there.


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

// gelu'(v) = s + v s (2^t s) 2u'(v), from gelu's own v^2, 2^t and s.
PARM_AVX512 inline __m512 grad_from(__m512 v, __m512 v2, __m512 e, __m512 s) {
  const __m512 du = _mm512_fmadd_ps(v2, _mm512_set1_ps(kDu3), _mm512_set1_ps(kDu1));
  return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_mul_ps(e, s)), du, s);
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

// gelu'(raw) of 16 lanes, the gradient taken at raw clamped to +-kGradClamp (NaN lanes: a
// number; callers put the NaN back).
PARM_AVX512 inline __m512 grad_at16(__m512 raw) {
  const __m512 v = clamp(raw, kGradClamp);
  const __m512 v2 = _mm512_mul_ps(v, v);
  const __m512 e = exp2_avx512(
      _mm512_mul_ps(v, _mm512_fmadd_ps(v2, _mm512_set1_ps(kT3), _mm512_set1_ps(kT1))));
  const __m512 s = _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
  return grad_from(v, v2, e, s);
}

// gelu'(x + bias) dact of lanes c .. c + 15 (0 in lanes past the row), added to dbias there.
PARM_AVX512 inline __m512 gelu_grad16(const float* xr, const float* bias, const float* gr,
                                      float* dbias, int64_t c, __mmask16 m) {
  const __m512 raw = _mm512_add_ps(load(xr + c, m), load(bias + c, m));
  // The clamp turns NaN into a number: put the NaN back.
  const __mmask16 nan = _mm512_cmp_ps_mask(raw, raw, _CMP_UNORD_Q);
  const __m512 d = _mm512_mask_mov_ps(_mm512_mul_ps(grad_at16(raw), load(gr + c, m)), nan, raw);
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

// ---- the experts' GeLU steps, every output packed from registers ---------------------------

// Columns per group: both steps run a block's 32 rows over 128 columns, then the next 128.
// Each output then goes to a few contiguous KiB: 8 B panels (each 16 pairs x 64 bytes), 8 KiB
// of A's tiles, 8 KiB of staged pairs. All columns of a row pair before the next pair wrote
// every B panel's row pair (272 pairs x 64 bytes apart at k = 513) and A's and the staging's
// 64-byte rows 1 KiB apart, which fell into a few L1 sets: B's stores alone took 0.44 ns a
// value, half the backward step (one thread, Hl 2048, 513 rows).
constexpr int64_t kGroupCols = 128;

// gelu(x + bias) of lanes c .. c + 15 (gelu16's bits), and in `grad` gelu'(x + bias) (the
// bits of grad_at16; NaN where x + bias is NaN): one 2^t serves both. Beyond +-kGradClamp the
// gradient is grad_at16's there, `grad_hi` / `grad_lo`.
PARM_AVX512 inline __m512 gelu_and_grad16(const float* xr, const float* bias, int64_t c,
                                          __mmask16 m, __m512 grad_hi, __m512 grad_lo,
                                          __m512& grad) {
  const __m512 raw = _mm512_add_ps(load(xr + c, m), load(bias + c, m));
  const __m512 v = _mm512_max_ps(_mm512_set1_ps(kValueClamp), raw);  // NaN stays NaN
  const __m512 v2 = _mm512_mul_ps(v, v);
  const __m512 t = clamp(_mm512_mul_ps(v, _mm512_fmadd_ps(v2, _mm512_set1_ps(kT3),
                                                          _mm512_set1_ps(kT1))),
                         kTClamp);
  const __m512 e = exp2_avx512(t);
  const __m512 s = _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
  // Inside +-kGradClamp, v and t are grad_at16's (|t| <= 110 there: the clamp does nothing).
  __m512 g = grad_from(v, v2, e, s);
  g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(raw, _mm512_set1_ps(kGradClamp), _CMP_GT_OQ),
                         grad_hi);
  grad = _mm512_mask_mov_ps(
      g, _mm512_cmp_ps_mask(raw, _mm512_set1_ps(-kGradClamp), _CMP_LT_OQ), grad_lo);
  return _mm512_mul_ps(v, s);
}

// One block of at most 32 rows (k0 = its first row among k): act as packed A (row block at
// packed_a), act^T's k block k0 (packed_at, the whole (cols, k) operand), and gelu' over x.
// Rows 2q and 2q + 1, 32 columns at a time (64-byte rows of A written): their bf16 pairs are
// staged chunk by chunk of 16 columns (`stage`, 16 pairs x 64 bytes per chunk), then each
// chunk's 16 pairs are transposed into 16 rows of act^T's tile. Reading 16 columns of all 32
// rows at a time instead (no staging) read 32 rows 8 KiB apart, which share a few L1 sets:
// 2x slower at Hl = 2048. Pairs past `rows` stage zeros (act^T's padding columns of the last
// k block).
PARM_AVX512_BF16 void gelu_pack_both_avx512(float* x, const float* bias, int64_t k0,
                                            int64_t rows, int64_t k, int64_t cols,
                                            uint16_t* packed_a, uint16_t* packed_at,
                                            __m512i* stage) {
  const int64_t kp_a = detail::round_up(cols, kTileK), kp_t = detail::round_up(k, kTileK);
  const int64_t chunks = detail::round_up(cols, kTileRows) / kTileRows;
  const __m512 grad_hi = grad_at16(_mm512_set1_ps(kGradClamp));
  const __m512 grad_lo = grad_at16(_mm512_set1_ps(-kGradClamp));
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < kp_a; c0 += kGroupCols) {
    const int64_t c1 = std::min(kp_a, c0 + kGroupCols);
    for (int64_t q = 0; q < kTileRows; ++q) {
      const int64_t r = 2 * q;
      if (r >= rows) {
        for (int64_t j = c0 / kTileRows; j < std::min(chunks, c1 / kTileRows); ++j)
          _mm512_storeu_si512(stage + j * 16 + q, _mm512_setzero_si512());
        continue;
      }
      for (int64_t c = c0; c < c1; c += 32) {
        const __mmask16 m0 = first_lanes(cols - c), m1 = first_lanes(cols - c - 16);
        __m512 a[2][2] = {{zero, zero}, {zero, zero}};  // [row][half]
        for (int64_t h = 0; h < 2 && r + h < rows; ++h) {
          float* xr = x + (r + h) * cols;
          __m512 g0, g1;
          a[h][0] = gelu_and_grad16(xr, bias, c, m0, grad_hi, grad_lo, g0);
          a[h][1] = gelu_and_grad16(xr, bias, c + 16, m1, grad_hi, grad_lo, g1);
          _mm512_storeu_si512(packed_a + detail::packed_a_offset(r + h, c, kp_a),
                              reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a[h][1], a[h][0])));
          // gelu' over x, in place: these lines were just read, so the stores find them in L1
          _mm512_mask_storeu_ps(xr + c, m0, g0);
          _mm512_mask_storeu_ps(xr + c + 16, m1, g1);
        }
        const int64_t j = c / kTileRows;
        _mm512_storeu_si512(stage + j * 16 + q, detail::pairs16(a[0][0], a[1][0]));
        if (j + 1 < chunks)
          _mm512_storeu_si512(stage + (j + 1) * 16 + q, detail::pairs16(a[0][1], a[1][1]));
      }
    }
  }
  for (int64_t j = 0; j < chunks; ++j) {
    __m512i v[16];
    for (int64_t q = 0; q < 16; ++q) v[q] = _mm512_loadu_si512(stage + j * 16 + q);
    detail::transpose16(v);
    uint16_t* tile = packed_at + detail::packed_a_offset(j * kTileRows, k0, kp_t);
    for (int64_t i = 0; i < 16; ++i) _mm512_storeu_si512(tile + i * kTileK, v[i]);
  }
}

// dpre = gelu' dact of one block of at most 32 rows (k0 = its first row among k), dbias +=
// its column sums (row by row: bias_gelu_backward's order), rounded into packed A (row block
// at packed_a) and rows k0 .. of packed B (k, cols). Rows 2p and 2p + 1, 32 columns at a
// time: two 64-byte rows of A, and (paired) one 64-byte row of each of two B panels.
PARM_AVX512_BF16 void grad_pack_both_avx512(const float* grad, const float* dact, float* dbias,
                                            int64_t k0, int64_t rows, int64_t k, int64_t cols,
                                            uint16_t* packed_a, uint16_t* packed_b) {
  const int64_t kp_a = detail::round_up(cols, kTileK), pairs = detail::round_up(k, kTileK) / 2;
  const int64_t panels = detail::round_up(cols, kTileRows) / kTileRows;
  const int64_t a_rows = detail::round_up(rows, kTileRows);
  const __m512 zero = _mm512_setzero_ps();
  // Pairs past the block's rows are B's padding (the last block) and zeros.
  for (int64_t c0 = 0; c0 < kp_a; c0 += kGroupCols) {
    const int64_t c1 = std::min(kp_a, c0 + kGroupCols);
    for (int64_t p = 0; p < kTileK / 2; ++p) {
      const int64_t r = 2 * p;
      for (int64_t c = c0; c < c1; c += 32) {
        const __mmask16 m0 = first_lanes(cols - c), m1 = first_lanes(cols - c - 16);
        __m512 d[2][2] = {{zero, zero}, {zero, zero}};  // [row][half]
        if (r < rows) {
          __m512 db0 = load(dbias + c, m0), db1 = load(dbias + c + 16, m1);
          for (int64_t h = 0; h < 2 && r + h < rows; ++h) {
            const float* gr = grad + (r + h) * cols + c;
            const float* ar = dact + (r + h) * cols + c;
            d[h][0] = _mm512_mul_ps(load(gr, m0), load(ar, m0));
            d[h][1] = _mm512_mul_ps(load(gr + 16, m1), load(ar + 16, m1));
            db0 = _mm512_add_ps(db0, d[h][0]);
            db1 = _mm512_add_ps(db1, d[h][1]);
          }
          _mm512_mask_storeu_ps(dbias + c, m0, db0);
          _mm512_mask_storeu_ps(dbias + c + 16, m1, db1);
        }
        for (int64_t h = 0; h < 2; ++h)
          if (r + h < a_rows)
            _mm512_storeu_si512(packed_a + detail::packed_a_offset(r + h, c, kp_a),
                                reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(d[h][1], d[h][0])));
        const int64_t jp = c / kTileRows, pair = k0 / 2 + p;
        _mm512_storeu_si512(packed_b + (jp * pairs + pair) * 2 * kTileRows,
                            detail::pairs16(d[0][0], d[1][0]));
        if (jp + 1 < panels)
          _mm512_storeu_si512(packed_b + ((jp + 1) * pairs + pair) * 2 * kTileRows,
                              detail::pairs16(d[0][1], d[1][1]));
      }
    }
  }
}

PARM_AVX512 void gelu_grad_avx512(const float* x, const float* bias, float* g, int64_t rows,
                                  int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = first_lanes(cols - c);
      const __m512 raw = _mm512_add_ps(load(x + r * cols + c, m), load(bias + c, m));
      const __mmask16 nan = _mm512_cmp_ps_mask(raw, raw, _CMP_UNORD_Q);
      _mm512_mask_storeu_ps(g + r * cols + c, m, _mm512_mask_mov_ps(grad_at16(raw), nan, raw));
    }
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

int64_t gelu_pack_scratch_size(int64_t cols) {
  return kTileK * std::max<int64_t>(detail::round_up(cols, kTileRows), 1);
}

void bias_gelu_grad_bf16(const float* x, const float* bias, float* g, int64_t rows,
                         int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_grad_bf16: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f())
    gelu_grad_avx512(x, bias, g, rows, cols);
  else
    bias_gelu_grad(x, bias, g, rows, cols);
}

namespace {

// The GeLU steps' block of rows k0 .. k0 + rows - 1 of k (the rule of bf16_pack_at_rows and
// bf16_pack_b_rows: k0 a multiple of 32, 32 rows unless the block ends at k).
void check_gelu_block(const char* op, int64_t k0, int64_t rows, int64_t k, int64_t cols) {
  PARM_CHECK(k0 >= 0 && k0 % kTileK == 0 && rows >= 0 && rows <= kTileK && k0 + rows <= k &&
                 cols >= 0,
             "{}: rows {} .. {} of k = {} ({} columns); the block must start at a multiple of "
             "{} and hold at most {} rows",
             op, k0, k0 + rows, k, cols, kTileK, kTileK);
  PARM_CHECK(rows == kTileK || k0 + rows == k,
             "{}: a block of {} rows at k0 = {} must hold {} rows unless it ends at k = {}", op,
             rows, k0, kTileK, k);
}

}  // namespace

void bias_gelu_pack_both_bf16(float* x, const float* bias, int64_t k0, int64_t rows,
                              int64_t k, int64_t cols, uint16_t* packed_a, uint16_t* packed_at,
                              float* scratch) {
  check_gelu_block("bias_gelu_pack_both_bf16", k0, rows, k, cols);
  if (!fused_packing()) {
    const int64_t ld = std::max<int64_t>(cols, 1);
    bias_gelu_bf16(x, bias, scratch, rows, cols);
    bf16_pack_a(false, rows, cols, scratch, ld, packed_a);
    bf16_pack_at_rows(k0, rows, cols, k, scratch, ld, packed_at);
    bias_gelu_grad_bf16(x, bias, x, rows, cols);
    return;
  }
  gelu_pack_both_avx512(x, bias, k0, rows, k, cols, packed_a, packed_at,
                        reinterpret_cast<__m512i*>(scratch));
  zero_padding_rows(rows, cols, packed_a);
}

void gelu_grad_pack_both_bf16(const float* grad, const float* dact, float* dbias, int64_t k0,
                              int64_t rows, int64_t k, int64_t cols, uint16_t* packed_a,
                              uint16_t* packed_b, float* scratch) {
  check_gelu_block("gelu_grad_pack_both_bf16", k0, rows, k, cols);
  if (!fused_packing()) {
    const int64_t ld = std::max<int64_t>(cols, 1);
    for (int64_t i = 0; i < rows * cols; ++i) scratch[i] = grad[i] * dact[i];
    bias_backward(scratch, dbias, rows, cols);
    bf16_pack_a(false, rows, cols, scratch, ld, packed_a);
    bf16_pack_b_rows(k0, rows, k, cols, scratch, ld, packed_b);
    return;
  }
  grad_pack_both_avx512(grad, dact, dbias, k0, rows, k, cols, packed_a, packed_b);
}

}  // namespace parm::cpu
