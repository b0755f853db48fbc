// The experts' packed workspace under dropless routing (ExpertWorkspace with
// max_total_rows): one pool of the bound on all local experts' rows instead of the most rows
// one expert can get, per expert. The same bits as the per-expert workspace on the worst
// routing (one expert takes every row it can), the held bytes of the formula, a clear
// refusal of counts past the bound, and the bound itself on the schedules
// (schedule::dropless_local_rows, docs/dropless.md).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "shape/packed_rows.h"
#include "moe/moe_ops.h"
#include "parm/error.h"
#include "parm/rng.h"
#include "schedule/schedule.h"

namespace parm::moe {
namespace {

constexpr int64_t kE = 3, kBlocks = 4, kSlots = 8, kM = 16, kHl = 8;

Tensor normal(Shape shape, uint64_t stream, float stddev) {
  Tensor t(std::move(shape));
  fill_normal(t, 11, stream, 0.0f, stddev);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
}

struct Pass {
  Tensor out, din;
  ExpertShards dw;
};

Pass run(ExpertWorkspace& ws, const std::vector<int32_t>& fills) {
  const ExpertShards w{normal({kE, kM, kHl}, 1, 0.2f), normal({kE, kHl}, 2, 0.1f),
                       normal({kE, kHl, kM}, 3, 0.2f), normal({kE, kM}, 4, 0.1f)};
  const Shape layout = {kBlocks, kE, kSlots, kM};
  const Tensor in = normal(layout, 5, 1.0f), dout = normal(layout, 6, 1.0f);
  Pass p{Tensor(layout), Tensor(layout),
         {Tensor({kE, kM, kHl}), Tensor({kE, kHl}), Tensor({kE, kHl, kM}), Tensor({kE, kM})}};
  for (Tensor* t : {&p.dw.w1, &p.dw.b1, &p.dw.w2, &p.dw.b2}) t->zero();
  experts_forward(in, w, kBlocks, kSlots, fills.data(), true, ws, p.out);
  experts_backward(dout, w, kBlocks, kSlots, fills.data(), ws, p.dw, p.din);
  return p;
}

// Skewed: expert 0 takes every slot of every block, expert 1 some, expert 2 none; k = 2.
std::vector<int32_t> skewed_fills() {
  std::vector<int32_t> f;
  for (int64_t b = 0; b < kBlocks; ++b)
    for (int32_t n : {static_cast<int32_t>(kSlots), static_cast<int32_t>(3 + b), 0}) f.push_back(n);
  return f;
}

// k = 2 of E_loc = 3: a block routes at most 2 x slots rows to these experts.
constexpr int64_t kPackedRows = kBlocks * 2 * kSlots;

TEST(PackedWorkspace, SkewedRoutingGivesTheUnpackedBits) {
  ExpertWorkspace unpacked, packed;
  unpacked.reserve(kE, kBlocks * kSlots, kM, kHl);
  packed.reserve(kE, kBlocks * kSlots, kM, kHl, Precision::kFp32, kPackedRows);
  const auto fills = skewed_fills();
  const Pass want = run(unpacked, fills), got = run(packed, fills);
  EXPECT_TRUE(same_bits(got.out, want.out));
  EXPECT_TRUE(same_bits(got.din, want.din));
  EXPECT_TRUE(same_bits(got.dw.w1, want.dw.w1));
  EXPECT_TRUE(same_bits(got.dw.b1, want.dw.b1));
  EXPECT_TRUE(same_bits(got.dw.w2, want.dw.w2));
  EXPECT_TRUE(same_bits(got.dw.b2, want.dw.b2));
  // Experts placed back to back: expert 0's 32 rows, then expert 1's.
  EXPECT_EQ(packed.first[1], kBlocks * kSlots);
  EXPECT_EQ(packed.first[2], packed.first[1] + packed.rows[1]);
}

// The exchange layout packed too (experts_forward's `first`, shape/packed_rows.h): segment
// [b, e]'s routed rows at the prefix sum of the fills before it, the buffers holding only
// the routed rows. Each segment's rows of out and din are the (blocks, E_loc, slots)
// layout's, bit for bit, and the weight gradients equal.
TEST(PackedWorkspace, PackedExchangeLayoutGivesTheSameRows) {
  ExpertWorkspace wide_ws, packed_ws;
  wide_ws.reserve(kE, kBlocks * kSlots, kM, kHl, Precision::kFp32, kPackedRows);
  packed_ws.reserve(kE, kBlocks * kSlots, kM, kHl, Precision::kFp32, kPackedRows);
  const auto fills = skewed_fills();
  const Pass want = run(wide_ws, fills);
  // The same inputs, packed: segment i's fills[i] rows at first[i].
  std::vector<int64_t> first(fills.size());
  const int64_t rows = packed_starts(fills.data(), static_cast<int64_t>(fills.size()), first.data());
  const Shape layout = {kBlocks, kE, kSlots, kM};
  const Tensor in_wide = normal(layout, 5, 1.0f), dout_wide = normal(layout, 6, 1.0f);
  Tensor in({rows, kM}), dout({rows, kM}), out({rows, kM}), din({rows, kM});
  auto seg = [&](size_t i, int64_t slot) { return static_cast<int64_t>(i) * kSlots + slot; };
  for (size_t i = 0; i < fills.size(); ++i) {
    std::memcpy(in.data() + first[i] * kM, in_wide.data() + seg(i, 0) * kM,
                static_cast<size_t>(fills[i] * kM) * sizeof(float));
    std::memcpy(dout.data() + first[i] * kM, dout_wide.data() + seg(i, 0) * kM,
                static_cast<size_t>(fills[i] * kM) * sizeof(float));
  }
  const ExpertShards w{normal({kE, kM, kHl}, 1, 0.2f), normal({kE, kHl}, 2, 0.1f),
                       normal({kE, kHl, kM}, 3, 0.2f), normal({kE, kM}, 4, 0.1f)};
  ExpertShards dw{Tensor({kE, kM, kHl}), Tensor({kE, kHl}), Tensor({kE, kHl, kM}), Tensor({kE, kM})};
  for (Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2}) t->zero();
  experts_forward(in, w, kBlocks, kSlots, fills.data(), true, packed_ws, out, nullptr, first.data());
  experts_backward(dout, w, kBlocks, kSlots, fills.data(), packed_ws, dw, din, nullptr, first.data());
  for (size_t i = 0; i < fills.size(); ++i) {
    const size_t n = static_cast<size_t>(fills[i] * kM) * sizeof(float);
    EXPECT_EQ(std::memcmp(out.data() + first[i] * kM, want.out.data() + seg(i, 0) * kM, n), 0) << i;
    EXPECT_EQ(std::memcmp(din.data() + first[i] * kM, want.din.data() + seg(i, 0) * kM, n), 0) << i;
  }
  EXPECT_TRUE(same_bits(dw.w1, want.dw.w1));
  EXPECT_TRUE(same_bits(dw.b2, want.dw.b2));
  // A buffer one row short of the routed rows is refused before any work.
  Tensor short_in({rows - 1, kM}), short_out({rows - 1, kM});
  EXPECT_THROW(experts_forward(short_in, w, kBlocks, kSlots, fills.data(), true, packed_ws,
                               short_out, nullptr, first.data()),
               Error);
}

TEST(PackedWorkspace, HoldsTheBoundsRows) {
  ExpertWorkspace unpacked, packed;
  unpacked.reserve(kE, kBlocks * kSlots, kM, kHl);
  packed.reserve(kE, kBlocks * kSlots, kM, kHl, Precision::kFp32, kPackedRows);
  const int64_t scratch = kBlocks * kSlots * (2 * kM + kHl) * 4;  // out_rows, d_out, d_act
  EXPECT_EQ(packed.held_bytes(), kPackedRows * (kM + 2 * kHl) * 4 + scratch);
  EXPECT_EQ(unpacked.held_bytes(), kE * kBlocks * kSlots * (kM + 2 * kHl) * 4 + scratch);
}

TEST(PackedWorkspace, RefusesCountsPastTheBound) {
  ExpertWorkspace packed;
  packed.reserve(kE, kBlocks * kSlots, kM, kHl, Precision::kFp32, kPackedRows);
  std::vector<int32_t> fills(static_cast<size_t>(kBlocks * kE), static_cast<int32_t>(kSlots));
  try {  // 3 x slots per block: more than k = 2 choices per token can route
    run(packed, fills);
    FAIL() << "counts past the bound were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in all (corrupt routing counts)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace parm::moe

namespace parm::schedule {
namespace {

// bench-layer's shape: 4 ranks, mp 2 ep 2 esp 2, T 2048, E 8, k 2 (E_loc 4, 4 blocks).
TEST(PackedWorkspace, DroplessLocalRowsOnTheBenchLayout) {
  const MoeShape shape = MoeShape::of(2048, 512, 1024, 8, 2, "none");
  const Layout l = make_layout(4, 2, 2, 2);
  // S1: blocks of T / N_MP = 1024 gate tokens, each choosing k = 2 of the 4 local experts.
  EXPECT_EQ(dropless_local_rows(build({shape, l, 0, false, 2}, Kind::kS1), 2, 4), 4 * 2 * 1024);
  // S2: MP parts of Cs = 1024 rows; rounding the parts up adds at most one row per expert.
  EXPECT_EQ(dropless_local_rows(build({shape, l, 0, false, 2}, Kind::kS2), 2, 4),
            4 * (2 * 1024 + 4));
  // k >= E_loc: never more than the capacity-factor layout's E_loc x slots per block.
  EXPECT_EQ(dropless_local_rows(build({MoeShape::of(2048, 512, 1024, 8, 6, "none"), l, 0,
                                       false, 2}, Kind::kS1), 6, 4),
            4 * 4 * 1024);
}

}  // namespace
}  // namespace parm::schedule
