// The sum of squares of an fp32 array in double (the global gradient norm's local part):
// element i goes to partial sum i mod 32, and the 32 partial sums are added in lane order at
// the end. AVX-512 keeps the 32 partial sums in four registers of 8 doubles; the scalar loop
// keeps them in an array. A float's square is exact in double (24 + 24 bits < 53), so each
// partial sum rounds only at its adds, in the same order on both paths: the same bits.
// One running sum (the previous form) waits ~4 cycles per element on the add before it;
// 32 independent ones let the adds overlap.
#include <immintrin.h>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/kernels.h"

namespace parm::cpu {
namespace {

constexpr int kSumLanes = 32;

// Adds x[i]^2 into part[i mod 32] for i in [begin, n) (begin a multiple of 32), then the
// partial sums in lane order.
double finish_scalar(const float* x, int64_t begin, int64_t n, double* part) {
  for (int64_t i = begin; i < n; ++i) {
    const double xi = static_cast<double>(x[i]);
    part[i % kSumLanes] += xi * xi;
  }
  double sum = 0.0;
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// Partial sums over the whole blocks of 32 into part[32]; returns the elements done.
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_* and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
PARM_AVX512 int64_t blocks_avx512(const float* x, int64_t n, double* part) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int r = 0; r < 4; ++r) {
      const __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8 * r));
      acc[r] = _mm512_add_pd(acc[r], _mm512_mul_pd(v, v));
    }
  for (int r = 0; r < 4; ++r) _mm512_storeu_pd(part + 8 * r, acc[r]);
  return i;
}
#pragma GCC diagnostic pop

}  // namespace

double sum_of_squares(const float* x, int64_t n) {
  double part[kSumLanes] = {};
  const int64_t done = detail::have_avx512f() ? blocks_avx512(x, n, part) : 0;
  return finish_scalar(x, done, n, part);
}

double sum_of_squares_reference(const float* x, int64_t n) {
  double part[kSumLanes] = {};
  return finish_scalar(x, 0, n, part);
}

}  // namespace parm::cpu
