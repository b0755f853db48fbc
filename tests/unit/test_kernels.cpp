// CPU kernels against plain fp64 loops; backward kernels also against central finite
// differences of an fp64 copy of the forward formula.
//
// Tolerances are error bounds of the fp32 computation, written in units of u = 2^-24 (the
// fp32 unit roundoff) times the magnitude of the terms involved, with a safety factor of
// about 2. fp64 references and finite differences (h = 1e-6, error ~ h^2 + 1e-16 / h) are
// exact to far below those bounds.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::cpu {
namespace {

constexpr double kU = 0x1p-24;  // fp32 unit roundoff
constexpr uint64_t kSeed = 20240611;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> normal(int64_t n, uint64_t stream, float stddev = 1.0f) {
  Rng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = stddev * rng.normal();
  return v;
}

// Integers in [-4, 4] divided by 4: products are multiples of 1/16 and every partial sum
// below 2^20 of them is exact in fp32, so GEMM results are exact in any summation order.
std::vector<float> quarter_ints(int64_t n, uint64_t stream) {
  Rng rng(kSeed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng.next_u32() % 9) - 4) * 0.25f;
  return v;
}

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// d loss / d x[i] by central differences, in fp64.
template <class Loss>
double central_diff(const Loss& loss, std::vector<double> x, size_t i, double h = 1e-6) {
  const double x0 = x[i];
  x[i] = x0 + h;
  const double up = loss(x);
  x[i] = x0 - h;
  const double down = loss(x);
  return (up - down) / (2.0 * h);
}

// Restores the process-wide GEMM path when a test ends, pass or fail.
class GemmPathGuard {
 public:
  explicit GemmPathGuard(GemmPath path) : saved_(gemm_path()) { set_gemm_path(path); }
  ~GemmPathGuard() { set_gemm_path(saved_); }

 private:
  GemmPath saved_;
};

const char* path_name(GemmPath p) {
  return p == GemmPath::kAuto ? "auto" : p == GemmPath::kSgemm ? "sgemm" : "matmul";
}

// ---- GEMM ------------------------------------------------------------------------------

struct GemmShape {
  int64_t m, n, k;
};

// Stored operand with leading dimension ld >= width, filled from `values` (the padding
// holds a sentinel that must never be read into C).
struct Stored {
  std::vector<float> data;
  int64_t ld;
};

Stored store(int64_t rows, int64_t width, int64_t pad, const std::vector<float>& values) {
  Stored s{
      std::vector<float>(static_cast<size_t>(std::max<int64_t>(1, rows * (width + pad))), 1e30f),
      std::max<int64_t>(1, width + pad)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) s.data[r * s.ld + c] = values[r * width + c];
  return s;
}

// C (m, n) in fp64 = op(A) op(B) (+ C0 when accumulating), reading the stored layouts.
std::vector<double> gemm_ref(bool ta, bool tb, const GemmShape& s, const Stored& a, const Stored& b,
                             const std::vector<float>& c0, bool accumulate) {
  std::vector<double> c(static_cast<size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = accumulate ? c0[i * s.n + j] : 0.0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double av = ta ? a.data[p * a.ld + i] : a.data[i * a.ld + p];
        const double bv = tb ? b.data[j * b.ld + p] : b.data[p * b.ld + j];
        acc += av * bv;
      }
      c[i * s.n + j] = acc;
    }
  return c;
}

// One GEMM through the strided entry point; returns C (m, n) and checks that the padding
// columns of C kept their sentinel.
std::vector<float> run_gemm(bool ta, bool tb, const GemmShape& s, const Stored& a, const Stored& b,
                            const std::vector<float>& c0, int64_t c_pad, bool accumulate) {
  Stored c = store(s.m, s.n, c_pad, c0);
  gemm(ta, tb, s.m, s.n, s.k, a.data.data(), a.ld, b.data.data(), b.ld, c.data.data(), c.ld,
       accumulate);
  std::vector<float> out(static_cast<size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) out[i * s.n + j] = c.data[i * c.ld + j];
    for (int64_t j = s.n; j < c.ld; ++j) EXPECT_EQ(c.data[i * c.ld + j], 1e30f) << "C padding";
  }
  return out;
}

// Small quarter-integers make every product exact: all transpositions, leading dimensions
// wider than the rows, overwrite and accumulate, both oneDNN paths, and odd sizes.
TEST(Gemm, ExactOnQuarterIntegersAllCases) {
  const GemmShape shapes[] = {{1, 7, 13},     {7, 1, 13},   {13, 7, 1},   {1, 1, 1},
                              {257, 129, 65}, {64, 8, 512}, {33, 600, 17}};
  uint64_t stream = 0;
  for (GemmPath path : {GemmPath::kAuto, GemmPath::kSgemm, GemmPath::kMatmul}) {
    GemmPathGuard guard(path);
    for (const GemmShape& s : shapes)
      for (int t = 0; t < 4; ++t)
        for (int64_t pad : {0, 3}) {
          const bool ta = t & 1, tb = t & 2;
          const int64_t a_rows = ta ? s.k : s.m, a_width = ta ? s.m : s.k;
          const int64_t b_rows = tb ? s.n : s.k, b_width = tb ? s.k : s.n;
          const Stored a = store(a_rows, a_width, pad, quarter_ints(s.m * s.k, ++stream));
          const Stored b = store(b_rows, b_width, pad + 1, quarter_ints(s.k * s.n, ++stream));
          const std::vector<float> c0 = quarter_ints(s.m * s.n, ++stream);
          for (bool acc : {false, true}) {
            SCOPED_TRACE(testing::Message()
                         << path_name(path) << " ta=" << ta << " tb=" << tb << " m=" << s.m
                         << " n=" << s.n << " k=" << s.k << " pad=" << pad << " acc=" << acc);
            const std::vector<double> ref = gemm_ref(ta, tb, s, a, b, c0, acc);
            const std::vector<float> got = run_gemm(ta, tb, s, a, b, c0, pad + 2, acc);
            int64_t bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
            EXPECT_EQ(bad, 0) << "first: " << got[0] << " vs " << ref[0];
          }
        }
  }
}

// Normal data: |C - C_ref| <= gamma_k sum_p |a_ip| |b_pj| with gamma_k = k u / (1 - k u), the
// classic bound for any summation order (accumulating adds one more term and one rounding).
TEST(Gemm, NormalDataWithinRoundingBound) {
  const GemmShape s{257, 129, 65};
  uint64_t stream = 100;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const Stored a = store(ta ? s.k : s.m, ta ? s.m : s.k, 0, normal(s.m * s.k, ++stream));
    const Stored b = store(tb ? s.n : s.k, tb ? s.k : s.n, 0, normal(s.k * s.n, ++stream));
    const std::vector<float> c0 = normal(s.m * s.n, ++stream);
    Stored abs_a = a, abs_b = b;
    for (float& v : abs_a.data) v = std::fabs(v);
    for (float& v : abs_b.data) v = std::fabs(v);
    std::vector<float> abs_c0(c0.size());
    for (size_t i = 0; i < c0.size(); ++i) abs_c0[i] = std::fabs(c0[i]);
    for (bool acc : {false, true}) {
      SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " acc=" << acc);
      const std::vector<double> ref = gemm_ref(ta, tb, s, a, b, c0, acc);
      const std::vector<double> mag = gemm_ref(ta, tb, s, abs_a, abs_b, abs_c0, acc);
      const double gamma = (s.k + 1) * kU / (1.0 - (s.k + 1) * kU);
      // Contiguous entry point.
      std::vector<float> got = c0;
      gemm(ta, tb, s.m, s.n, s.k, a.data.data(), b.data.data(), got.data(), acc);
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - ref[i]), gamma * mag[i]) << "element " << i;
    }
  }
}

TEST(Gemm, ZeroSizes) {
  std::vector<float> a(64, 1.0f), b(64, 1.0f);
  for (GemmPath path : {GemmPath::kSgemm, GemmPath::kMatmul}) {
    GemmPathGuard guard(path);
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      // k == 0: an empty sum. Overwrite zeroes C (inside its rows only), accumulate keeps it.
      std::vector<float> c(3 * 5, 7.0f);
      gemm(ta, tb, 3, 4, 0, a.data(), ta ? 3 : 1, b.data(), tb ? 1 : 4, c.data(), 5, false);
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) EXPECT_EQ(c[i * 5 + j], j < 4 ? 0.0f : 7.0f);
      std::fill(c.begin(), c.end(), 7.0f);
      gemm(ta, tb, 3, 4, 0, a.data(), b.data(), c.data(), true);
      for (float v : c) EXPECT_EQ(v, 7.0f);
      gemm(ta, tb, 3, 4, 0, a.data(), b.data(), c.data(), false);
      for (int i = 0; i < 12; ++i) EXPECT_EQ(c[i], 0.0f);
      // m == 0 or n == 0: nothing to write; null pointers are fine.
      gemm(ta, tb, 0, 4, 5, nullptr, nullptr, nullptr, false);
      gemm(ta, tb, 3, 0, 5, nullptr, nullptr, nullptr, true);
    }
  }
}

TEST(Gemm, RefusesBadArguments) {
  std::vector<float> a(64), b(64), c(64);
  EXPECT_THROW(gemm(false, false, -1, 2, 2, a.data(), b.data(), c.data(), false), Error);
  // lda below the stored width k = 4.
  EXPECT_THROW(gemm(false, false, 2, 2, 4, a.data(), 3, b.data(), 2, c.data(), 2, false), Error);
  // Transposed A is stored (k, m): lda must be >= m = 5.
  EXPECT_THROW(gemm(true, false, 5, 2, 2, a.data(), 4, b.data(), 2, c.data(), 2, false), Error);
  // ldb below n, ldc below n.
  EXPECT_THROW(gemm(false, false, 2, 3, 2, a.data(), 2, b.data(), 2, c.data(), 3, false), Error);
  EXPECT_THROW(gemm(false, false, 2, 3, 2, a.data(), 2, b.data(), 3, c.data(), 2, false), Error);
  EXPECT_THROW(gemm(false, false, 2, 3, 2, nullptr, 2, b.data(), 3, c.data(), 3, false), Error);
  EXPECT_THROW(set_gemm_threads(0), Error);
}

TEST(Gemm, BackendNamesOneDnnAndVersion) {
  const std::string name = gemm_backend();
  EXPECT_NE(name.find("oneDNN "), std::string::npos) << name;
  EXPECT_NE(name.find('.'), std::string::npos) << name;
}

int64_t num_os_threads() {
  int64_t n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

// With one GEMM thread requested, oneDNN (OpenMP underneath) must not start a thread pool,
// whatever OMP_NUM_THREADS says and on both paths.
TEST(Gemm, OneThreadStartsNoThreads) {
  const int saved = gemm_threads();
  set_gemm_threads(1);
  EXPECT_EQ(gemm_threads(), 1);
  const int64_t before = num_os_threads();
  ASSERT_GT(before, 0);
  const int64_t n = 256;
  std::vector<float> a = normal(n * n, 1), b = normal(n * n, 2), c(n * n);
  for (GemmPath path : {GemmPath::kSgemm, GemmPath::kMatmul}) {
    GemmPathGuard guard(path);
    gemm(false, false, n, n, n, a.data(), b.data(), c.data(), false);
  }
  EXPECT_EQ(num_os_threads(), before);
  set_gemm_threads(saved);
}

// ---- exp used by softmax and GeLU ------------------------------------------------------

TEST(ExpF32, WithinTwoUlpAndSpecialValues) {
  double worst_ulp = 0.0;
  Rng rng(kSeed, 7);
  for (int i = 0; i < 200000; ++i) {
    const float x = -87.0f + 175.0f * rng.uniform();
    const double ref = std::exp(static_cast<double>(x));
    const float rf = static_cast<float>(ref);
    const double ulp = std::nextafter(rf, kInf) - rf;
    worst_ulp = std::max(worst_ulp, std::fabs(detail::exp_f32(x) - ref) / ulp);
  }
  EXPECT_LE(worst_ulp, 2.0);
  EXPECT_EQ(detail::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_f32(-kInf), 0.0f);
  EXPECT_EQ(detail::exp_f32(-1000.0f), 0.0f);
  EXPECT_EQ(detail::exp_f32(kInf), kInf);
  EXPECT_EQ(detail::exp_f32(89.0f), kInf);
  EXPECT_TRUE(std::isnan(detail::exp_f32(kNaN)));
  EXPECT_TRUE(std::isnan(detail::exp_f32(-kNaN)));
  // Denormal results, to denormal precision.
  EXPECT_NEAR(detail::exp_f32(-95.0f), std::exp(-95.0), 2e-45);
}

// ---- softmax ---------------------------------------------------------------------------

std::vector<double> softmax_ref(const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) sum += y[r * cols + c] = std::exp(x[r * cols + c] - mx);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] /= sum;
  }
  return y;
}

// Relative error per probability: exp (2 ulp), x - max (rounding the argument by
// |x - max| u), the row sum (cols u) and the scaling (2 u).
TEST(Softmax, ForwardMatchesFp64) {
  for (int64_t cols : {1, 2, 8, 17, 300}) {
    const int64_t rows = 9;
    std::vector<float> x = normal(rows * cols, 10 + cols, 3.0f);
    x[0] = 40.0f;  // a dominant logit; probabilities far below the max
    std::vector<float> y(x.size());
    softmax_forward(x.data(), y.data(), rows, cols);
    const std::vector<double> ref = softmax_ref(to_f64(x), rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const double mx = *std::max_element(x.begin() + r * cols, x.begin() + (r + 1) * cols);
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = r * cols + c;
        const double tol = 2.0 * (cols + 6 + (mx - x[i])) * kU * ref[i];
        ASSERT_LE(std::fabs(y[i] - ref[i]), tol) << "cols " << cols << " at " << i;
      }
    }
    // In place gives the same bits.
    std::vector<float> in_place = x;
    softmax_forward(in_place.data(), in_place.data(), rows, cols);
    EXPECT_EQ(in_place, y);
  }
}

TEST(Softmax, MaskedAndSpecialValues) {
  std::vector<float> x = {0.0f, -kInf, 1.0f, -kInf, 1000.0f, 1000.0f};
  std::vector<float> y(6);
  softmax_forward(x.data(), y.data(), 2, 3);
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[3], 0.0f);  // exp(-inf) is exactly 0
  EXPECT_NEAR(y[0], 1.0 / (1.0 + std::exp(1.0)), 4 * kU);
  EXPECT_EQ(y[4], 0.5f);  // large logits do not overflow
  EXPECT_EQ(y[5], 0.5f);
}

// dx = y (dy - <y, dy>): error <= (cols + 4) u |y| (|dy| + sum |y dy|); checked against the
// fp64 formula and against finite differences of loss = sum dy * softmax(x) in fp64.
TEST(Softmax, BackwardMatchesFormulaAndFiniteDifferences) {
  const int64_t rows = 3, cols = 7;
  const std::vector<float> x = normal(rows * cols, 21, 2.0f);
  const std::vector<float> dy = normal(rows * cols, 22);
  std::vector<float> y(x.size()), dx(x.size());
  softmax_forward(x.data(), y.data(), rows, cols);
  softmax_backward(y.data(), dy.data(), dx.data(), rows, cols);
  const std::vector<double> dy64 = to_f64(dy);
  const auto loss = [&](const std::vector<double>& xv) {
    const std::vector<double> yv = softmax_ref(xv, rows, cols);
    double l = 0.0;
    for (size_t i = 0; i < yv.size(); ++i) l += dy64[i] * yv[i];
    return l;
  };
  const std::vector<double> y_ref = softmax_ref(to_f64(x), rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0.0, abs_dot = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      dot += double(y[r * cols + c]) * dy[r * cols + c];
      abs_dot += std::fabs(double(y[r * cols + c]) * dy[r * cols + c]);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const double formula = double(y[i]) * (dy[i] - dot);
      const double scale = std::fabs(y[i]) * (std::fabs(dy[i]) + abs_dot);
      EXPECT_NEAR(dx[i], formula, 2.0 * (cols + 4) * kU * scale) << i;
      // Against the fp64 gradient: y itself also carries the forward error (cols + 8) u.
      const double fd = central_diff(loss, to_f64(x), i);
      const double fwd =
          2.0 * (cols + 8 + 10) * kU * std::fabs(y_ref[i]) * (std::fabs(dy[i]) + abs_dot);
      EXPECT_NEAR(dx[i], fd, 2.0 * (cols + 4) * kU * scale + fwd + 1e-9) << i;
    }
  }
  // dx may alias dy.
  std::vector<float> in_place = dy;
  softmax_backward(y.data(), in_place.data(), in_place.data(), rows, cols);
  EXPECT_EQ(in_place, dx);
}

// ---- cross-entropy ---------------------------------------------------------------------

// Against fp64: the loss per row log sum exp(x - max) + max - x[y], within the exponentials'
// 2 ulp plus the argument rounding (|x - max| u) relative to each term; dlogits = scale *
// (softmax - onehot) within (|x - max| + 8) u of scale * p. Vocabularies around the 16 lanes
// and the model's 256, offsets of +-1000 (x - max must not lose the row's scale), masked
// (-inf) logits; dlogits may alias logits; without dlogits the same loss.
TEST(CrossEntropy, MatchesFp64) {
  for (int64_t vocab : {1, 15, 16, 17, 256, 259, 5000}) {
    for (float offset : {0.0f, 1000.0f, -1000.0f}) {
      const int64_t n = 5;
      std::vector<float> x = normal(n * vocab, 30 + vocab, 3.0f);
      for (float& v : x) v += offset;
      if (vocab > 4) {
        x[3] = offset + 45.0f;  // a dominant logit
        x[vocab + 1] = -kInf;   // a masked one (not a target)
      }
      std::vector<int32_t> y(static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) y[r] = static_cast<int32_t>((r * 7919 + 3) % vocab);
      if (vocab > 4) y[1] = 2;
      const float scale = 0.25f;
      std::vector<float> d(x.size());
      const double loss = cross_entropy_rows(x.data(), y.data(), d.data(), n, vocab, scale);
      double want = 0.0, tol = 0.0;
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = x.data() + r * vocab;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, double(xr[c]));
        for (int64_t c = 0; c < vocab; ++c) sum += std::exp(double(xr[c]) - mx);
        const double lse = std::log(sum) + mx;
        want += lse - xr[y[r]];
        double spread = 0.0;  // the largest |x - max| with a weight above u
        for (int64_t c = 0; c < vocab; ++c) {
          const double p = std::exp(double(xr[c]) - lse);
          if (p > kU) spread = std::max(spread, mx - xr[c]);
          const double g = scale * (p - (c == y[r] ? 1.0 : 0.0));
          if (xr[c] == -kInf) {
            ASSERT_EQ(d[r * vocab + c], 0.0f);  // exp(-inf) is exactly 0
            continue;
          }
          const double gtol = 2.0 * (std::fabs(mx - xr[c]) + 8 + vocab * 1e-3) * kU * scale * p +
                              (c == y[r] ? 2.0 * kU * scale : 0.0);
          ASSERT_NEAR(d[r * vocab + c], g, gtol)
              << "vocab " << vocab << " offset " << offset << " row " << r << " col " << c;
        }
        tol += 2.0 * (spread + 8) * kU + 4e-16 * std::fabs(lse);
      }
      EXPECT_NEAR(loss, want, tol) << "vocab " << vocab << " offset " << offset;
      std::vector<float> in_place = x;
      EXPECT_EQ(cross_entropy_rows(in_place.data(), y.data(), in_place.data(), n, vocab, scale),
                loss);
      EXPECT_EQ(in_place, d);
      EXPECT_EQ(cross_entropy_rows(x.data(), y.data(), nullptr, n, vocab, scale), loss);
    }
  }
}

// ---- streaming writes --------------------------------------------------------------------

// copy_stream and scale_stream give the plain loop's bits at every alignment of dst (16-byte
// aligned: streamed; else plain) and every length around the 16-float blocks.
TEST(StreamWrites, PlainBitsAtEveryAlignmentAndLength) {
  const std::vector<float> src = normal(300, 41);
  for (int64_t off : {0, 1, 2, 3, 4, 8}) {
    for (int64_t n : {0, 1, 15, 16, 17, 31, 32, 33, 100, 256}) {
      std::vector<float> dst(320 + 16, kNaN), want(dst);
      // Offsets counted from a 64-byte boundary inside dst.
      const auto base = reinterpret_cast<uintptr_t>(dst.data());
      const int64_t head = static_cast<int64_t>(((64 - base % 64) % 64) / sizeof(float));
      float* d = dst.data() + head + off;
      copy_stream(d, src.data() + 3, n);
      stream_fence();
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(head + off + i)] = src[3 + i];
      EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), dst.size() * sizeof(float)))
          << "copy, offset " << off << ", n " << n;
      const float w = 0.37f;
      scale_stream(d, src.data() + 5, w, n);
      stream_fence();
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(head + off + i)] = w * src[5 + i];
      EXPECT_EQ(0, std::memcmp(dst.data(), want.data(), dst.size() * sizeof(float)))
          << "scale, offset " << off << ", n " << n;
    }
  }
  if (std::getenv("PARM_STREAM_MIN_BYTES") == nullptr) {
    EXPECT_FALSE(streamed(kStreamMinBytes - 1));
    EXPECT_TRUE(streamed(kStreamMinBytes));
  }
}

// ---- top-k -----------------------------------------------------------------------------

// Reference: a stable sort by value, largest first, NaN above everything.
void topk_ref(const std::vector<float>& x, int64_t rows, int64_t cols, int k,
              std::vector<int32_t>& idx) {
  idx.assign(static_cast<size_t>(rows * k), -1);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> order(static_cast<size_t>(cols));
    std::iota(order.begin(), order.end(), 0);
    const float* xr = x.data() + r * cols;
    std::stable_sort(order.begin(), order.end(), [xr](int32_t a, int32_t b) {
      if (std::isnan(xr[a]) || std::isnan(xr[b])) return std::isnan(xr[a]) && !std::isnan(xr[b]);
      return xr[a] > xr[b];
    });
    std::copy(order.begin(), order.begin() + k, idx.begin() + r * k);
  }
}

TEST(TopK, TiesGoToTheLowerIndex) {
  const std::vector<float> x = {1, 3, 3, 2, 3,   // row 0: three-way tie at the top
                                5, 5, 5, 5, 5};  // row 1: all equal
  std::vector<int32_t> idx(6);
  std::vector<float> val(6);
  topk(x.data(), 2, 5, 3, idx.data(), val.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 2, 4, 0, 1, 2}));
  EXPECT_EQ(val, (std::vector<float>{3, 3, 3, 5, 5, 5}));
}

TEST(TopK, MatchesStableSortForEveryK) {
  const int64_t rows = 6;
  // Up to 64 columns (fine-grained experts), both sides of the CPU's switch from one-pass
  // insertion to a partial sort at k = 32.
  for (int64_t cols : {1, 3, 8, 20, 40, 64}) {
    // Few distinct values: many ties; NaNs, one -inf and one +inf sprinkled in.
    std::vector<float> x = quarter_ints(rows * cols, 30 + cols);
    if (cols >= 3) {
      x[1] = kNaN;
      x[cols + 2] = -kInf;
      x[2 * cols] = kInf;
    }
    if (cols >= 20) {
      x[3 * cols + cols - 1] = kNaN;  // a NaN after every number: must still come first
      x[3 * cols + 5] = kNaN;
      for (int64_t c = 0; c < cols; ++c)  // ascending: every element enters the kept k
        x[4 * cols + c] = static_cast<float>(c) * 0.5f;
    }
    for (int k = 1; k <= cols; ++k) {
      std::vector<int32_t> idx(rows * k), ref;
      std::vector<float> val(rows * k);
      topk(x.data(), rows, cols, k, idx.data(), val.data());
      topk_ref(x, rows, cols, k, ref);
      EXPECT_EQ(idx, ref) << "cols " << cols << " k " << k;
      for (size_t i = 0; i < idx.size(); ++i) {
        const float expect = x[(i / k) * cols + idx[i]];
        EXPECT_TRUE(val[i] == expect || (std::isnan(val[i]) && std::isnan(expect)));
      }
    }
  }
}

TEST(TopK, RefusesKOutOfRange) {
  std::vector<float> x(8);
  std::vector<int32_t> idx(16);
  std::vector<float> val(16);
  EXPECT_THROW(topk(x.data(), 2, 4, 0, idx.data(), val.data()), Error);
  EXPECT_THROW(topk(x.data(), 2, 4, 5, idx.data(), val.data()), Error);
}

// ---- GeLU ------------------------------------------------------------------------------

// u(x) of the tanh form.
double gelu_u(double x) { return std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }

// fp64 GeLU through 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): the literal tanh form cancels
// where tanh(u) ~ -1 (x = -7 loses 15% even in fp64). The identity is checked below.
double gelu_ref(double x) { return x / (1.0 + std::exp(-2.0 * gelu_u(x))); }

double gelu_grad_ref(double x) {
  const double s = 1.0 / (1.0 + std::exp(-2.0 * gelu_u(x)));
  const double one_minus_s = 1.0 / (1.0 + std::exp(2.0 * gelu_u(x)));
  const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
  return s + 2.0 * x * s * one_minus_s * du;
}

// fp32 evaluates 2u with a few roundings, which exp turns into a relative error of about
// 4 |2u| u; exp adds 2 ulp and the division 2 u. Hence (4 |2u| + 6) u relative (times 2).
double gelu_rel_tol(double x) { return 2.0 * (4.0 * std::fabs(2.0 * gelu_u(x)) + 6.0) * kU; }

std::vector<float> gelu_inputs() {
  std::vector<float> x = normal(4096, 40, 3.0f);
  for (float v : {0.0f, -0.0f, 1e-20f, -1e-20f, 7.0f, -7.0f, 9.4f, -9.4f, 9.6f, -9.6f, 12.0f,
                  -12.0f, 30.0f, -30.0f, 1e20f, -1e20f})
    x.push_back(v);
  return x;
}

TEST(Gelu, Fp64ReferenceIsTheTanhForm) {
  for (double x = -5.0; x <= 5.0; x += 0.125)
    EXPECT_NEAR(gelu_ref(x), 0.5 * x * (1.0 + std::tanh(gelu_u(x))), 1e-14) << x;
}

TEST(Gelu, ForwardMatchesFp64) {
  std::vector<float> x = gelu_inputs();
  x.push_back(kInf);
  x.push_back(-kInf);
  std::vector<float> y(x.size());
  gelu_forward(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i + 2 < x.size(); ++i) {
    const double ref = gelu_ref(x[i]);
    // Below x ~ -10, exp(-2u) overflows fp32 and gelu returns -0 where the true value is a
    // denormal: an absolute error below FLT_MIN.
    const double tol = gelu_rel_tol(x[i]) * std::fabs(ref) + std::numeric_limits<float>::min();
    ASSERT_LE(std::fabs(y[i] - ref), tol) << "x = " << x[i];
  }
  EXPECT_EQ(y[x.size() - 2], kInf);
  EXPECT_EQ(y[x.size() - 1], 0.0f);
  const float nan = kNaN;
  float y_nan = 0.0f;
  gelu_forward(&nan, &y_nan, 1);
  EXPECT_TRUE(std::isnan(y_nan));
  std::vector<float> in_place = x;
  gelu_forward(in_place.data(), in_place.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(0, std::memcmp(in_place.data(), y.data(), y.size() * sizeof(float)));
}

// gelu'(x) = s + 2 x s (1 - s) u'(x): each term carries the relative error above, so the
// bound scales with the sum of the terms' magnitudes. Beyond |x| = 9.5 the kernel returns
// the gradient at +-9.5, within 2e-31 of the true one: hence the 1e-30 absolute floor.
TEST(Gelu, BackwardMatchesFp64AndFiniteDifferences) {
  const std::vector<float> x = gelu_inputs();
  const std::vector<float> dy = normal(static_cast<int64_t>(x.size()), 41);
  std::vector<float> dx(x.size());
  gelu_backward(x.data(), dy.data(), dx.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double xv = x[i];
    const double xc = std::clamp(xv, -9.5, 9.5);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * gelu_u(xc)));
    const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * xc * xc);
    const double terms = s + std::fabs(2.0 * xc * s * (1.0 - s) * du);
    const double tol = ((gelu_rel_tol(xc) + 8.0 * kU) * terms + 1e-30) * std::fabs(dy[i]);
    EXPECT_NEAR(dx[i], gelu_grad_ref(xv) * dy[i], tol) << "x = " << xv;
    if (std::fabs(xv) < 1e3) {  // finite differences need x + h != x
      const double fd = (gelu_ref(xv + 1e-6) - gelu_ref(xv - 1e-6)) / 2e-6;
      EXPECT_NEAR(dx[i], fd * dy[i], tol + 1e-9 * std::fabs(dy[i])) << "x = " << xv;
    }
  }
  const float nan = kNaN, one = 1.0f;
  float dx_nan = 0.0f;
  gelu_backward(&nan, &one, &dx_nan, 1);
  EXPECT_TRUE(std::isnan(dx_nan));
  std::vector<float> in_place = dy;
  gelu_backward(x.data(), in_place.data(), in_place.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(in_place, dx);
}

// SwiGLU's elementwise steps (the gated experts, kernels/math/silu_math.h): act = silu(a) g
// and its adjoint against fp64, over the GeLU inputs and the clamp's edges; NaN stays NaN,
// +inf gives +inf and -inf (nearly) zero; the backward in place over dact.
TEST(Swiglu, ForwardAndBackwardMatchFp64) {
  std::vector<float> a = gelu_inputs();
  for (float v : {79.0f, -79.0f, 81.0f, -81.0f, 200.0f, -200.0f}) a.push_back(v);
  const auto n = static_cast<int64_t>(a.size());
  const std::vector<float> g = normal(n, 42), dact = normal(n, 43);
  std::vector<float> act(a.size()), da(a.size()), dg(a.size());
  swiglu_forward(a.data(), g.data(), act.data(), n);
  swiglu_backward(a.data(), g.data(), dact.data(), da.data(), dg.data(), n);
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i];
    const double s = 1.0 / (1.0 + std::exp(-x));
    const double silu = x * s, dsilu = s * (1.0 + x * (1.0 - s));
    // exp_f32 within a few ulp; each product rounds once more. Beyond |x| = 80 the kernel's
    // values are within 1e-33 of the true ones.
    const double tol = 16.0 * kU;
    const double floor = 1e-32;
    ASSERT_NEAR(act[i], silu * g[i], tol * std::fabs(silu * g[i]) + floor) << "a = " << x;
    ASSERT_NEAR(dg[i], silu * dact[i], tol * std::fabs(silu * dact[i]) + floor) << "a = " << x;
    const double want_da = dact[i] * g[i] * dsilu;
    // silu' = s + x s (1 - s): the terms' magnitudes bound the rounding.
    const double terms = std::fabs(s) + std::fabs(x * s * (1.0 - s));
    ASSERT_NEAR(da[i], want_da, tol * terms * std::fabs(dact[i] * g[i]) + floor) << "a = " << x;
  }
  const float special[] = {kNaN, kInf, -kInf}, one = 1.0f;
  float out[3], d_a[3], d_g[3];
  const float ones[] = {one, one, one};
  swiglu_forward(special, ones, out, 3);
  swiglu_backward(special, ones, ones, d_a, d_g, 3);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(d_a[0]));
  EXPECT_EQ(out[1], kInf);
  EXPECT_EQ(d_a[1], 1.0f);
  EXPECT_NEAR(out[2], 0.0f, 1e-32);  // silu(-80) / ... : a value of magnitude 1e-33
  EXPECT_NEAR(d_a[2], 0.0f, 1e-30);
  std::vector<float> in_place = dact;
  swiglu_backward(a.data(), g.data(), in_place.data(), in_place.data(), dg.data(), n);
  EXPECT_EQ(in_place, da);
}

TEST(Gelu, BiasGeluIsBiasAddThenGelu) {
  const int64_t rows = 5, cols = 37;
  const std::vector<float> x = normal(rows * cols, 42, 2.0f), bias = normal(cols, 43);
  std::vector<float> pre = x, act(x.size());
  bias_gelu_forward(pre.data(), bias.data(), act.data(), rows, cols);
  std::vector<float> expect_pre = x, expect_act(x.size());
  for (int64_t i = 0; i < rows * cols; ++i) expect_pre[i] = x[i] + bias[i % cols];
  gelu_forward(expect_pre.data(), expect_act.data(), rows * cols);
  EXPECT_EQ(pre, expect_pre);
  EXPECT_EQ(act, expect_act);
}

TEST(Gelu, BiasGeluAndItsAdjointAreGeluAtXPlusBias) {
  const int64_t rows = 7, cols = 37;
  const std::vector<float> x = normal(rows * cols, 44, 3.0f), bias = normal(cols, 46);
  const std::vector<float> dact = normal(rows * cols, 45);
  std::vector<float> xb(x.size());
  for (int64_t i = 0; i < rows * cols; ++i) xb[i] = x[i] + bias[i % cols];
  std::vector<float> act(x.size()), expect_act(x.size());
  bias_gelu(x.data(), bias.data(), act.data(), rows, cols);
  gelu_forward(xb.data(), expect_act.data(), rows * cols);
  EXPECT_EQ(act, expect_act);
  std::vector<float> dx(x.size()), dbias(cols, 0.5f);  // accumulates into dbias
  bias_gelu_backward(x.data(), bias.data(), dact.data(), dx.data(), dbias.data(), rows, cols);
  std::vector<float> expect_dx(x.size()), expect_dbias(cols, 0.5f);
  gelu_backward(xb.data(), dact.data(), expect_dx.data(), rows * cols);
  bias_backward(expect_dx.data(), expect_dbias.data(), rows, cols);
  EXPECT_EQ(dx, expect_dx);
  EXPECT_EQ(dbias, expect_dbias);
  std::vector<float> in_place = dact, dbias2(cols, 0.5f);  // dx may alias dact
  bias_gelu_backward(x.data(), bias.data(), in_place.data(), in_place.data(), dbias2.data(), rows,
                     cols);
  EXPECT_EQ(in_place, expect_dx);
  EXPECT_EQ(dbias2, expect_dbias);
}

// ---- bias ------------------------------------------------------------------------------

TEST(Bias, AddAndColumnSumsAreExactOnQuarterIntegers) {
  const int64_t rows = 33, cols = 19;
  const std::vector<float> y0 = quarter_ints(rows * cols, 50), bias = quarter_ints(cols, 51);
  std::vector<float> y = y0;
  add_bias(y.data(), bias.data(), rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(y[i], y0[i] + bias[i % cols]);
  // Accumulates into dbias, which starts at 1.
  std::vector<float> dbias(cols, 1.0f);
  bias_backward(y0.data(), dbias.data(), rows, cols);
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 1.0;
    for (int64_t r = 0; r < rows; ++r) sum += y0[r * cols + c];
    EXPECT_EQ(dbias[c], sum) << c;
  }
}

// Finite differences of loss = sum dy * (x + bias) with respect to bias, in fp64; the fp32
// column sums carry at most rows u sum |dy|.
TEST(Bias, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 6, cols = 5;
  const std::vector<float> dy = normal(rows * cols, 52), x = normal(rows * cols, 53);
  std::vector<float> dbias(cols, 0.0f);
  bias_backward(dy.data(), dbias.data(), rows, cols);
  const auto loss = [&](const std::vector<double>& b) {
    double l = 0.0;
    for (int64_t i = 0; i < rows * cols; ++i) l += dy[i] * (x[i] + b[i % cols]);
    return l;
  };
  const std::vector<double> b0(cols, 0.25);
  for (int64_t c = 0; c < cols; ++c) {
    double abs_sum = 0.0;
    for (int64_t r = 0; r < rows; ++r) abs_sum += std::fabs(dy[r * cols + c]);
    EXPECT_NEAR(dbias[c], central_diff(loss, b0, c), 2.0 * rows * kU * abs_sum + 1e-8);
  }
}

// ---- LayerNorm -------------------------------------------------------------------------

void layernorm_ref(const std::vector<double>& x, const std::vector<double>& gamma,
                   const std::vector<double>& beta, int64_t rows, int64_t cols, double eps,
                   std::vector<double>& y, std::vector<double>& mean, std::vector<double>& rstd) {
  y.assign(x.size(), 0.0);
  mean.assign(rows, 0.0);
  rstd.assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < cols; ++c) mu += x[r * cols + c];
    mu /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mu) * (x[r * cols + c] - mu);
    var /= cols;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = (x[r * cols + c] - mu) * rs * gamma[c] + beta[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// The fp32 mean and variance carry about cols u relative error; through (x - mean) rstd
// that is at most (cols + 8) u (|xhat| + max|x - mean| rstd) per normalised value.
TEST(LayerNorm, ForwardMatchesFp64) {
  const int64_t rows = 7, cols = 64;
  const float eps = 1e-5f;
  std::vector<float> x = normal(rows * cols, 60, 2.0f);
  for (int64_t c = 0; c < cols; ++c) x[c] += 100.0f;  // an offset row: mean >> std
  const std::vector<float> gamma = normal(cols, 61), beta = normal(cols, 62);
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                    cols, eps);
  std::vector<double> y_ref, mean_ref, rstd_ref;
  layernorm_ref(to_f64(x), to_f64(gamma), to_f64(beta), rows, cols, eps, y_ref, mean_ref, rstd_ref);
  for (int64_t r = 0; r < rows; ++r) {
    double max_abs_x = 0.0;
    for (int64_t c = 0; c < cols; ++c)
      max_abs_x = std::max(max_abs_x, std::fabs(double(x[r * cols + c])));
    EXPECT_NEAR(mean[r], mean_ref[r], 2.0 * cols * kU * max_abs_x) << r;
    EXPECT_NEAR(rstd[r], rstd_ref[r],
                2.0 * (cols + 8) * kU * rstd_ref[r] * (1.0 + max_abs_x * rstd_ref[r]))
        << r;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const double xhat = (x[i] - mean_ref[r]) * rstd_ref[r];
      const double tol = 2.0 * (cols + 8) * kU * (std::fabs(xhat) + max_abs_x * rstd_ref[r]) *
                             std::fabs(gamma[c]) +
                         2.0 * kU * std::fabs(beta[c]);
      ASSERT_NEAR(y[i], y_ref[i], tol) << i;
    }
  }
}

// dx, dgamma, dbeta against finite differences of loss = sum dy * layernorm(x) in fp64.
// Error bound per element: rstd and xhat carry (cols + 8) u relative error from the forward
// statistics (xhat also (cols + 8) u max|xhat| absolute, from the mean); with g = dy gamma,
// dx = rstd (g - mean(g) - xhat mean(g xhat)) adds cols u on each row mean. Hence, per row,
//   |err dx_i| <= 2 (cols + 8) u rstd (|g_i| + mean|g| + (|xhat_i| + max|xhat|) mean|g xhat|),
// and for the column sums over rows, rows u + (cols + 8) u on each |dy xhat| term (times 2).
TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 6;
  const double eps = 1e-5;
  const std::vector<float> x = normal(rows * cols, 63, 1.5f), dy = normal(rows * cols, 64);
  const std::vector<float> gamma = normal(cols, 65), beta = normal(cols, 66);
  std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size());
  layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                    cols, static_cast<float>(eps));
  // dgamma and dbeta accumulate: start them at 1.
  std::vector<float> dgamma(cols, 1.0f), dbeta(cols, 1.0f);
  layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dgamma.data(), dbeta.data(), rows, cols);

  const std::vector<double> x64 = to_f64(x), g64 = to_f64(gamma), b64 = to_f64(beta);
  const auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv,
                        const std::vector<double>& bv) {
    std::vector<double> yv, m, rs;
    layernorm_ref(xv, gv, bv, rows, cols, eps, yv, m, rs);
    double l = 0.0;
    for (size_t i = 0; i < yv.size(); ++i) l += dy[i] * yv[i];
    return l;
  };
  std::vector<double> y_ref, mean_ref, rstd_ref;
  layernorm_ref(x64, g64, b64, rows, cols, eps, y_ref, mean_ref, rstd_ref);
  const double rel = 2.0 * (cols + 8) * kU;
  std::vector<double> dgamma_tol(cols, 0.0), dbeta_tol(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mean_abs_g = 0.0, mean_abs_gx = 0.0, max_abs_xhat = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const double xhat = (x64[i] - mean_ref[r]) * rstd_ref[r];
      mean_abs_g += std::fabs(dy[i] * g64[c]) / cols;
      mean_abs_gx += std::fabs(dy[i] * g64[c] * xhat) / cols;
      max_abs_xhat = std::max(max_abs_xhat, std::fabs(xhat));
    }
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const double xhat = (x64[i] - mean_ref[r]) * rstd_ref[r];
      const double tol =
          rel * rstd_ref[r] *
          (std::fabs(dy[i] * g64[c]) + mean_abs_g + (std::fabs(xhat) + max_abs_xhat) * mean_abs_gx);
      const double fd =
          central_diff([&](const std::vector<double>& xv) { return loss(xv, g64, b64); }, x64, i);
      EXPECT_NEAR(dx[i], fd, tol + 1e-9) << "dx " << i;
      dgamma_tol[c] +=
          2.0 * (rows + cols + 8) * kU * std::fabs(dy[i]) * (std::fabs(xhat) + max_abs_xhat);
      dbeta_tol[c] += 2.0 * rows * kU * std::fabs(dy[i]);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    const double fd_g =
        central_diff([&](const std::vector<double>& gv) { return loss(x64, gv, b64); }, g64, c);
    const double fd_b =
        central_diff([&](const std::vector<double>& bv) { return loss(x64, g64, bv); }, b64, c);
    // The stored value is 1 + gradient: one more rounding, of size u (1 + |gradient|).
    EXPECT_NEAR(dgamma[c], 1.0 + fd_g, dgamma_tol[c] + 2 * kU * (1 + std::fabs(fd_g)) + 1e-9)
        << "dgamma " << c;
    EXPECT_NEAR(dbeta[c], 1.0 + fd_b, dbeta_tol[c] + 2 * kU * (1 + std::fabs(fd_b)) + 1e-9)
        << "dbeta " << c;
  }
}

// ---- gather / scatter-add --------------------------------------------------------------

TEST(Rows, GatherRepeatedAndNegativeIndices) {
  const int64_t src_rows = 4, cols = 5;
  const std::vector<float> src = quarter_ints(src_rows * cols, 70);
  const std::vector<int64_t> idx = {2, -1, 2, 0, 3, -5};
  std::vector<float> dst(idx.size() * cols, 9.0f);
  gather_rows(src.data(), cols, idx.data(), static_cast<int64_t>(idx.size()), dst.data());
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(dst[i * cols + c], idx[i] < 0 ? 0.0f : src[idx[i] * cols + c]) << i;
}

TEST(Rows, ScatterAddRepeatedNegativeAndScaled) {
  const int64_t dst_rows = 3, cols = 4;
  const std::vector<int64_t> idx = {1, 0, 1, -1, 1, 2};
  const int64_t n = static_cast<int64_t>(idx.size());
  const std::vector<float> src = quarter_ints(n * cols, 71);
  const std::vector<float> dst0 = quarter_ints(dst_rows * cols, 72);
  const std::vector<float> scale = {0.5f, 2.0f, -1.0f, 8.0f, 0.25f, 1.0f};  // powers of 2
  for (bool scaled : {false, true}) {
    std::vector<float> dst = dst0;
    scatter_add_rows(src.data(), cols, idx.data(), scaled ? scale.data() : nullptr, n, dst.data());
    std::vector<double> ref(dst0.begin(), dst0.end());
    for (int64_t i = 0; i < n; ++i) {
      if (idx[i] < 0) continue;
      for (int64_t c = 0; c < cols; ++c)
        ref[idx[i] * cols + c] += (scaled ? scale[i] : 1.0) * src[i * cols + c];
    }
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(dst[i], ref[i]) << "scaled " << scaled;
  }
}

}  // namespace
}  // namespace parm::cpu
