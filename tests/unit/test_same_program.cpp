// Two schedules are one program when their step lists agree in everything the executor
// reads (perfmodel/same_program.h); the sweep counts them as one choice.
#include <gtest/gtest.h>

#include "perfmodel/model.h"
#include "perfmodel/same_program.h"

namespace parm::perfmodel {
namespace {

using schedule::Kind;

schedule::Schedule built(Kind kind, int mp, int ep, int esp, bool fuse) {
  const Target t = make_target(0, mp, ep, esp, 0);
  return schedule::build({MoeShape::of(16, 8, 16, 4, 2, "1.0"), t.layout, 0, fuse, 2}, kind);
}

TEST(SameProgram, BaselineIsS2UnfusedWhereEspIsOne) {
  EXPECT_TRUE(same_program(built(Kind::kBaseline, 2, 2, 1, false),
                           built(Kind::kS2, 2, 2, 1, false)));
  // N_MP = 1: the baseline is S1's list.
  EXPECT_TRUE(same_program(built(Kind::kBaseline, 1, 2, 2, false),
                           built(Kind::kS1, 1, 2, 2, false)));
}

// N_MP = 1 with N_ESP = 1 (bench/cpu-bf16-layer's layout): no MP step is left, so all three
// schedules are one program, fused or not, and any time one takes over another is noise.
TEST(SameProgram, AllSchedulesAreOneWithoutMpAndEsp) {
  for (bool fuse : {false, true}) {
    EXPECT_TRUE(same_program(built(Kind::kBaseline, 1, 2, 1, fuse), built(Kind::kS1, 1, 2, 1, fuse)));
    EXPECT_TRUE(same_program(built(Kind::kS2, 1, 2, 1, fuse), built(Kind::kS1, 1, 2, 1, fuse)));
  }
}

TEST(SameProgram, DifferentListsAreDifferentPrograms) {
  EXPECT_FALSE(same_program(built(Kind::kBaseline, 2, 2, 1, false),
                            built(Kind::kS1, 2, 2, 1, false)));
  EXPECT_FALSE(same_program(built(Kind::kS2, 2, 2, 2, false), built(Kind::kS2, 2, 2, 2, true)));
  EXPECT_FALSE(same_program(built(Kind::kBaseline, 2, 2, 2, false),
                            built(Kind::kS2, 2, 2, 2, false)));
  // One field the executor reads is enough; a label or a buffer name is not.
  const auto a = built(Kind::kS2, 2, 2, 1, false);
  auto b = a;
  b.steps.back().label = "renamed";
  b.buffers.front().name = "renamed";
  EXPECT_TRUE(same_program(a, b));
  b.steps.back().group = b.steps.back().group == Group::kMp ? Group::kEp : Group::kMp;
  EXPECT_FALSE(same_program(a, b));
  auto c = a;
  c.buffers.back().slots += 1;
  EXPECT_FALSE(same_program(a, c));
  auto d = a;
  d.adds_b2 = !d.adds_b2;
  EXPECT_FALSE(same_program(a, d));
}

}  // namespace
}  // namespace parm::perfmodel
