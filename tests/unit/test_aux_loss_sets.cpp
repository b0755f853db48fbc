// The fp32 l_aux of the layer (moe_ops.h aux_loss / aux_loss_backward / gate_forward) with
// several statistics sets: the sequence-wise l_aux of docs/spec.md §7, on numbers whose
// results are exact in binary.
#include <gtest/gtest.h>

#include <vector>

#include "moe/moe_ops.h"
#include "parm/error.h"
#include "parm/tensor.h"

namespace parm::moe {
namespace {

// E = 2, two sets (sequences) of L = 4 tokens, then the z-loss sum.
// Set 0: counts (4, 0), psums (3, 1): l_aux 2 * (1 * 3/4) = 1.5.
// Set 1: counts (2, 2), psums (2, 2): l_aux 2 * (1/2 * 1/2 + 1/2 * 1/2) = 1.
const std::vector<float> kStats = {4, 0, 3, 1, 2, 2, 2, 2, 16};

TEST(AuxLossSets, MeanOverTheSetsOfEachOnesLoss) {
  EXPECT_EQ(aux_loss(kStats.data(), 2, 8, 2), 1.25f);
  EXPECT_EQ(z_loss(kStats.data(), 2, 8, 2), 2.0f);  // 16 / 8
  // One set: the first block alone over its 4 tokens, as before the sets existed.
  EXPECT_EQ(aux_loss(kStats.data(), 2, 4, 1), 1.5f);
}

TEST(AuxLossSets, GradientOfEachSetFromItsOwnCounts) {
  std::vector<float> d(kStats.size(), -1.0f);
  // dpsum_se = dl_aux * E * count_se / (S * L^2) = 8 * 2 * count / 32.
  aux_loss_backward(kStats.data(), 2, 8, 8.0f, 4.0f, d.data(), 2);
  EXPECT_EQ(d, (std::vector<float>{0, 0, 2, 0, 0, 0, 1, 1, 0.5f}));
}

// The gate writes each row's counts and probability sums into its sequence's set: rows of
// the MP group's T from `first` on (S1's slice), sequences of seq_len rows.
TEST(AuxLossSets, GateSumsEachRowIntoItsSequence) {
  const int64_t rows = 4, M = 2, E = 2;
  // Identity gate: a row's logits are its x row; ln 3 vs 0 gives p (3/4, 1/4).
  Tensor x({rows, M}), wg({M, E}), probs({rows, E});
  const float l3 = 1.0986123f;
  const float xs[] = {l3, 0, 0, l3, l3, 0, l3, 0};
  std::copy(xs, xs + 8, x.data());
  const float id[] = {1, 0, 0, 1};
  std::copy(id, id + 4, wg.data());
  GateRouting r;
  // Rows 2..5 of T = 6 in sequences of 3: rows 2 in sequence 0, rows 3..5 in sequence 1.
  std::vector<float> stats(2 * E * 2 + 1, -1.0f);
  gate_forward(x, wg, 1, 4, 4, probs, r, stats.data(), nullptr, nullptr, RouterSpec{},
               AuxRows{2, 3}, 2);
  EXPECT_EQ(stats[0], 1.0f);  // sequence 0: one row, 1st choice e0
  EXPECT_EQ(stats[1], 0.0f);
  EXPECT_NEAR(stats[2], 0.75f, 1e-6);
  EXPECT_NEAR(stats[3], 0.25f, 1e-6);
  EXPECT_EQ(stats[4], 2.0f);  // sequence 1: e1, e0, e0
  EXPECT_EQ(stats[5], 1.0f);
  EXPECT_NEAR(stats[6], 0.25f + 0.75f + 0.75f, 1e-6);
  EXPECT_NEAR(stats[7], 0.75f + 0.25f + 0.25f, 1e-6);
  // Rows beyond the sets are refused.
  const AuxRows beyond{4, 3};  // rows 4..7 reach sequence 2 of 2
  auto gate_beyond = [&] {
    gate_forward(x, wg, 1, 4, 4, probs, r, stats.data(), nullptr, nullptr, RouterSpec{}, beyond,
                 2);
  };
  EXPECT_THROW(gate_beyond(), Error);
}

}  // namespace
}  // namespace parm::moe
