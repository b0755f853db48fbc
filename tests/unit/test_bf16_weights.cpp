// The dense weights packed at bf16 once per pass: cpu::bf16_pack_b_both against two
// bf16_pack_b calls, cpu::gemm_bf16_packed_b against gemm_bf16, model::Bf16WeightPacks (packs
// once per weight per invalidate(), again after it, refuses a changed shape) and the packed
// linear ops against linear_forward / linear_backward at bf16: all bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "model/bf16_weights.h"
#include "model/blocks.h"
#include "model/dense_ops.h"
#include "normal_values.h"
#include "parm/error.h"

namespace parm {
namespace {

std::vector<float> normal(int64_t n, uint64_t stream) { return test::normal_values(n, 99, stream); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Shapes with partial 16-column panels and 32-deep pair blocks on both sides.
const int64_t kShapes[][2] = {{1, 1}, {17, 5}, {32, 48}, {45, 33}, {128, 96}, {70, 130}};

TEST(Bf16Weights, PackBothEqualsPackingEachLayout) {
  for (const auto& s : kShapes) {
    const int64_t rows = s[0], cols = s[1];
    const auto w = normal(rows * cols, 1);
    std::vector<uint16_t> both(static_cast<size_t>(cpu::bf16_packed_b_size(rows, cols)), 7);
    std::vector<uint16_t> both_t(static_cast<size_t>(cpu::bf16_packed_b_size(cols, rows)), 7);
    cpu::bf16_pack_b_both(rows, cols, w.data(), both.data(), both_t.data());
    std::vector<uint16_t> one(both.size()), one_t(both_t.size());
    cpu::bf16_pack_b(false, rows, cols, w.data(), cols, one.data());
    cpu::bf16_pack_b(true, cols, rows, w.data(), cols, one_t.data());
    EXPECT_EQ(both, one) << rows << " x " << cols;
    EXPECT_EQ(both_t, one_t) << rows << " x " << cols;
  }
}

TEST(Bf16Weights, GemmWithPackedBIsGemmBf16) {
  for (const auto& s : kShapes) {
    const int64_t k = s[0], n = s[1];
    for (const int64_t m : {int64_t{1}, int64_t{19}, int64_t{64}}) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, acc = t & 2;
        const auto a = normal(m * k, 2), b = normal(k * n, 3), c0 = normal(m * n, 4);
        std::vector<uint16_t> pb(static_cast<size_t>(cpu::bf16_packed_b_size(k, n)));
        cpu::bf16_pack_b(false, k, n, b.data(), n, pb.data());
        auto want = c0, got = c0;
        cpu::gemm_bf16(ta, false, m, n, k, a.data(), b.data(), want.data(), acc);
        cpu::gemm_bf16_packed_b(ta, m, n, k, a.data(), ta ? m : k, pb.data(), got.data(), n, acc);
        EXPECT_TRUE(same_bits(want, got)) << m << " x " << n << " x " << k << " ta " << ta;
      }
    }
  }
}

TEST(Bf16Weights, PacksOncePerInvalidateAndAgainAfterIt) {
  const model::DenseOps& ops = model::dense_ops(Device::kCpu);
  model::Bf16WeightPacks packs(ops);
  ASSERT_TRUE(packs.available());
  auto w = normal(40 * 24, 5), v = normal(24 * 8, 6);
  const model::PackedWeight p1 = packs.get(w.data(), 40, 24);
  packs.get(v.data(), 24, 8);
  packs.get(w.data(), 40, 24);
  EXPECT_EQ(packs.packs_done(), 2);
  std::vector<uint16_t> want(static_cast<size_t>(cpu::bf16_packed_b_size(40, 24)));
  cpu::bf16_pack_b(false, 40, 24, w.data(), 24, want.data());
  EXPECT_EQ(0, std::memcmp(p1.w, want.data(), want.size() * sizeof(uint16_t)));
  // The weight changes (an optimizer step): the old pack stays until invalidate().
  for (float& x : w) x *= 3.0f;
  packs.get(w.data(), 40, 24);
  EXPECT_EQ(packs.packs_done(), 2);
  packs.invalidate();
  const model::PackedWeight p2 = packs.get(w.data(), 40, 24);
  EXPECT_EQ(packs.packs_done(), 3);
  cpu::bf16_pack_b(false, 40, 24, w.data(), 24, want.data());
  EXPECT_EQ(0, std::memcmp(p2.w, want.data(), want.size() * sizeof(uint16_t)));
  std::vector<uint16_t> want_t(static_cast<size_t>(cpu::bf16_packed_b_size(24, 40)));
  cpu::bf16_pack_b(true, 24, 40, w.data(), 24, want_t.data());
  EXPECT_EQ(0, std::memcmp(p2.wt, want_t.data(), want_t.size() * sizeof(uint16_t)));
  EXPECT_THROW(packs.get(w.data(), 24, 40), Error);
}

TEST(Bf16Weights, PacksOncePerKnownVersionAndAtEveryPassWithoutOne) {
  const model::DenseOps& ops = model::dense_ops(Device::kCpu);
  model::Bf16WeightPacks packs(ops);
  const auto w = normal(40 * 24, 5);
  const auto pass = [&] {
    packs.begin_pass();
    packs.get(w.data(), 40, 24);
  };
  pass();
  pass();
  EXPECT_EQ(packs.packs_done(), 2);  // no version given: every pass packs
  packs.set_version(7);
  pass();
  pass();
  pass();
  EXPECT_EQ(packs.packs_done(), 3);  // version 7: once (grad-accum passes, an evaluation)
  packs.set_version(8);
  pass();
  pass();
  EXPECT_EQ(packs.packs_done(), 4);
  packs.set_version(model::Bf16WeightPacks::kUnknownVersion);
  pass();
  pass();
  EXPECT_EQ(packs.packs_done(), 6);
}

// The packed linear ops give the bits of linear_forward / linear_backward at bf16: with only
// the weight packed (linear_*_packed), or the activation too (linear_*_packed_x: LN1's output
// packed once for Q, K and V).
void expect_packed_linear_is_linear_at_bf16(bool packed_x) {
  const model::DenseOps& ops = model::dense_ops(Device::kCpu);
  model::Bf16WeightPacks packs(ops);
  const int64_t rows = 37, in = 45, out = 70;
  const auto x = normal(rows * in, 7), w = normal(in * out, 8), b = normal(out, 9);
  const auto dy = normal(rows * out, 10), dx0 = normal(rows * in, 11);
  const model::PackedWeight pw = packs.get(w.data(), in, out);
  std::vector<uint16_t> px(static_cast<size_t>(ops.bf16_packed_a_size(rows, in)));
  std::vector<uint16_t> pxt(static_cast<size_t>(ops.bf16_packed_a_size(in, rows)));
  std::vector<uint16_t> pdy(static_cast<size_t>(ops.bf16_packed_b_size(rows, out)));
  ops.bf16_pack_a(false, rows, in, x.data(), px.data());
  ops.bf16_pack_a(true, in, rows, x.data(), pxt.data());
  std::vector<float> y1(static_cast<size_t>(rows * out)), y2(y1.size());
  model::linear_forward(x.data(), w.data(), b.data(), y1.data(), rows, in, out, Precision::kBf16);
  if (packed_x)
    model::linear_forward_packed_x(ops, px.data(), pw, b.data(), y2.data(), rows, in, out);
  else
    model::linear_forward_packed(ops, x.data(), pw, b.data(), y2.data(), rows, in, out);
  EXPECT_TRUE(same_bits(y1, y2));
  for (const bool acc : {false, true}) {
    auto dx1 = dx0, dx2 = dx0;
    std::vector<float> dw1(static_cast<size_t>(in * out), 0.5f), dw2 = dw1;
    std::vector<float> db1(static_cast<size_t>(out), 0.25f), db2 = db1;
    model::linear_backward(dy.data(), x.data(), w.data(), dx1.data(), dw1.data(), db1.data(),
                           rows, in, out, acc, Precision::kBf16);
    if (packed_x)
      model::linear_backward_packed_x(ops, dy.data(), pxt.data(), pw, pdy.data(), dx2.data(),
                                      dw2.data(), db2.data(), rows, in, out, acc);
    else
      model::linear_backward_packed(ops, dy.data(), x.data(), pw, dx2.data(), dw2.data(),
                                    db2.data(), rows, in, out, acc);
    EXPECT_TRUE(same_bits(dx1, dx2)) << "accumulate_dx " << acc;
    EXPECT_TRUE(same_bits(dw1, dw2));
    EXPECT_TRUE(same_bits(db1, db2));
  }
}

TEST(Bf16Weights, PackedLinearIsLinearAtBf16) { expect_packed_linear_is_linear_at_bf16(false); }

TEST(Bf16Weights, LinearOverAPackedActivationIsLinearAtBf16) {
  expect_packed_linear_is_linear_at_bf16(true);
}

}  // namespace
}  // namespace parm
