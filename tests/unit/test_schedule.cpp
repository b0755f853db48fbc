// The schedules as data: where each schedule exists (schedule::supports, and the refusal
// that names the valid choices), the step-kind table every user reads, and what the table
// says a step moves and copies.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "parm/error.h"
#include "schedule/schedule.h"

namespace parm::schedule {
namespace {

Layout layout_of(int mp, int ep, int esp) {
  return make_layout(std::lcm(mp, ep * esp), mp, ep, esp);
}

// T, H, E divisible by every group size below: only the schedule's own rule can refuse.
MoeShape test_shape() { return MoeShape::of(24, 8, 24, 8, 2, "1.1"); }

TEST(Schedule, SupportsIsWhereTheBuilderBuilds) {
  int baseline_layouts = 0, refused = 0;
  for (int mp : {1, 2, 3, 4})
  for (int esp : {1, 2, 3, 4})
  for (int ep : {1, 2}) {
    const Layout l = layout_of(mp, ep, esp);
    for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2}) {
      bool built = true;
      try {
        build({test_shape(), l, 0, false, 2}, kind);
      } catch (const InvalidConfig&) {
        built = false;
      }
      EXPECT_EQ(supports(kind, l), built) << kind_name(kind) << " mp=" << mp << " esp=" << esp;
      if (kind == Kind::kBaseline) (built ? baseline_layouts : refused) += 1;
    }
  }
  EXPECT_GT(baseline_layouts, 0);
  EXPECT_GT(refused, 0);
}

TEST(Schedule, BaselineRefusalListsTheValidChoices) {
  try {
    build({test_shape(), layout_of(4, 1, 2), 0, false, 2}, Kind::kBaseline);
    FAIL() << "the baseline was built on mp=4 esp=2";
  } catch (const InvalidConfig& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--mp 4 --esp 2"), std::string::npos) << m;
    EXPECT_NE(m.find("valid --esp values with --mp 4: 1, 4"), std::string::npos) << m;
    EXPECT_NE(m.find("s1 or s2"), std::string::npos) << m;
  }
}

// Each kind's backward move undoes its forward move.
Move adjoint(Move m) {
  switch (m) {
    case Move::kNone: return Move::kNone;  // paired with kAllReduce below
    case Move::kCompute: return Move::kCompute;
    case Move::kKeepChunk: return Move::kAllGather;
    case Move::kAllGather: return Move::kKeepChunk;  // or kReduceScatter (a sum)
    case Move::kAllToAll: return Move::kAllToAll;
    case Move::kReduceScatter: return Move::kAllGather;
    case Move::kAllReduce: return Move::kNone;
    case Move::kFusedDispatch: return Move::kFusedCombine;
    case Move::kFusedCombine: return Move::kFusedDispatch;
  }
  return Move::kNone;
}

TEST(Schedule, StepTableHasOneRowPerKindAndAdjointMoves) {
  for (int i = 0; i < kNumStepKinds; ++i) {
    const auto k = static_cast<StepKind>(i);
    const StepKindInfo& info = step_info(k);
    EXPECT_EQ(info.kind, k);
    EXPECT_EQ(std::string(step_kind_name(k)), info.name);
    EXPECT_EQ(is_collective(k), info.forward != Move::kCompute) << info.name;
    EXPECT_EQ(info.forward == Move::kCompute, info.backward == Move::kCompute) << info.name;
    const Move want = adjoint(info.forward);
    const bool ok = info.backward == want ||
                    (info.forward == Move::kAllGather && info.backward == Move::kReduceScatter) ||
                    (info.forward == Move::kNone && info.backward == Move::kAllReduce);
    EXPECT_TRUE(ok) << info.name;
    EXPECT_EQ(step_move(k, false), info.forward);
    EXPECT_EQ(step_move(k, true), info.backward);
  }
  // The gate and the dispatch both read the token buffer: their adjoints add into it.
  EXPECT_TRUE(step_info(StepKind::kGate).accumulates_input_grad);
  EXPECT_TRUE(step_info(StepKind::kDispatch).accumulates_input_grad);
  EXPECT_FALSE(step_info(StepKind::kCombine).accumulates_input_grad);
}

const Step& step_of(const Schedule& sc, StepKind kind) {
  for (const Step& s : sc.steps)
    if (s.kind == kind) return s;
  throw Error(std::string("no ") + step_kind_name(kind) + " step");
}

double numel(const Schedule& sc, int id) {
  return static_cast<double>(shape_numel(sc.buffers[static_cast<size_t>(id)].shape));
}

// S2 (mp = 2, unfused) keeps its slots of every expert ((E, N_MP, Cs) -> (E, Cs), outer E)
// and gathers them back: both directions copy, the gathers interleave.
TEST(Schedule, LocalCopiesFollowTheMoves) {
  const Schedule s2 = build({test_shape(), layout_of(2, 1, 1), 0, false, 2}, Kind::kS2);
  const Step& slice = step_of(s2, StepKind::kSlice);
  const Step& gather = step_of(s2, StepKind::kGatherDup);
  ASSERT_GT(slice.outer, 1);
  constexpr double kF = sizeof(float);
  EXPECT_EQ(local_copy_bytes(s2, slice, false), 2 * numel(s2, slice.out) * kF);
  EXPECT_EQ(local_copy_bytes(s2, slice, true), 2 * numel(s2, slice.in) * kF);
  EXPECT_EQ(local_copy_bytes(s2, gather, false), 2 * numel(s2, gather.out) * kF);
  EXPECT_EQ(local_copy_bytes(s2, gather, true), 2 * numel(s2, gather.in) * kF);
  // S1 slices whole tokens (outer 1): its gather needs no interleave.
  const Schedule s1 = build({test_shape(), layout_of(2, 1, 1), 0, false, 2}, Kind::kS1);
  const Step& s1_slice = step_of(s1, StepKind::kSlice);
  EXPECT_EQ(s1_slice.outer, 1);
  EXPECT_EQ(local_copy_bytes(s1, s1_slice, true), 0.0);
  EXPECT_EQ(local_copy_bytes(s1, s1_slice, false), 2 * numel(s1, s1_slice.out) * kF);
  // The slice's bytes are its moves': none forward, an AllGather of its gradient backward.
  const auto parts = collective_parts(s2, slice, layout_of(2, 1, 1), true);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].op, CommOp::kAllGather);
  EXPECT_EQ(parts[0].bus_bytes, bus_bytes(CommOp::kAllGather, 2, numel(s2, slice.out) * kF));
  EXPECT_TRUE(collective_parts(s2, slice, layout_of(2, 1, 1), false).empty());
}

// Every step of every schedule can be asked what it moves: computations (some with no
// output buffer, like l_aux) move and copy nothing.
TEST(Schedule, EveryStepAnswersForItsMoves) {
  const Layout l = layout_of(2, 2, 2);
  for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
  for (bool fuse : {false, true}) {
    const Schedule sc = build({test_shape(), l, 0, fuse, 2}, kind);
    for (const Step& s : sc.steps)
      for (bool backward : {false, true}) {
        const auto parts = collective_parts(sc, s, l, backward);
        const double copies = local_copy_bytes(sc, s, backward);
        if (is_collective(s.kind)) continue;
        EXPECT_TRUE(parts.empty()) << s.label;
        EXPECT_EQ(copies, 0.0) << s.label;
      }
  }
}

// S1's two small sums over mp ride on the MP AllGathers it runs anyway: the l_aux statistics
// (the gate's output) on the output's AllGather (forward), dWg on the AllGather of dx (the
// token slice's adjoint, backward). Per pass the MP group then meets once, fused or not, and
// the sum is one more part of that step, posted beside its collective.
TEST(Schedule, S1SumsRideOnTheMpGathers) {
  for (bool fuse : {false, true})
  for (bool dropless : {false, true}) {
    const MoeShape sh = MoeShape::of(24, 8, 24, 8, 2, dropless ? "none" : "1.1");
    const Layout l = layout_of(2, 2, 2);
    const Schedule s1 = build({sh, l, 0, fuse, 2}, Kind::kS1);
    int stats = -1;
    for (const Step& s : s1.steps)
      if (s.kind == StepKind::kGate) stats = s.out;
    int mp_calls[2] = {0, 0};
    for (const Step& s : s1.steps) {
      EXPECT_NE(s.kind, StepKind::kSumDup) << s.label;
      EXPECT_NE(s.kind, StepKind::kShareDup) << s.label;
      for (bool backward : {false, true})
        for (const CollectivePart& p : collective_parts(s1, s, l, backward))
          if (p.group == Group::kMp && !p.beside) mp_calls[backward] += 1;
    }
    EXPECT_EQ(mp_calls[0], 1);
    EXPECT_EQ(mp_calls[1], 1);
    const Step& out = s1.steps[static_cast<size_t>(s1.steps.size() - 2)];
    EXPECT_EQ(out.kind, StepKind::kGatherDup);
    EXPECT_EQ(out.joined_sum, stats);
    EXPECT_TRUE(joins_sum(out, false));
    EXPECT_FALSE(joins_sum(out, true));
    const auto fwd = collective_parts(s1, out, l, false);
    ASSERT_EQ(fwd.size(), 2u);
    EXPECT_EQ(fwd[1].op, CommOp::kAllReduce);
    EXPECT_TRUE(fwd[1].beside);
    EXPECT_DOUBLE_EQ(fwd[1].bus_bytes, bus_bytes(CommOp::kAllReduce, 2, 2.0 * 8 * sizeof(float)));
    // l_aux is formed after the sum.
    EXPECT_EQ(s1.steps.back().kind, StepKind::kAuxLoss);
    const Step& slice = s1.steps.front();
    EXPECT_EQ(slice.kind, StepKind::kSlice);
    EXPECT_EQ(slice.joined_sum, kGateWeight);
    const auto bwd = collective_parts(s1, slice, l, true);
    ASSERT_EQ(bwd.size(), 2u);
    EXPECT_TRUE(bwd[1].beside);
    EXPECT_DOUBLE_EQ(bwd[1].bus_bytes, bus_bytes(CommOp::kAllReduce, 2, 8.0 * 8 * sizeof(float)));
    EXPECT_TRUE(collective_parts(s1, slice, l, false).empty());
  }
  // N_MP = 1: nothing to sum, and the list is the other schedules' (l_aux after the gate).
  const Schedule one = build({test_shape(), layout_of(1, 2, 2), 0, false, 2}, Kind::kS1);
  for (const Step& s : one.steps) EXPECT_EQ(s.joined_sum, -1) << s.label;
  EXPECT_EQ(one.steps[1].kind, StepKind::kAuxLoss);
}

}  // namespace
}  // namespace parm::schedule
