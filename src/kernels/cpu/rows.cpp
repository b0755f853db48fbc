// Row gather and scatter-add: the data movement of MoE dispatch and combine; the streaming
// writes of the buffers the AllToAll sends.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {

// SSE2 (every x86-64): 16-byte non-temporal stores, four to a 64-byte line, so the CPU's
// write-combining buffers send whole lines to memory without reading them first.
void copy_stream(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0)
    for (; i + 16 <= n; i += 16) {
      const __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
      const __m128 c = _mm_loadu_ps(src + i + 8), d = _mm_loadu_ps(src + i + 12);
      _mm_stream_ps(dst + i, a);
      _mm_stream_ps(dst + i + 4, b);
      _mm_stream_ps(dst + i + 8, c);
      _mm_stream_ps(dst + i + 12, d);
    }
#endif
  if (i < n) std::memcpy(dst + i, src + i, static_cast<size_t>(n - i) * sizeof(float));
}

void scale_stream(float* dst, const float* src, float w, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const __m128 ww = _mm_set1_ps(w);
    for (; i + 16 <= n; i += 16) {
      const __m128 a = _mm_mul_ps(ww, _mm_loadu_ps(src + i));
      const __m128 b = _mm_mul_ps(ww, _mm_loadu_ps(src + i + 4));
      const __m128 c = _mm_mul_ps(ww, _mm_loadu_ps(src + i + 8));
      const __m128 d = _mm_mul_ps(ww, _mm_loadu_ps(src + i + 12));
      _mm_stream_ps(dst + i, a);
      _mm_stream_ps(dst + i + 4, b);
      _mm_stream_ps(dst + i + 8, c);
      _mm_stream_ps(dst + i + 12, d);
    }
  }
#endif
  for (; i < n; ++i) dst[i] = w * src[i];
}

namespace {

int64_t stream_min_bytes_from_env() {
  const char* v = std::getenv("PARM_STREAM_MIN_BYTES");
  if (v == nullptr || *v == '\0') return kStreamMinBytes;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < 0)
    throw InvalidConfig(fmt::format(
        "PARM_STREAM_MIN_BYTES={}: valid values are byte counts >= 0 (default {}; a count "
        "larger than any buffer turns the streaming writes off)",
        v, kStreamMinBytes));
  return n;
}

}  // namespace

int64_t stream_min_bytes() {
  static const int64_t bytes = stream_min_bytes_from_env();
  return bytes;
}

void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

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
void gather_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                     int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0) continue;
    const float* s = src + idx[i] * cols;
    if (scale == nullptr) {
      for (int64_t c = 0; c < cols; ++c) dst[c] += s[c];
    } else {
      const float w = scale[i];
      for (int64_t c = 0; c < cols; ++c) dst[c] += w * s[c];
    }
  }
}

PARM_SIMD_CLONES
float dot_lanes(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = detail::kLanes;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  float sum = 0.0f;
  for (float v : acc) sum += v;
  return sum;
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
