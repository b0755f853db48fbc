// Bf16ExpertProducts' fused steps (moe/expert_products.h): bias + GeLU fused with the packing
// of act, and GeLU + bias backward fused with the packing of dpre, give bit for bit what the
// separate steps give (same GeLU, same rounding, same products), for row counts that leave
// partial 16- and 32-row blocks, a single row and an empty expert, on both bf16 kernels.
// Also bf16_pack_b_rows block by block against bf16_pack_b.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "moe/expert_products.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::moe {
namespace {

std::vector<float> normal(int64_t n, uint64_t stream, float scale = 1.0f) {
  Rng rng(4242, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

std::vector<cpu::Bf16Kernel> kernels() {
  std::vector<cpu::Bf16Kernel> out = {cpu::Bf16Kernel::kPortable};
  try {
    cpu::set_bf16_kernel(cpu::Bf16Kernel::kAmx);
    out.push_back(cpu::Bf16Kernel::kAmx);
  } catch (const InvalidConfig&) {
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  return out;
}

TEST(Bf16ExpertProducts, FusedStepsMatchTheSeparateStepsBitForBit) {
  const int64_t experts = 2, max_rows = 70, M = 40, hl = 72;
  const auto w1 = normal(experts * M * hl, 1, 0.2f), w2 = normal(experts * hl * M, 2, 0.2f);
  const auto b1 = normal(experts * hl, 3), x = normal(max_rows * M, 4);
  const auto pre = normal(max_rows * hl, 5), dy = normal(max_rows * M, 6);
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    Bf16ExpertProducts fused, separate;
    for (auto* p : {&fused, &separate}) {
      p->reserve(experts, max_rows, M, hl);
      p->pack_forward_weights(w1.data(), w2.data());
      p->pack_backward_weights(w1.data(), w2.data());
    }
    for (int64_t rows : {0, 1, 16, 17, 31, 32, 33, 64, 70}) {
      const int64_t e = rows % 2;
      const float* bias = b1.data() + e * hl;
      const std::string at = std::string(cpu::bf16_kernel_name()) + ", rows " +
                             std::to_string(rows);
      // Forward: act and out. Outputs start as sentinels: rows past `rows` stay untouched.
      std::vector<float> act_f(max_rows * hl, 7.0f), act_s = act_f;
      std::vector<float> out_f(max_rows * M, 7.0f), out_s = out_f;
      fused.bias_gelu_fc2_forward(e, rows, pre.data(), bias, act_f.data(), out_f.data());
      cpu::bias_gelu(pre.data(), bias, act_s.data(), rows, hl);
      separate.fc2_forward(e, rows, act_s.data(), out_s.data());
      EXPECT_EQ(act_f, act_s) << at;
      EXPECT_EQ(out_f, out_s) << at;
      // Backward: dpre (in place of dact), db1, dW1 (accumulated onto a start value), dx.
      std::vector<float> dact_f(max_rows * hl), dx_f(max_rows * M, 7.0f), dx_s = dx_f;
      std::vector<float> dw1_f = normal(M * hl, 8), dw1_s = dw1_f;
      std::vector<float> db1_f = normal(hl, 9), db1_s = db1_f;
      separate.fc2_backward(e, rows, act_s.data(), dy.data(), normal(hl * M, 10).data(),
                            dact_f.data());
      std::vector<float> dact_s = dact_f;
      fused.gelu_backward_fc1_backward(e, rows, x.data(), pre.data(), bias, dact_f.data(),
                                       db1_f.data(), dw1_f.data(), dx_f.data());
      cpu::bias_gelu_backward(pre.data(), bias, dact_s.data(), dact_s.data(), db1_s.data(),
                              rows, hl);
      separate.fc1_backward(e, rows, x.data(), dact_s.data(), dw1_s.data(), dx_s.data());
      EXPECT_EQ(dact_f, dact_s) << at;
      EXPECT_EQ(db1_f, db1_s) << at;
      EXPECT_EQ(dw1_f, dw1_s) << at;
      EXPECT_EQ(dx_f, dx_s) << at;
      if (rows == 0) EXPECT_EQ(dw1_f, normal(M * hl, 8)) << "an empty expert adds nothing";
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
}

// B packed in blocks of rows (k0 multiples of 32, a partial last block) equals B packed at
// once, padding included; bad blocks are refused.
TEST(Bf16PackBRows, BlocksMatchTheWholeOperand) {
  for (bool portable : {true, false}) {
    cpu::set_bf16_kernel(portable ? cpu::Bf16Kernel::kPortable : cpu::Bf16Kernel::kAuto);
    for (int64_t k : {1, 31, 32, 33, 70, 96}) {
      const int64_t n = 37;
      const auto b = normal(k * (n + 3), 11);
      const auto size = static_cast<size_t>(cpu::bf16_packed_b_size(k, n));
      std::vector<uint16_t> whole(size, 0xdead), blocks(size, 0xbeef);
      cpu::bf16_pack_b(false, k, n, b.data(), n + 3, whole.data());
      for (int64_t k0 = 0; k0 < k; k0 += 32)
        cpu::bf16_pack_b_rows(k0, std::min<int64_t>(32, k - k0), k, n, b.data() + k0 * (n + 3),
                              n + 3, blocks.data());
      EXPECT_EQ(blocks, whole) << "k = " << k << (portable ? " (portable)" : "");
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  std::vector<float> b(64 * 4);
  std::vector<uint16_t> packed(static_cast<size_t>(cpu::bf16_packed_b_size(64, 4)));
  EXPECT_THROW(cpu::bf16_pack_b_rows(16, 16, 64, 4, b.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_b_rows(0, 15, 64, 4, b.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_b_rows(32, 40, 64, 4, b.data(), 4, packed.data()), Error);
}

}  // namespace
}  // namespace parm::moe
