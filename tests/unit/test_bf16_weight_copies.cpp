// The bookkeeping of the GPU experts' bf16 weight copies (moe/bf16_weight_copies.h): made
// again when the weights are other tensors or at another version, kept while both are the
// same, and made at every call when no version is kept.
#include <gtest/gtest.h>

#include "moe/bf16_weight_copies.h"

namespace parm::moe {
namespace {

// The forward pass's use: round when stale, then record it. Returns whether it rounded.
bool forward(Bf16WeightCopies& c, const void* w1, const void* w2) {
  if (!c.stale(w1, w2)) return false;
  c.made(w1, w2);
  return true;
}

TEST(Bf16WeightCopies, WithoutAVersionEveryForwardRounds) {
  Bf16WeightCopies c;
  float w1[4], w2[4];
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(forward(c, w1, w2)) << i;
  EXPECT_EQ(c.copies_made(), 3);
}

TEST(Bf16WeightCopies, OncePerVersion) {
  Bf16WeightCopies c;
  float w1[4], w2[4];
  c.set_version(1);
  EXPECT_TRUE(forward(c, w1, w2));   // nothing made yet
  EXPECT_FALSE(forward(c, w1, w2));  // micro-batches of one step: same weights
  EXPECT_FALSE(forward(c, w1, w2));
  c.set_version(2);                  // an optimizer step wrote them
  EXPECT_TRUE(forward(c, w1, w2));
  EXPECT_FALSE(forward(c, w1, w2));
  EXPECT_EQ(c.copies_made(), 2);
  c.set_version(Bf16WeightCopies::kUnknownVersion);  // nobody keeps count any more
  EXPECT_TRUE(forward(c, w1, w2));
  EXPECT_TRUE(forward(c, w1, w2));
}

TEST(Bf16WeightCopies, OtherTensorsOrForgottenCopiesRoundAgain) {
  Bf16WeightCopies c;
  float w1[4], w2[4], v1[4], v2[4];
  c.set_version(7);
  EXPECT_TRUE(forward(c, w1, w2));
  EXPECT_TRUE(forward(c, v1, w2));  // another W1 at the same version number
  EXPECT_TRUE(forward(c, v1, v2));  // another W2
  EXPECT_FALSE(forward(c, v1, v2));
  c.forget();
  EXPECT_TRUE(forward(c, v1, v2));
  EXPECT_EQ(c.copies_made(), 4);
}

}  // namespace
}  // namespace parm::moe
