// The per-element maths of the CUDA expert kernels (kernels/cuda/expert_math.h), compiled
// for the CPU: GeLU and its derivative against the CPU kernels (the oracle), and the
// fp32 -> bf16 rounding against known values and an independent fp64 reference.
//
// GeLU tolerances: both sides compute x / (1 + exp(-2u)) (and the derivative from the same
// s) with an exp within 2 ulp (libm's expf here, CUDA's expf on the GPU, exp_f32 in the CPU
// kernels). The argument -2u(x) is rounded in fp32, and may round differently by an ulp or
// two where one side contracts it into FMAs (the CPU kernels' AVX2 clone, nvcc); exp turns
// an argument error d into a relative error |d|, so the results may differ by about |2u|
// ulp (up to ~90 in the tails, where gelu is below 1e-28) besides a few ulp of exp and the
// division: tolerance u32 * (8 + 4 |2u|), u32 = 2^-24. The derivative
// s + 2 x s (1 - s) u' cancels near x = -0.75, so its error is relative to the size of its
// terms, not of the result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/expert_math.h"
#include "parm/rng.h"

namespace parm::cuda::expert_math {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

std::vector<float> gelu_inputs() {
  std::vector<float> x;
  for (int i = -3000; i <= 3000; ++i) x.push_back(0.01f * static_cast<float>(i));
  for (float v : {-1e30f, -1e5f,  -25.0f,  -20.5f, -20.0f, -19.9f,     -10.6f, -10.5f,
                  -9.5f,  -9.49f, 9.49f,   9.5f,   9.51f,  1e5f,       1e30f,  0.0f,
                  -0.0f,  1e-30f, -1e-30f, 1e-42f, -0.75f, -0.7517916f})
    x.push_back(v);
  return x;
}

// Relative tolerance at x (see the top of the file), with x clamped as the kernels clamp it.
double relative_tolerance(double xc) {
  const double two_u = std::fabs(2.0 * 0.7978845608028654 * (xc + 0.044715 * xc * xc * xc));
  return 0x1p-24 * (8.0 + 4.0 * two_u);
}

TEST(CudaExpertMath, GeluMatchesCpuKernel) {
  const std::vector<float> x = gelu_inputs();
  std::vector<float> want(x.size());
  cpu::gelu_forward(x.data(), want.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double tol = relative_tolerance(std::fmax(-20.0, static_cast<double>(x[i])));
    EXPECT_NEAR(gelu(x[i]), want[i], tol * std::fabs(want[i]) + 1e-37) << "x = " << x[i];
  }
}

TEST(CudaExpertMath, GeluGradMatchesCpuKernel) {
  const std::vector<float> x = gelu_inputs();
  const std::vector<float> ones(x.size(), 1.0f);
  std::vector<float> want(x.size());
  cpu::gelu_backward(x.data(), ones.data(), want.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    // Size of the two terms s and 2 x s (1 - s) u' at the clamped x, in fp64.
    const double xc = std::fmax(-9.5, std::fmin(9.5, static_cast<double>(x[i])));
    const double u = 0.7978845608028654 * (xc + 0.044715 * xc * xc * xc);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
    const double du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * xc * xc);
    const double scale = s + std::fabs(2.0 * xc * s * (1.0 - s) * du);
    EXPECT_NEAR(gelu_grad(x[i]), want[i], relative_tolerance(xc) * scale + 1e-37) << "x = " << x[i];
  }
}

TEST(CudaExpertMath, GeluSpecialValues) {
  EXPECT_TRUE(std::isnan(gelu(kNaN)));
  EXPECT_TRUE(std::isnan(gelu_grad(kNaN)));
  EXPECT_TRUE(std::isnan(gelu(-kNaN)));
  EXPECT_EQ(gelu(kInf), kInf);
  EXPECT_EQ(gelu(-kInf), 0.0f);
  EXPECT_TRUE(std::signbit(gelu(-kInf)));  // -0, as the CPU kernel
  EXPECT_FLOAT_EQ(gelu_grad(kInf), 1.0f);
  EXPECT_EQ(gelu_grad(-kInf), gelu_grad(-9.5f));
  EXPECT_EQ(gelu(0.0f), 0.0f);
  EXPECT_FLOAT_EQ(gelu_grad(0.0f), 0.5f);
  // And the CPU kernel agrees on every one of them.
  const float special[] = {kNaN, kInf, -kInf};
  float cpu_value[3], cpu_grad[3];
  const float ones[3] = {1.0f, 1.0f, 1.0f};
  cpu::gelu_forward(special, cpu_value, 3);
  cpu::gelu_backward(special, ones, cpu_grad, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::isnan(gelu(special[i])), std::isnan(cpu_value[i])) << i;
    if (!std::isnan(cpu_value[i])) {
      EXPECT_EQ(gelu(special[i]), cpu_value[i]) << i;
      EXPECT_FLOAT_EQ(gelu_grad(special[i]), cpu_grad[i]) << i;
    }
  }
}

TEST(CudaExpertMath, Bf16KnownValues) {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1.0"},
      {0xbf800000u, 0xbf80, "-1.0"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x3f808000u, 0x3f80, "1 + 2^-8: a tie, the even neighbour is below"},
      {0x3f818000u, 0x3f82, "tie with an odd lower neighbour: rounds up"},
      {0x3f808001u, 0x3f81, "just above the tie"},
      {0x3f807fffu, 0x3f80, "just below the tie"},
      {0xbf818000u, 0xbf82, "negative tie, odd: away from zero"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7f7fffffu, 0x7f80, "largest float rounds to +inf"},
      {0x7f7f7fffu, 0x7f7f, "largest bf16 stays"},
      {0x7f7f8000u, 0x7f80, "tie at the largest bf16 (odd): rounds to inf"},
      {0x00000001u, 0x0000, "smallest denormal rounds to 0"},
      {0x00008000u, 0x0000, "denormal tie, even: down"},
      {0x00018000u, 0x0002, "denormal tie, odd: up"},
      {0x00800000u, 0x0080, "smallest normal"},
      {0x40490fdbu, 0x4049, "pi"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(f32_to_bf16(from_bits(c.in)), c.out) << c.what << std::hex << " bits 0x" << c.in;
}

TEST(CudaExpertMath, Bf16NaNStaysNaN) {
  for (uint32_t bits :
       {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7f80ffffu}) {
    const uint16_t h = f32_to_bf16(from_bits(bits));
    EXPECT_EQ(h & 0x7f80, 0x7f80) << std::hex << bits;  // all-ones exponent
    EXPECT_NE(h & 0x007f, 0) << std::hex << bits;       // non-zero mantissa: NaN, not inf
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;  // sign kept
    EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
  }
}

// Round to nearest even through fp64: the two bf16 neighbours of x and the nearer one.
uint16_t bf16_reference(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncated: toward zero
  const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next away from zero (may be inf)
  const double dx = std::fabs(static_cast<double>(x));
  const double dlo = std::fabs(static_cast<double>(bf16_to_f32(lo)));
  // Above the largest bf16 the next value is inf, which rounds as if it were 2^128 (the
  // largest bf16 plus one ulp).
  const double dhi =
      (hi & 0x7fff) == 0x7f80 ? 0x1p128 : std::fabs(static_cast<double>(bf16_to_f32(hi)));
  const double below = dx - dlo, above = dhi - dx;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

TEST(CudaExpertMath, Bf16MatchesFp64RoundingOnRandomBits) {
  Rng rng(20240611, 77);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng.next_u32();
    const float x = from_bits(bits);
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(f32_to_bf16(x), bf16_reference(x)) << std::hex << "bits 0x" << bits;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
}

TEST(CudaExpertMath, Bf16RoundTripsEveryBf16) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float x = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_bf16(x), h) << std::hex << h;
  }
}

}  // namespace
}  // namespace parm::cuda::expert_math
