// Vectorised kernels against their definitions in plain scalar code, bit for bit (this file
// is compiled with -ffp-contract=off):
// - the fp32 GeLU and SwiGLU kernels (cpu::gelu_forward ... bias_gelu_grad, swiglu_forward
//   and swiglu_backward; AVX-512 where the CPU has it, else GCC's vectorised loops), element by
//   element: kernels/math/gelu_math.h's and silu_math.h's formulas with math::exp_f32, the
//   clamps on ordered bits and the NaN patch;
// - the combine's row sums and dot products (cpu::gather_add_rows, cpu::dot_lanes).
// The activations over lengths and widths that leave every tail of a 16-lane vector, at
// offsets that misalign the rows, with every special value (NaN of either sign, +-inf, +-0,
// denormals, the clamps and the exp's limits), dx aliasing dy included.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/math/exp_math.h"
#include "kernels/math/gelu_math.h"
#include "kernels/math/silu_math.h"
#include "normal_values.h"

namespace parm::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float want_value(float x) {
  const float xc = math::clamp_f32(x, gelu::kValueClamp, kInf);
  return math::nan_if_nan(gelu::value(xc, math::exp_f32(gelu::minus_2u(xc))), x);
}

float want_grad(float x) {
  const float xc = math::clamp_f32(x, -gelu::kGradClamp, gelu::kGradClamp);
  return math::nan_if_nan(gelu::grad(xc, math::exp_f32(gelu::minus_2u(xc))), x);
}

// silu(a) and silu'(a) as swiglu.cpp computes them.
float want_silu(float a) {
  const float xc = math::clamp_f32(a, -silu::kClamp, silu::kClamp);
  const float xv = math::clamp_f32(a, -silu::kClamp, kInf);
  return math::nan_if_nan(silu::value(xv, math::exp_f32(-xc)), a);
}

float want_silu_grad(float a) {
  const float xc = math::clamp_f32(a, -silu::kClamp, silu::kClamp);
  return math::nan_if_nan(silu::grad(xc, math::exp_f32(-xc)), a);
}

// n values: N(0, 4) with every special value spread among them (with NaNs or without: which
// NaN x + bias gives when both are NaN depends on the compiler's operand order, so the bias
// holds none).
std::vector<float> inputs(int64_t n, uint64_t stream, bool nans = true) {
  std::vector<float> v = test::normal_values(n, 11, stream);
  for (float& x : v) x *= 4.0f;
  const float special[] = {std::bit_cast<float>(0x7fc00000u), std::bit_cast<float>(0xffc00000u),
                           std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xff812345u),
                           kInf, -kInf, 0.0f, -0.0f, 1e-40f, -1e-40f, gelu::kValueClamp,
                           gelu::kValueClamp - 1.0f, gelu::kGradClamp, -gelu::kGradClamp,
                           10.6f, -10.7f, 60.0f, -60.0f, 1e30f, -1e30f, silu::kClamp,
                           -silu::kClamp, 80.5f, -80.5f, 104.5f, -104.5f, 89.5f, -89.5f};
  const int64_t first = nans ? 0 : 4, count = static_cast<int64_t>(std::size(special)) - first;
  for (int64_t i = 0; i < n; i += 3) v[static_cast<size_t>(i)] = special[first + (i / 3) % count];
  return v;
}

// Bit-for-bit equality, naming the first element that differs. With `any_nan`, a NaN equals
// every NaN: a sum that meets two NaNs keeps the one its operand order picks.
void expect_bits(const float* got, const std::vector<float>& want, int64_t n, const char* what,
                 int64_t shape, bool any_nan = false) {
  for (int64_t i = 0; i < n; ++i)
    if (const float w = want[static_cast<size_t>(i)];
        std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(w) &&
        !(any_nan && got[i] != got[i] && w != w)) {
      ADD_FAILURE() << what << " (width " << shape << "): element " << i << " is " << got[i]
                    << " (bits " << std::hex << std::bit_cast<uint32_t>(got[i]) << "), want "
                    << want[static_cast<size_t>(i)] << " (bits "
                    << std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]) << ")";
      return;
    }
}

constexpr int64_t kWidths[] = {1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100, 256};
constexpr int64_t kRows = 6;
constexpr int64_t kOffset = 3;  // floats: rows start off a 64-byte line

TEST(ActivationKernels, EveryKernelGivesItsDefinitionsBits) {
  for (const int64_t cols : kWidths) {
    const int64_t n = kRows * cols;
    // Misaligned views: element 0 sits kOffset floats into each buffer.
    std::vector<float> xs(n + kOffset), bs(cols + kOffset), ds(n + kOffset);
    const std::vector<float> x0 = inputs(n, 1), b0 = inputs(cols, 2, false),
                             d0 = test::normal_values(n, 11, 3);
    std::copy(x0.begin(), x0.end(), xs.begin() + kOffset);
    std::copy(b0.begin(), b0.end(), bs.begin() + kOffset);
    std::copy(d0.begin(), d0.end(), ds.begin() + kOffset);
    const float* x = xs.data() + kOffset;
    const float* bias = bs.data() + kOffset;
    const float* dy = ds.data() + kOffset;

    std::vector<float> v(n), want_act(n), want_g(n), want_dx(n);
    std::vector<float> want_dbias(static_cast<size_t>(cols), 0.25f);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = x[i] + bias[i % cols];
      want_act[i] = want_value(v[i]);
      want_g[i] = want_grad(v[i]);
      want_dx[i] = want_grad(v[i]) * dy[i];
    }
    for (int64_t r = 0; r < kRows; ++r)  // row by row, as the kernels sum it
      for (int64_t c = 0; c < cols; ++c) want_dbias[c] += want_dx[r * cols + c];
    std::vector<float> flat_act(n), flat_dx(n);
    for (int64_t i = 0; i < n; ++i) {
      flat_act[i] = want_value(x[i]);
      flat_dx[i] = want_grad(x[i]) * dy[i];
    }

    std::vector<float> out(n + kOffset), out2(n + kOffset);
    float* o = out.data() + kOffset;
    float* o2 = out2.data() + kOffset;
    gelu_forward(x, o, n);
    expect_bits(o, flat_act, n, "gelu_forward", cols);
    std::copy(x, x + n, o);
    gelu_forward(o, o, n);  // y aliases x
    expect_bits(o, flat_act, n, "gelu_forward in place", cols);
    gelu_backward(x, dy, o, n);
    expect_bits(o, flat_dx, n, "gelu_backward", cols);
    std::copy(dy, dy + n, o);
    gelu_backward(x, o, o, n);  // dx aliases dy
    expect_bits(o, flat_dx, n, "gelu_backward in place", cols);

    bias_gelu(x, bias, o, kRows, cols);
    expect_bits(o, want_act, n, "bias_gelu", cols);
    std::copy(x, x + n, o2);
    bias_gelu_forward(o2, bias, o, kRows, cols);
    expect_bits(o2, v, n, "bias_gelu_forward's pre", cols);
    expect_bits(o, want_act, n, "bias_gelu_forward", cols);
    bias_gelu_grad(x, bias, o, kRows, cols);
    expect_bits(o, want_g, n, "bias_gelu_grad", cols);

    std::vector<float> dbias(static_cast<size_t>(cols), 0.25f);
    bias_gelu_backward(x, bias, dy, o, dbias.data(), kRows, cols);
    expect_bits(o, want_dx, n, "bias_gelu_backward", cols);
    expect_bits(dbias.data(), want_dbias, cols, "bias_gelu_backward's dbias", cols, true);
    std::fill(dbias.begin(), dbias.end(), 0.25f);
    std::copy(dy, dy + n, o);
    bias_gelu_backward(x, bias, o, o, dbias.data(), kRows, cols);  // dx aliases dact
    expect_bits(o, want_dx, n, "bias_gelu_backward in place", cols);
    expect_bits(dbias.data(), want_dbias, cols, "bias_gelu_backward in place's dbias", cols,
                true);
  }
}

TEST(ActivationKernels, SwigluGivesItsDefinitionsBits) {
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{33}, int64_t{100},
                          int64_t{1000}}) {
    // Misaligned views, as above; g and dact hold no NaN (a NaN times a NaN keeps the one its
    // operand order picks).
    std::vector<float> as(n + kOffset), gs(n + kOffset), ds(n + kOffset);
    const std::vector<float> a0 = inputs(n, 7), g0 = inputs(n, 8, false),
                             d0 = test::normal_values(n, 11, 9);
    std::copy(a0.begin(), a0.end(), as.begin() + kOffset);
    std::copy(g0.begin(), g0.end(), gs.begin() + kOffset);
    std::copy(d0.begin(), d0.end(), ds.begin() + kOffset);
    const float* a = as.data() + kOffset;
    const float* g = gs.data() + kOffset;
    const float* d = ds.data() + kOffset;
    std::vector<float> want_act(n), want_da(n), want_dg(n);
    for (int64_t i = 0; i < n; ++i) {
      want_act[i] = want_silu(a[i]) * g[i];
      want_da[i] = d[i] * g[i] * want_silu_grad(a[i]);
      want_dg[i] = d[i] * want_silu(a[i]);
    }
    std::vector<float> out(n + kOffset), out2(n + kOffset);
    float* o = out.data() + kOffset;
    float* o2 = out2.data() + kOffset;
    swiglu_forward(a, g, o, n);
    expect_bits(o, want_act, n, "swiglu_forward", n);
    std::copy(g, g + n, o);
    swiglu_forward(a, o, o, n);  // act aliases g
    expect_bits(o, want_act, n, "swiglu_forward in place", n);
    swiglu_backward(a, g, d, o, o2, n);
    expect_bits(o, want_da, n, "swiglu_backward's da", n);
    expect_bits(o2, want_dg, n, "swiglu_backward's dg", n);
    std::copy(d, d + n, o);
    swiglu_backward(a, g, o, o, o2, n);  // da aliases dact
    expect_bits(o, want_da, n, "swiglu_backward in place's da", n);
    expect_bits(o2, want_dg, n, "swiglu_backward in place's dg", n);
  }
}

// The kernels write nothing past the n elements (or rows x cols) they are given.
TEST(ActivationKernels, WritesNothingPastTheEnd) {
  for (const int64_t cols : kWidths) {
    const int64_t n = kRows * cols;
    const std::vector<float> x = inputs(n, 4), bias = inputs(cols, 5, false);
    const std::vector<float> dy = test::normal_values(n, 11, 6);
    constexpr float kGuard = 12345.0f;
    std::vector<float> out(n + 16, kGuard), dbias(static_cast<size_t>(cols) + 16, kGuard);
    std::fill(dbias.begin(), dbias.begin() + cols, 0.0f);
    gelu_forward(x.data(), out.data(), n);
    gelu_backward(x.data(), dy.data(), out.data(), n);
    bias_gelu(x.data(), bias.data(), out.data(), kRows, cols);
    bias_gelu_grad(x.data(), bias.data(), out.data(), kRows, cols);
    bias_gelu_backward(x.data(), bias.data(), dy.data(), out.data(), dbias.data(), kRows, cols);
    std::vector<float> pre = x;
    pre.resize(n + 16, kGuard);
    bias_gelu_forward(pre.data(), bias.data(), out.data(), kRows, cols);
    std::vector<float> dg(n + 16, kGuard);
    swiglu_forward(x.data(), dy.data(), out.data(), n);
    swiglu_backward(x.data(), dy.data(), dy.data(), out.data(), dg.data(), n);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(dg[n + i], kGuard) << cols;
      EXPECT_EQ(out[n + i], kGuard) << cols;
      EXPECT_EQ(pre[n + i], kGuard) << cols;
      EXPECT_EQ(dbias[cols + i], kGuard) << cols;
    }
  }
}

TEST(RowKernels, GatherAddRowsIsThePlainLoopInOrder) {
  const int64_t rows = 40;
  for (const int64_t cols : kWidths) {
    const std::vector<float> src = test::normal_values(rows * cols, 11, 20);
    const std::vector<float> scale = test::normal_values(8, 11, 21);
    const std::vector<int64_t> idx = {7, -1, 3, 39, 7, 0, -1, 12};  // repeats and skips
    for (const bool scaled : {false, true}) {
      std::vector<float> dst = test::normal_values(cols, 11, 22), want = dst;
      for (size_t i = 0; i < idx.size(); ++i) {
        if (idx[i] < 0) continue;
        for (int64_t c = 0; c < cols; ++c)
          want[c] += scaled ? scale[i] * src[idx[i] * cols + c] : src[idx[i] * cols + c];
      }
      gather_add_rows(src.data(), cols, idx.data(), scaled ? scale.data() : nullptr,
                      static_cast<int64_t>(idx.size()), dst.data());
      expect_bits(dst.data(), want, cols, scaled ? "gather_add_rows (scaled)" : "gather_add_rows",
                  cols);
    }
  }
}

TEST(RowKernels, DotLanesAddsSixteenLanesInLaneOrder) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17},
                          int64_t{100}, int64_t{512}, int64_t{1000}}) {
    const std::vector<float> a = test::normal_values(n + 1, 11, 23);
    const std::vector<float> b = test::normal_values(n + 1, 11, 24);
    float acc[16] = {};
    for (int64_t i = 0; i < n; ++i) acc[i % 16] += a[i] * b[i];
    float want = 0.0f;
    for (const float v : acc) want += v;
    EXPECT_EQ(std::bit_cast<uint32_t>(dot_lanes(a.data(), b.data(), n)),
              std::bit_cast<uint32_t>(want))
        << n;
  }
}

}  // namespace
}  // namespace parm::cpu
