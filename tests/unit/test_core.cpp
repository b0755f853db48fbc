// Tensor, RNG, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "parm/error.h"
#include "parm/rng.h"
#include "parm/tensor.h"

namespace parm {
namespace {

TEST(Tensor, OwnedIsZeroedAndAligned) {
  Tensor t({3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(t.cols(), 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t[i], 0.0f);
}

TEST(Tensor, SliceAndViewShareStorage) {
  Tensor t({4, 2});
  for (int64_t i = 0; i < 8; ++i) t[i] = static_cast<float>(i);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.at(0, 0), 2.0f);
  s.at(1, 1) = 42.0f;
  EXPECT_EQ(t.at(2, 1), 42.0f);
  Tensor c = t.clone();
  c[0] = -1.0f;
  EXPECT_EQ(t[0], 0.0f);
  Tensor v = Tensor::view(t.data(), {8});
  EXPECT_FALSE(v.owns());
  EXPECT_EQ(v[5], t[5]);
  EXPECT_THROW(t.slice_rows(3, 5), Error);
  EXPECT_THROW(t.reshaped({3, 3}), Error);
}

TEST(Tensor, CompareReportsAbsAndRel) {
  Tensor a({2}), b({2});
  a[0] = 1.0f; b[0] = 1.5f;
  a[1] = 100.0f; b[1] = 100.0f;
  const ErrorStats s = compare(a, b);
  EXPECT_DOUBLE_EQ(s.max_abs, 0.5);
  EXPECT_NEAR(s.max_rel, 0.5 / 1.5, 1e-12);
}

TEST(Rng, SameSeedAndStreamSameNumbers) {
  Rng a(7, 3), b(7, 3), c(7, 4), d(8, 3);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 100; ++i) {
    const uint32_t x = a.next_u32();
    EXPECT_EQ(x, b.next_u32());
    same_c += x == c.next_u32();
    same_d += x == d.next_u32();
  }
  EXPECT_LT(same_c, 3);
  EXPECT_LT(same_d, 3);
}

TEST(Rng, SkipJumpsToPosition) {
  Rng a(1, 1), b(1, 1);
  for (int i = 0; i < 13; ++i) a.next_u32();
  b.skip(13);
  EXPECT_EQ(a.next_u32(), b.next_u32());
}

TEST(Rng, UniformAndNormalMoments) {
  Tensor u({100000}), n({100000});
  fill_uniform(u, 5, 0, 0.0f, 1.0f);
  fill_normal(n, 5, 1, 0.0f, 1.0f);
  double su = 0, sn = 0, sn2 = 0;
  for (int64_t i = 0; i < u.numel(); ++i) {
    ASSERT_GE(u[i], 0.0f);
    ASSERT_LT(u[i], 1.0f);
    su += u[i];
    sn += n[i];
    sn2 += static_cast<double>(n[i]) * n[i];
  }
  EXPECT_NEAR(su / 1e5, 0.5, 0.01);
  EXPECT_NEAR(sn / 1e5, 0.0, 0.02);
  EXPECT_NEAR(sn2 / 1e5, 1.0, 0.02);
}

TEST(Errors, CheckMacrosPrintBothSides) {
  try {
    PARM_CHECK_EQ(2 + 2, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 vs 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PARM_CONFIG_CHECK(false, "bad {}", 1), InvalidConfig);
  EXPECT_NO_THROW(PARM_CHECK(true, "fine"));
}

}  // namespace
}  // namespace parm
