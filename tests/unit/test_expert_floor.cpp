// ExpertProductsFloor (moe/expert_floor.h): every expert's products (six; swiglu's nine) run on
// that expert's own operands: each output equals the product of that expert's inputs through
// the layer's GEMM (fp32) or cpu::gemm_bf16 (bf16: the same rounding and kernel as the packed
// layouts), bit for bit, for partial tiles and an empty expert.
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "moe/expert_floor.h"
#include "parm/error.h"

namespace parm::moe {
namespace {

using Floor = ExpertProductsFloor;

std::vector<float> input(int64_t e, Floor::Input which, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = Floor::input(e, which, i);
  return v;
}

TEST(ExpertProductsFloor, EveryExpertRunsOnItsOwnOperands) {
  const std::vector<int64_t> rows = {17, 0, 33, 5};
  const int64_t M = 40, hl = 72;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    Floor floor(rows, M, hl, p);
    floor.run();
    for (int64_t e = 0; e < static_cast<int64_t>(rows.size()); ++e) {
      const int64_t n = rows[static_cast<size_t>(e)];
      if (n == 0) continue;
      const auto x = input(e, Floor::kX, n * M), w1 = input(e, Floor::kW1, M * hl);
      const auto act = input(e, Floor::kAct, n * hl), w2 = input(e, Floor::kW2, hl * M);
      const auto dy = input(e, Floor::kDy, n * M), dpre = input(e, Floor::kDPre, n * hl);
      const std::pair<const float*, const float*> operands[] = {
          {x.data(), w1.data()},  {act.data(), w2.data()}, {act.data(), dy.data()},
          {dy.data(), w2.data()}, {x.data(), dpre.data()}, {dpre.data(), w1.data()}};
      for (ExpertProduct q : kExpertProducts) {
        const GemmCall g = expert_gemm(q, n, M, hl);
        const auto& [a, b] = operands[static_cast<int>(q)];
        std::vector<float> want(static_cast<size_t>(g.m * g.n), 0.0f);
        if (p == Precision::kBf16)
          cpu::gemm_bf16(g.trans_a, g.trans_b, g.m, g.n, g.k, a, b, want.data(), false);
        else
          run_expert_gemm(q, n, M, hl, a, b, want.data());
        const std::string at = std::string(precision_name(p)) + ", expert " + std::to_string(e) +
                               ", product " + std::to_string(static_cast<int>(q));
        EXPECT_EQ(0, std::memcmp(want.data(), floor.output(e, q), want.size() * sizeof(float)))
            << at;
      }
    }
  }
}

// SwiGLU's nine products (fp32 and bf16): the six of W1 and W2 and the gate projection's
// three, each on the expert's own x, W3 and dgate.
TEST(ExpertProductsFloor, SwigluRunsItsNineProducts) {
  const std::vector<int64_t> rows = {9, 0, 21};
  const int64_t M = 24, hl = 40;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
  Floor floor(rows, M, hl, p, ExpertMlp::kSwiglu);
  floor.run();
  EXPECT_EQ(expert_products(ExpertMlp::kSwiglu).size(), 9u);
  for (int64_t e = 0; e < static_cast<int64_t>(rows.size()); ++e) {
    const int64_t n = rows[static_cast<size_t>(e)];
    if (n == 0) continue;
    const auto x = input(e, Floor::kX, n * M), w1 = input(e, Floor::kW1, M * hl);
    const auto act = input(e, Floor::kAct, n * hl), w2 = input(e, Floor::kW2, hl * M);
    const auto dy = input(e, Floor::kDy, n * M), dpre = input(e, Floor::kDPre, n * hl);
    const auto w3 = input(e, Floor::kW3, M * hl), dgate = input(e, Floor::kDGate, n * hl);
    const std::pair<const float*, const float*> operands[] = {
        {x.data(), w1.data()},  {act.data(), w2.data()}, {act.data(), dy.data()},
        {dy.data(), w2.data()}, {x.data(), dpre.data()}, {dpre.data(), w1.data()},
        {x.data(), w3.data()},  {x.data(), dgate.data()}, {dgate.data(), w3.data()}};
    for (ExpertProduct q : expert_products(ExpertMlp::kSwiglu)) {
      const GemmCall g = expert_gemm(q, n, M, hl);
      const auto& [a, b] = operands[static_cast<int>(q)];
      std::vector<float> want(static_cast<size_t>(g.m * g.n), 0.0f);
      if (p == Precision::kBf16)
        cpu::gemm_bf16(g.trans_a, g.trans_b, g.m, g.n, g.k, a, b, want.data(), false);
      else
        run_expert_gemm(q, n, M, hl, a, b, want.data());
      EXPECT_EQ(0, std::memcmp(want.data(), floor.output(e, q), want.size() * sizeof(float)))
          << precision_name(p) << ", expert " << e << ", product " << static_cast<int>(q);
    }
  }
  }
  EXPECT_GT(expert_product_flops(10, M, hl, ExpertMlp::kSwiglu),
            1.49 * expert_product_flops(10, M, hl));  // 9 products of the same size for 6
}

TEST(ExpertProductsFloor, RefusesBadShapes) {
  EXPECT_THROW(Floor({}, 8, 8, Precision::kFp32), Error);
  EXPECT_THROW(Floor({4, -1}, 8, 8, Precision::kFp32), Error);
  EXPECT_THROW(Floor({4}, 8, 8, Precision::kFp32).time_us(0), Error);
}

}  // namespace
}  // namespace parm::moe
