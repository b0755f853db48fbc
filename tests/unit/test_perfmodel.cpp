// The cost model (docs/spec.md §5): volume factors and fused costs against hand-computed cases, the
// profile file (round trip, refusals), the simulator's CSV, and the automatic choice.
// Pure computation: no timing decides a result here.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/fused_plan.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "perfmodel/calibrate_layer.h"
#include "perfmodel/calibrate_rendezvous.h"
#include "perfmodel/fit.h"
#include "perfmodel/model.h"
#include "perfmodel/profile.h"
#include "perfmodel/simulate.h"

namespace parm::perfmodel {
namespace {

using schedule::Kind;
using schedule::StepKind;

// Compute is free (enormous rates, no alpha): only the collectives cost.
CommFit comm_fit(double alpha, double beta, double alpha_per_rank = 0.0) {
  CommFit f;
  f.alpha_us = alpha;
  f.alpha_per_rank_us = alpha_per_rank;
  f.beta_us_per_byte = beta;
  f.source = "test";
  return f;
}

Profile comm_only_profile(double a_intra, double b_intra, double a_inter, double b_inter,
                          double overlap = 1.0) {
  Profile p;
  for (auto& f : p.comm[0]) f = comm_fit(a_intra, b_intra);
  for (auto& f : p.comm[1]) f = comm_fit(a_inter, b_inter);
  for (auto& g : p.gemm) g = GemmFit{0.0, 1e15, 1.0, 0, "test"};
  for (auto& m : p.mem) m = MemFit{0.0, 1e15, 1.0, 0, "test"};
  p.fused.overlap = overlap;
  return p;
}

MoeShape shape_of(int64_t T, int64_t M, int64_t H, int64_t E, int k, const char* f) {
  return MoeShape::of(T, M, H, E, k, f);
}

const StepCost& step_named(const Prediction& p, const std::string& label) {
  for (const auto& s : p.steps)
    if (s.label == label) return s;
  throw Error("no step " + label + " in " + p.name());
}

Prediction predict_kind(const Profile& prof, const MoeShape& shape, const Target& t,
                        Kind kind, bool fuse,
                        int chunks = fused_plan::kDefaultChunks) {
  return predict(prof, schedule::build({shape, t.layout, 0, fuse, chunks}, kind), shape, t);
}

TEST(PerfModel, TargetLinks) {
  const Target t = make_target(0, 2, 2, 2, 2);  // 4 devices, 2 per node
  EXPECT_EQ(t.layout.world, 4);
  EXPECT_EQ(group_link(t, Group::kMp), Link::kIntra);
  EXPECT_EQ(group_link(t, Group::kEsp), Link::kIntra);
  EXPECT_EQ(group_link(t, Group::kEp), Link::kInter);
  const Target one = make_target(0, 2, 2, 2, 0);  // one node
  EXPECT_EQ(group_link(one, Group::kEp), Link::kIntra);
  // 32 devices, 4 per node: ESP = 4 inside a node, EP = 2 across nodes.
  const Target c = make_target(32, 4, 2, 4, 4);
  EXPECT_EQ(group_link(c, Group::kEsp), Link::kIntra);
  EXPECT_EQ(group_link(c, Group::kEp), Link::kInter);
  // ESP = 2, EP = 2 fit inside a node of 4.
  EXPECT_EQ(group_link(make_target(32, 2, 2, 2, 4), Group::kEp), Link::kIntra);
  EXPECT_THROW(make_target(6, 4, 1, 1, 2), InvalidConfig);
}

// T=8 M=4 E=4 k=2 f=1.0 on mp=esp=ep=2, 2 devices per node. S1: C1 = ceil(2*4/4) = 2.
TEST(PerfModel, CollectiveStepsUseBusBytes) {
  const Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const Prediction s1 = predict_kind(prof, shape, t, Kind::kS1, false);
  // dispatch (E=4, C1=2, M=4) = 128 bytes; alltoall on 2 ranks: (n-1)/n of it = 64 bus bytes,
  // over the inter-node ep link, which both ranks of a node cross at once (link share 2).
  const auto& a2a = step_named(s1, "dispatch alltoall");
  ASSERT_EQ(a2a.fwd_parts.size(), 1u);
  EXPECT_DOUBLE_EQ(a2a.fwd_parts[0].bus_bytes, 64.0);
  EXPECT_EQ(a2a.fwd_parts[0].link, Link::kInter);
  EXPECT_DOUBLE_EQ(a2a.fwd_us, 100.0 + 1e-2 * 2 * 64.0);
  EXPECT_DOUBLE_EQ(a2a.bwd_us, 100.0 + 1e-2 * 2 * 64.0);
  // esp allgather of the received (2, 2, 2, 4) = 128 bytes per rank: (n-1) * 128, intra; its
  // adjoint is a reduce_scatter of the same bus bytes.
  const auto& ag = step_named(s1, "esp allgather");
  EXPECT_DOUBLE_EQ(ag.fwd_parts[0].bus_bytes, 128.0);
  EXPECT_EQ(ag.fwd_parts[0].op, CommOp::kAllGather);
  EXPECT_EQ(ag.bwd_parts[0].op, CommOp::kReduceScatter);
  EXPECT_NEAR(ag.fwd_us, 10.0 + 1e-3 * 128.0, 1e-9);
  // The MP allgather of the (T/N, M) output: (N-1) * 16 floats; no backward communication.
  // The l_aux statistics (2E = 8 floats: 2 (n-1)/n * 32 = 32 bus bytes) are summed beside it,
  // at once: the step costs the longer of the two.
  const auto& mp = step_named(s1, "mp allgather");
  ASSERT_EQ(mp.fwd_parts.size(), 2u);
  EXPECT_DOUBLE_EQ(mp.fwd_parts[0].bus_bytes, 64.0);
  EXPECT_EQ(mp.fwd_parts[1].op, CommOp::kAllReduce);
  EXPECT_DOUBLE_EQ(mp.fwd_parts[1].bus_bytes, 32.0);
  EXPECT_NEAR(mp.fwd_us, 10.0 + 1e-3 * 64.0, 1e-9);
  EXPECT_TRUE(mp.bwd_parts.empty());
  // dWg allreduce (2 (n-1)/n * M*E*4 = 64 bus bytes) beside the backward AllGather of dx
  // ((N-1) * 16 floats = 64 bus bytes), in the backward pass only.
  const auto& dwg = step_named(s1, "mp slice tokens");
  EXPECT_TRUE(dwg.fwd_parts.empty());
  ASSERT_EQ(dwg.bwd_parts.size(), 2u);
  EXPECT_EQ(dwg.bwd_parts[0].op, CommOp::kAllGather);
  EXPECT_EQ(dwg.bwd_parts[1].op, CommOp::kAllReduce);
  EXPECT_DOUBLE_EQ(dwg.bwd_parts[1].bus_bytes, 64.0);
  EXPECT_NEAR(dwg.bwd_us, 10.0 + 1e-3 * 64.0, 1e-9);

  // Baseline: C = ceil(2*8/4) = 4; the ESP allreduce of (2, 2, 4, 4) = 256 bytes moves
  // 2 (n-1)/n * 256 = 256 bus bytes.
  const Prediction base = predict_kind(prof, shape, t, Kind::kBaseline, false);
  const auto& ar = step_named(base, "esp allreduce");
  EXPECT_DOUBLE_EQ(ar.fwd_parts[0].bus_bytes, 256.0);
  EXPECT_EQ(ar.fwd_parts[0].op, CommOp::kAllReduce);
  EXPECT_DOUBLE_EQ(ar.bwd_us, 0.0);
  EXPECT_DOUBLE_EQ(step_named(base, "esp shared input").bwd_parts[0].bus_bytes, 2.0 * 0.5 * 256);
  // One cost per schedule step, plus the executor's own row.
  EXPECT_EQ(base.steps.size(), schedule::build({shape, t.layout, 0, false, 4}, Kind::kBaseline)
                                       .steps.size() + 1);
}

// docs/spec.md §3's table: S2's MP AllGather moves (N-1) * E * Cs * M elements per rank.
TEST(PerfModel, S2GatherVolumeMatchesSpecTable) {
  const Profile prof = comm_only_profile(5.0, 2e-3, 50.0, 4e-3);
  const auto shape = shape_of(64, 8, 16, 4, 2, "1.2");
  const Target t = make_target(8, 4, 2, 4, 4);  // N = 4 in a node, EP across two nodes
  const Prediction s2 = predict_kind(prof, shape, t, Kind::kS2, false);
  const int64_t C = capacity(2, CapacityFactor::parse("1.2"), 64, 4);  // ceil(38.4) = 39
  const int64_t Cs = (C + 3) / 4;                                      // 10
  const double bus = 3.0 * 4 * Cs * 8 * 4;
  const auto& mp = step_named(s2, "mp allgather");
  EXPECT_DOUBLE_EQ(mp.fwd_parts[0].bus_bytes, bus);
  EXPECT_DOUBLE_EQ(mp.fwd_parts[0].us, 5.0 + 2e-3 * bus);
  // Its forward also pays the interleaving copy, which is free here.
  EXPECT_NEAR(mp.fwd_us, 5.0 + 2e-3 * bus, 1e-6);
}

TEST(PerfModel, FusedCostHandComputed) {
  // Two stages on different links, W = 4: max of the parts plus one piece of the cheaper.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 4, 1.0), 4 * 5.0 + 3.0);
  // No overlap: every piece one after the other.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 4, 0.0), 4 * 8.0);
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 4, 0.5), 27.5);
  // Overlap below 0: slower than serial.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 4, -1.0), 41.0);
  // Same link class, pieces of bytes only (no latency): nothing overlaps.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kIntra}, 4, 1.0), 32.0);
  // Same link class, latencies 2 and 1 within the pieces 3 and 5: the stages' messages are
  // posted together, so a step with both pays one latency (the larger, 2): steps [3],
  // [2 + 1 + 4] x 3, [5] -> 29, the parts' sum 32 less (W - 1) x min latency.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {2.0, 1.0}, {Link::kIntra, Link::kIntra}, 4, 1.0), 29.0);
  // Overlap 0 is the parts unfused in sequence, each paying its latency once:
  // (2 + 4 x 1) + (1 + 4 x 4) = 23 (not the pieces' 4 x 8 = 32); half way: 23 + 0.5 x 6.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {2.0, 1.0}, {Link::kIntra, Link::kIntra}, 4, 0.0), 23.0);
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {2.0, 1.0}, {Link::kIntra, Link::kIntra}, 4, 0.5), 26.0);
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {2.0, 1.0}, {Link::kIntra, Link::kInter}, 4, 0.0), 23.0);
  // Different links: each link's latency is its own; the step is the slower link's,
  // whatever the latencies: W max(c_a, c_b) + min(c_a, c_b) as before.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {2.0, 1.0}, {Link::kIntra, Link::kInter}, 4, 1.0), 23.0);
  // Three stages (S2's combine), W = 2: steps [2], [2 | 6], [6 | 1], [1] -> 2 + 6 + 6 + 1.
  EXPECT_DOUBLE_EQ(
      fused_us({2.0, 6.0, 1.0}, {0.0, 0.0, 0.0}, {Link::kIntra, Link::kInter, Link::kIntra}, 2, 1.0), 15.0);
  EXPECT_DOUBLE_EQ(
      fused_us({2.0, 6.0, 1.0}, {0.0, 0.0, 0.0}, {Link::kIntra, Link::kInter, Link::kIntra}, 2, 0.0), 18.0);
  // A per-piece cost is paid for every piece beyond the first.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 4, 1.0, 2.0), 23.0 + 6.0);
  // One chunk: the parts in sequence whatever the overlap.
  EXPECT_DOUBLE_EQ(fused_us({3.0, 5.0}, {0.0, 0.0}, {Link::kIntra, Link::kInter}, 1, 1.0, 2.0), 8.0);
}

TEST(PerfModel, FusedStepPricedFromItsParts) {
  const double ai = 10.0, bi = 1e-3, ae = 100.0, be = 1e-2;
  const Profile prof = comm_only_profile(ai, bi, ae, be, 1.0);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const Prediction s1f = predict_kind(prof, shape, t, Kind::kS1, true, 4);
  ASSERT_TRUE(s1f.fused);
  // The dispatch collective: ep alltoall (64 bus bytes, inter), then esp allgather (128,
  // intra), in 4 pieces.
  const auto& d = step_named(s1f, "fused dispatch (ep alltoall + esp allgather)");
  // The ep link is shared by the node's 2 ranks (link share 2).
  const double ca = ae + be * 2 * 64.0 / 4, cb = ai + bi * 128.0 / 4;
  EXPECT_NEAR(d.fwd_us, 4 * std::max(ca, cb) + std::min(ca, cb), 1e-9);
  // Backward: the combine collective (esp reduce_scatter, then ep alltoall), same volumes.
  EXPECT_NEAR(d.bwd_us, 4 * std::max(ca, cb) + std::min(ca, cb), 1e-9);
  // Unfused, the same parts cost their sum.
  const Prediction s1 = predict_kind(prof, shape, t, Kind::kS1, false);
  EXPECT_NEAR(step_named(s1, "dispatch alltoall").fwd_us + step_named(s1, "esp allgather").fwd_us,
              (ae + be * 2 * 64) + (ai + bi * 128), 1e-9);
}

TEST(PerfModel, EagerSavingHandComputed) {
  FusedFit f;
  f.eager_limit_bytes = 64.0;
  f.eager_gain = 0.25;
  // Unfused 128 bytes per peer (above 64), 4 pieces of 32 (not): a quarter of 40 us.
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 4, 40.0), 10.0);
  // Exactly the limit is eager already; pieces of exactly the limit are eager.
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 64.0, 4, 40.0), 0.0);
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 256.0, 4, 40.0), 10.0);
  // Pieces above the limit wait for the handshake too.
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 257.0, 4, 40.0), 0.0);
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 1, 40.0), 0.0);
  // A group with peers on a rank's own node takes the mixed share.
  f.eager_gain_mixed = 0.75;
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 4, 40.0, true), 30.0);
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 4, 40.0, false), 10.0);
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 257.0, 4, 40.0, true), 0.0);
  f.eager_limit_bytes = 0.0;  // not priced
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 4, 40.0), 0.0);
  EXPECT_DOUBLE_EQ(eager_saving_us(f, 128.0, 4, 40.0, true), 0.0);
}

// 2 nodes x 2 ranks, mp = 2, ep = 4 (the world: one peer on a rank's node, two on the other),
// esp = 1: S2's fused combine joins the ep alltoall and the mp allgather. The alltoall's span:
// intra share (2 - 1) / 3, link share 2 x (4 - 2) / 3, so its bytes time is
// (bi / 3 + be 4 / 3) b. With the limit between m = b / 3 and m / 4 the step saves
// eager_gain_mixed times that; eager_gain (the pure span's share) does not touch it.
TEST(PerfModel, FusedStepOnAMixedGroupTakesTheMixedShare) {
  const double ai = 10.0, bi = 1e-3, ae = 100.0, be = 1e-2;
  Profile prof = comm_only_profile(ai, bi, ae, be, 1.0);
  const auto shape = shape_of(64, 8, 8, 8, 1, "1.0");
  const Target t = make_target(0, 2, 4, 1, 2);
  const GroupSpan sp = group_span(t, Group::kEp);
  ASSERT_EQ(sp.link, Link::kInter);
  ASSERT_NEAR(sp.intra_share, 1.0 / 3.0, 1e-12);
  ASSERT_NEAR(sp.link_share, 4.0 / 3.0, 1e-12);
  const std::string label = "fused combine (esp reduce_scatter + ep alltoall + mp allgather)";
  auto combine = [&](double gain, double mixed) {
    prof.fused.eager_gain = gain;
    prof.fused.eager_gain_mixed = mixed;
    return step_named(predict_kind(prof, shape, t, Kind::kS2, true, 4), label);
  };
  double b = 0.0;
  for (const auto& p : combine(0.0, 0.0).fwd_parts)
    if (p.group == Group::kEp) b = p.bus_bytes;
  ASSERT_GT(b, 0.0);
  prof.fused.eager_limit_bytes = b / 3.0 / 2.0;
  const double none = combine(0.0, 0.0).fwd_us;
  EXPECT_NEAR(combine(0.5, 0.0).fwd_us, none, 1e-9);
  EXPECT_NEAR(combine(0.0, 0.5).fwd_us, none - 0.5 * (bi / 3.0 + be * 4.0 / 3.0) * b, 1e-9);
  EXPECT_NEAR(combine(0.9, 0.5).fwd_us, none - 0.5 * (bi / 3.0 + be * 4.0 / 3.0) * b, 1e-9);
}

// 2 nodes x 2 ranks, mp = esp = 2 (one node), ep = 2 (across): each fused step's ep alltoall
// sends its peer 64 bytes (2 ranks of a node behind one link: link share 2). With an eager
// limit of 32 its 4 pieces of 16 bytes go eagerly: the step costs eager_gain times that
// part's bytes time (beta_inter x 2 x 64) less; the intra-node part saves nothing.
// The handshake above the eager limit (model.h), by hand: inter alpha 100 us, beta 0.01 us per
// byte over a node's link, h 70 us for the alltoall, limit 1000 bytes.
TEST(PerfModel, HandshakeOnlyAboveTheEagerLimitOnAnInterNodeGroup) {
  Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  prof.collective(Link::kInter, CommOp::kAllToAll).handshake_us = 70.0;
  prof.fused.eager_limit_bytes = 1000.0;
  // The world of 2 nodes with 2 ranks each: per rank 1 peer on its node, 2 on the other
  // (intra share 1/3, link share 2 x 2/3 = 4/3); per-peer message b / 3.
  const Target t = make_target(4, 1, 4, 1, 2);
  const GroupSpan w = group_span(t, Group::kWorld);
  ASSERT_EQ(w.link, Link::kInter);
  auto expect = [&](double b, double h) {
    return 100.0 + 1e-3 * b / 3.0 + 1e-2 * 4.0 / 3.0 * b + h;
  };
  EXPECT_NEAR(collective_us(prof, CommOp::kAllToAll, w, 2999.0), expect(2999.0, 0.0), 1e-9);
  EXPECT_NEAR(collective_us(prof, CommOp::kAllToAll, w, 3000.0), expect(3000.0, 0.0), 1e-9);
  EXPECT_NEAR(collective_us(prof, CommOp::kAllToAll, w, 3003.0), expect(3003.0, 70.0), 1e-9);
  EXPECT_DOUBLE_EQ(handshake_us(prof, CommOp::kAllToAll, w, 1001.0), 70.0);
  EXPECT_DOUBLE_EQ(handshake_us(prof, CommOp::kAllToAll, w, 1000.0), 0.0);
  // Per op: the allgather has none here.
  EXPECT_DOUBLE_EQ(handshake_us(prof, CommOp::kAllGather, w, 5000.0), 0.0);
  // An intra-node group never pays it; nor does anything when the limit is not priced.
  const GroupSpan intra = group_span(make_target(4, 2, 2, 1, 2), Group::kMp);
  ASSERT_EQ(intra.link, Link::kIntra);
  EXPECT_DOUBLE_EQ(handshake_us(prof, CommOp::kAllToAll, intra, 5000.0), 0.0);
  prof.fused.eager_limit_bytes = 0.0;
  EXPECT_DOUBLE_EQ(handshake_us(prof, CommOp::kAllToAll, w, 5000.0), 0.0);
}

// A fused piece pays the handshake only where its own message is above the limit.
TEST(PerfModel, PieceCostTakesTheHandshakeOfThePiece) {
  Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  prof.collective(Link::kInter, CommOp::kAllToAll).handshake_us = 70.0;
  prof.fused.eager_limit_bytes = 1000.0;
  const GroupSpan ep = group_span(make_target(0, 1, 2, 1, 1), Group::kEp);  // 2 nodes of 1
  ASSERT_EQ(ep.link, Link::kInter);
  ASSERT_EQ(ep.size, 2);
  // 2000 bytes to the one peer: whole message above, pieces of 500 not.
  const double part = collective_us(prof, CommOp::kAllToAll, ep, 2000.0);
  const double bytes = part - 100.0 - 70.0;
  PieceCost c = piece_cost(prof, CommOp::kAllToAll, ep, 2000.0, part, 4);
  EXPECT_NEAR(c.bytes_us, bytes, 1e-9);
  EXPECT_NEAR(c.latency_us, 100.0, 1e-9);
  EXPECT_NEAR(c.piece_us, 100.0 + bytes / 4, 1e-9);
  // 8000 bytes: pieces of 2000 are above too, and each pays it.
  const double big = collective_us(prof, CommOp::kAllToAll, ep, 8000.0);
  c = piece_cost(prof, CommOp::kAllToAll, ep, 8000.0, big, 4);
  EXPECT_NEAR(c.latency_us, 170.0, 1e-9);
  EXPECT_NEAR(c.piece_us, 170.0 + (big - 170.0) / 4, 1e-9);
  // A measured part faster than its latency: no negative bytes.
  EXPECT_DOUBLE_EQ(piece_cost(prof, CommOp::kAllToAll, ep, 2000.0, 50.0, 4).bytes_us, 0.0);
  EXPECT_THROW(piece_cost(prof, CommOp::kAllToAll, ep, 2000.0, part, 0), Error);
}

TEST(PerfModel, FusedStepSavesTheRendezvousOfItsInterNodePart) {
  const double ai = 10.0, bi = 1e-3, ae = 100.0, be = 1e-2;
  Profile prof = comm_only_profile(ai, bi, ae, be, 1.0);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const double ca = ae + be * 2 * 64.0 / 4, cb = ai + bi * 128.0 / 4;
  const double pipelined = 4 * std::max(ca, cb) + std::min(ca, cb);
  auto dispatch = [&](double limit, double gain) {
    prof.fused.eager_limit_bytes = limit;
    prof.fused.eager_gain = gain;
    return step_named(predict_kind(prof, shape, t, Kind::kS1, true, 4),
                      "fused dispatch (ep alltoall + esp allgather)");
  };
  const StepCost d = dispatch(32.0, 0.5);
  EXPECT_NEAR(d.fwd_us, pipelined - 0.5 * be * 2 * 64.0, 1e-9);
  EXPECT_NEAR(d.bwd_us, pipelined - 0.5 * be * 2 * 64.0, 1e-9);
  EXPECT_NEAR(dispatch(64.0, 0.5).fwd_us, pipelined, 1e-9);  // 64 bytes are eager unfused
  EXPECT_NEAR(dispatch(8.0, 0.5).fwd_us, pipelined, 1e-9);   // pieces of 16 are not
  EXPECT_NEAR(dispatch(32.0, 0.0).fwd_us, pipelined, 1e-9);
  // Every EP peer lies on the other node: the mixed share does not apply.
  prof.fused.eager_gain_mixed = 0.9;
  EXPECT_NEAR(dispatch(32.0, 0.5).fwd_us, pipelined - 0.5 * be * 2 * 64.0, 1e-9);
  // Unfused schedules and one node (no inter-node part) are not touched.
  prof.fused.eager_limit_bytes = 32.0;
  prof.fused.eager_gain = 0.5;
  const Prediction s1 = predict_kind(prof, shape, t, Kind::kS1, false);
  EXPECT_NEAR(step_named(s1, "dispatch alltoall").fwd_us, ae + be * 2 * 64, 1e-9);
  const Target one = make_target(0, 2, 2, 2, 0);
  EXPECT_NEAR(step_named(predict_kind(prof, shape, one, Kind::kS1, true, 4),
                         "fused dispatch (ep alltoall + esp allgather)")
                  .fwd_us,
              5 * ai + bi * 192.0, 1e-9);
  // The handshake (h 70 us): the unfused alltoall of 64-byte messages above the limit pays it,
  // the fused pieces of 16 bytes below it do not; pieces above it (limit 8) pay it each.
  prof.collective(Link::kInter, CommOp::kAllToAll).handshake_us = 70.0;
  EXPECT_NEAR(step_named(predict_kind(prof, shape, t, Kind::kS1, false), "dispatch alltoall")
                  .fwd_us,
              ae + be * 2 * 64 + 70.0, 1e-9);
  EXPECT_NEAR(dispatch(32.0, 0.0).fwd_us, pipelined, 1e-9);
  EXPECT_NEAR(dispatch(8.0, 0.5).fwd_us, 4 * std::max(ca + 70.0, cb) + std::min(ca + 70.0, cb),
              1e-9);
}

// The layer's compute scale multiplies every compute step (GEMMs and memory-bound work, the
// executor's copies too) and nothing else: hand values, gate rate 1 GFLOP/s, copy 1 GB/s.
TEST(PerfModel, LayerComputeScaleMultipliesTheComputeOnly) {
  Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2, 1.0);
  prof.gemm_fit(GemmClass::kGate) = GemmFit{2.0, 1.0, 1.0, 0, "test"};
  prof.mem_fit(MemClass::kCopy) = MemFit{0.0, 1.0, 1.0, 0, "test"};
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const Prediction a = predict_kind(prof, shape, t, Kind::kS1, false);
  prof.layer_compute.scale = 3.0;
  const Prediction b = predict_kind(prof, shape, t, Kind::kS1, false);
  // S1's gate on 4 tokens: GEMM (4, E = 4, M = 4) = 128 flop at 1 GFLOP/s = 0.128 us + 2 us,
  // copies 4 (4 x 4 x 4 + 6 x 4 x 2) = 448 bytes at 1 GB/s = 0.448 us.
  EXPECT_NEAR(step_named(a, "gate").fwd_us, 2.0 + 0.128 + 0.448, 1e-9);
  EXPECT_NEAR(step_named(b, "gate").fwd_us, 3.0 * (2.0 + 0.128 + 0.448), 1e-9);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    if (a.steps[i].fwd_parts.empty() && a.steps[i].bwd_parts.empty()) {
      EXPECT_NEAR(b.steps[i].fwd_us, 3.0 * a.steps[i].fwd_us, 1e-9) << a.steps[i].label;
      EXPECT_NEAR(b.steps[i].bwd_us, 3.0 * a.steps[i].bwd_us, 1e-9) << a.steps[i].label;
    } else if (a.steps[i].label == "l_aux statistics allreduce") {  // a collective alone
      EXPECT_NEAR(b.steps[i].fwd_us, a.steps[i].fwd_us, 1e-9);
    }
  }
}

// The layer calibrate_fused_layer runs: S1's fused ep alltoall sends each peer the first
// message of at least twice the eager limit (so its 4 pieces are at most the limit).
// The rendezvous layer: M 64, H 4096 (few bytes for its compute), E = 2 N_EP, k 1, T = 1024
// rounded up to a multiple of N_MP x E.
TEST(PerfModel, RendezvousCalibrationShape) {
  const MoeShape a = rendezvous_calibration_shape(make_target(0, 2, 2, 2, 2).layout);
  EXPECT_EQ(a.tokens, 1024);
  EXPECT_EQ(a.model_dim, 64);
  EXPECT_EQ(a.hidden, 4096);
  EXPECT_EQ(a.experts, 4);
  EXPECT_EQ(a.topk, 1);
  const MoeShape b = rendezvous_calibration_shape(make_target(0, 3, 3, 1, 0).layout);
  EXPECT_EQ(b.experts, 6);
  EXPECT_EQ(b.tokens, 1026);  // 57 x 18
}

TEST(PerfModel, EagerCalibrationShapeCrossesTheLimit) {
  for (auto [mp, ep, esp, dpn] : {std::array{2, 2, 2, 2}, std::array{4, 2, 4, 4}}) {
    const Target t = make_target(0, mp, ep, esp, dpn);
    const MoeShape shape = eager_calibration_shape(t.layout, 65536.0);
    const Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2, 1.0);
    const auto message = [&](const MoeShape& sh) {
      const Prediction pred = predict_kind(prof, sh, t, Kind::kS1, true, 4);
      const auto& d = step_named(pred, "fused dispatch (ep alltoall + esp allgather)");
      for (const auto& part : d.fwd_parts)
        if (part.op == CommOp::kAllToAll) return part.bus_bytes / (ep - 1);
      return 0.0;
    };
    const double m = message(shape);
    EXPECT_GE(m, 2 * 65536.0) << "mp " << mp;
    EXPECT_EQ(step_named(predict_kind(prof, shape, t, Kind::kS1, true, 4),
                         "fused dispatch (ep alltoall + esp allgather)")
                  .fwd_parts[0]
                  .link,
              Link::kInter);
    // The smallest such T: one step of N_MP x E tokens less stays below.
    const MoeShape less =
        MoeShape::of(shape.tokens - mp * shape.experts, 256, 256, shape.experts, 1, "1");
    EXPECT_LT(message(less), 2 * 65536.0) << "mp " << mp;
  }
  EXPECT_THROW(eager_calibration_shape(make_target(0, 2, 2, 2, 2).layout, 0.0), Error);
}

// A gain is measured only where what it saves is at least a tenth of the layer's time.
TEST(PerfModel, EagerGainMeasurableOnlyAboveATenthOfTheLayer) {
  EXPECT_TRUE(eager_gain_measurable(10.0, 100.0));
  EXPECT_TRUE(eager_gain_measurable(11.3, 33.3));   // 2 x 2, 1 Gbit/s
  EXPECT_FALSE(eager_gain_measurable(9.99, 100.0));
  EXPECT_FALSE(eager_gain_measurable(1.65, 26.8));  // 2 x 2, 10 Gbit/s
  EXPECT_FALSE(eager_gain_measurable(0.0, 100.0));
  EXPECT_FALSE(eager_gain_measurable(10.0, 0.0));
}

// On one node both parts of the fused dispatch use the intra-node link: the pieces' bytes
// add up, their latencies are paid once per lock-step step (comm/fused_plan.h).
TEST(PerfModel, FusedStepOnOneLinkPaysOneLatencyPerStep) {
  const double ai = 10.0, bi = 1e-3;
  const Profile prof = comm_only_profile(ai, bi, 100.0, 1e-2, 1.0);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 0);  // one node
  const Prediction s1f = predict_kind(prof, shape, t, Kind::kS1, true, 4);
  ASSERT_TRUE(s1f.fused);
  const auto& d = step_named(s1f, "fused dispatch (ep alltoall + esp allgather)");
  // ep alltoall 64 bus bytes, esp allgather 128, W = 4: steps [ai + bi 16],
  // [ai + bi (16 + 32)] x 3, [ai + bi 32]: the parts' sum (2 ai + 192 bi) plus 3 ai.
  EXPECT_NEAR(d.fwd_us, 5 * ai + bi * 192.0, 1e-9);
  const Prediction s1 = predict_kind(prof, shape, t, Kind::kS1, false);
  EXPECT_NEAR(step_named(s1, "dispatch alltoall").fwd_us + step_named(s1, "esp allgather").fwd_us,
              2 * ai + bi * 192.0, 1e-9);
}

// Every fused step, both directions: its priced parts in the stage order of the pipeline
// the executors run (comm/fused_plan.h), each with the collective that stage records.
TEST(PerfModel, FusedStepsPricedInTheStageOrderOfTheirPipeline) {
  const Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2, 1.0);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  auto role_of = [](Group g) {
    switch (g) {
      case Group::kEp: return fused_plan::Role::kEp;
      case Group::kEsp: return fused_plan::Role::kEsp;
      default: return fused_plan::Role::kMp;
    }
  };
  int checked = 0;
  for (Kind kind : {Kind::kS1, Kind::kS2}) {
    const auto sc = schedule::build({shape, t.layout, 0, true, 4}, kind);
    const Prediction p = predict(prof, sc, shape, t);
    for (size_t i = 0; i < sc.steps.size(); ++i) {
      const schedule::Step& s = sc.steps[i];
      if (s.kind != StepKind::kFusedDispatch && s.kind != StepKind::kFusedCombine) continue;
      for (bool bwd : {false, true}) {
        SCOPED_TRACE(testing::Message() << schedule::kind_name(kind) << " " << s.label
                                        << (bwd ? " backward" : " forward"));
        const bool combine = (s.kind == StepKind::kFusedCombine) != bwd;
        const auto pipeline = !combine ? fused_plan::Pipeline::kDispatch
                              : s.has_mp_part() && !bwd ? fused_plan::Pipeline::kCombineMp
                                                        : fused_plan::Pipeline::kCombine;
        const fused_plan::Description& d = fused_plan::describe(pipeline);
        const auto& parts = bwd ? p.steps[i].bwd_parts : p.steps[i].fwd_parts;
        ASSERT_EQ(static_cast<int>(parts.size()), d.num_stages);  // every group has 2 ranks
        for (int j = 0; j < d.num_stages; ++j) {
          EXPECT_EQ(role_of(parts[static_cast<size_t>(j)].group),
                    d.stages[static_cast<size_t>(j)].group)
              << "part " << j;
          EXPECT_EQ(parts[static_cast<size_t>(j)].op, d.stages[static_cast<size_t>(j)].records)
              << "part " << j;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 8);  // S1 and S2: a fused dispatch and a fused combine, two directions
}

TEST(PerfModel, CandidatesAndBaselineRule) {
  const Profile prof = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  const auto shape = shape_of(16, 4, 8, 4, 2, "1.0");
  const std::vector<Kind> all = {Kind::kBaseline, Kind::kS1, Kind::kS2};
  // mp=2, esp=2, ep=2: baseline, s1, s1+fused, s2, s2+fused.
  auto c = predict_candidates(prof, shape, make_target(0, 2, 2, 2, 2), 4, all, {false, true});
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].pred.name(), "baseline");
  EXPECT_EQ(c[2].pred.name(), "s1+fused");
  // mp=2, esp=1, ep=2: S1 has nothing to fuse (ep only); S2 fuses ep alltoall + mp gather.
  c = predict_candidates(prof, shape, make_target(0, 2, 2, 1, 2), 4, all, {false, true});
  std::vector<std::string> names;
  for (const auto& x : c) names.push_back(x.pred.name());
  EXPECT_EQ(names, (std::vector<std::string>{"baseline", "s1", "s2", "s2+fused"}));
  // mp=4, esp=2: no baseline.
  c = predict_candidates(prof, shape, make_target(8, 4, 2, 2, 4), 4, all, {false, true});
  EXPECT_EQ(c.front().pred.name(), "s1");
}

// The same layer (T=64 M=8 E=4 k=2 f=1.2; mp=esp=ep=2, EP across nodes) under two
// profiles. Inter-node bytes are dear in both, so the baseline, whose EP alltoalls carry
// N_MP copies (C = 39 slots against 20 for S1 and S2), loses either way.
TEST(PerfModel, AutoPicksS1WhenMpBytesDominate) {
  // Intra-node bytes are dear too: S1's MP traffic ((N-1) T/N M) is about k f times smaller
  // than S2's ((N-1) E Cs M).
  const Profile prof = comm_only_profile(1.0, 1.0, 1.0, 10.0, 1.0);
  const auto shape = shape_of(64, 8, 16, 4, 2, "1.2");
  const auto c = predict_candidates(prof, shape, make_target(0, 2, 2, 2, 2), 4,
                                    {Kind::kBaseline, Kind::kS1, Kind::kS2}, {false, true});
  EXPECT_EQ(c[choose(c)].kind, Kind::kS1) << c[choose(c)].pred.name();
}

TEST(PerfModel, IntraLatencyCountsS1AndS2Alike) {
  // Every intra-node collective call costs 1 ms and intra bytes are almost free. S1 and S2
  // issue six intra-node calls per step pair each (S1 on mp: the output gather with the l_aux
  // statistics beside it, the token-slice adjoint with dWg beside it; esp: four; S2: mp two,
  // esp four): their unfused predictions differ by less than one call. Fused pieces would
  // pay the 1 ms per piece; the baseline's EP alltoalls carry N_MP copies.
  const Profile prof = comm_only_profile(1000.0, 1e-6, 1.0, 10.0, 1.0);
  const auto shape = shape_of(64, 8, 16, 4, 2, "1.2");
  const auto c = predict_candidates(prof, shape, make_target(0, 2, 2, 2, 2), 4,
                                    {Kind::kBaseline, Kind::kS1, Kind::kS2}, {false, true});
  EXPECT_NE(c[choose(c)].kind, Kind::kBaseline) << c[choose(c)].pred.name();
  EXPECT_FALSE(c[choose(c)].pred.fused);
  double s1 = 0.0, s2 = 0.0;
  for (const auto& cand : c) {
    if (cand.pred.fused) continue;
    if (cand.kind == Kind::kS1) s1 = cand.pred.total_us();
    if (cand.kind == Kind::kS2) s2 = cand.pred.total_us();
  }
  ASSERT_GT(s1, 6000.0);
  EXPECT_LT(std::abs(s1 - s2), 1000.0) << "s1 " << s1 << " us, s2 " << s2 << " us";
}

TEST(PerfModel, AutoPicksFusedOnlyWhenItPays) {
  const auto shape = shape_of(64, 8, 16, 4, 2, "1.2");
  const Target t = make_target(0, 2, 2, 2, 2);
  const std::vector<Kind> s1 = {Kind::kS1};
  // Both links busy with bytes and ideal overlap: fused wins.
  auto c = predict_candidates(comm_only_profile(0.1, 1e-2, 0.1, 1e-2, 1.0), shape, t, 4, s1,
                              {false, true});
  EXPECT_TRUE(c[choose(c)].pred.fused);
  // No overlap: the fused step costs its parts unfused, each paying its latency once (not
  // W times), so the totals agree.
  c = predict_candidates(comm_only_profile(50.0, 1e-2, 50.0, 1e-2, 0.0), shape, t, 4, s1,
                         {false, true});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[1].pred.total_us(), c[0].pred.total_us(), 1e-6 * c[0].pred.total_us());
  // ... and with a cost per extra piece, the pieces only add time: unfused wins.
  Profile slow = comm_only_profile(50.0, 1e-2, 50.0, 1e-2, 0.0);
  slow.fused.per_piece_us = 10.0;
  c = predict_candidates(slow, shape, t, 4, s1, {false, true});
  EXPECT_FALSE(c[choose(c)].pred.fused);
}

TEST(PerfModel, ComputeStepsUseRatesAndShapes) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};  // 1 GFLOP/s = 1e3 flop/us
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const auto sc = schedule::build({shape, t.layout, 0, false, 4}, Kind::kS1);
  const Prediction s1 = predict(p, sc, shape, t);
  // R = blocks (4) x C1 (2) = 8 rows; E_loc = 2; Hl = 4: per expert two (8 x 4 x 4) GEMMs.
  const double gemm = 2.0 + 2.0 * 8 * 4 * 4 / 1e3;
  EXPECT_NEAR(step_named(s1, "experts").fwd_us, 2 * 2 * gemm, 1e-6);
}

// SwiGLU experts (docs/spec.md §8) by hand: the forward adds x W3 (an NN GEMM of W1's shape)
// and its elementwise step reads pre and gate and writes act (3 R Hl floats for GeLU's 2);
// the backward adds dW3 (TN) and dx += dgate W3^T (NT), and its adjoint moves 5 R Hl floats
// for GeLU's 3. Nothing else changes: no b2 add, the same rows in and out.
TEST(PerfModel, SwigluExpertsPriceTheThirdProduct) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};  // 1e3 flop/us
  p.gemm_fit(GemmClass::kExpertTN) = GemmFit{3.0, 1.0, 1.0, 0, "t"};
  p.gemm_fit(GemmClass::kExpertNT) = GemmFit{5.0, 1.0, 1.0, 0, "t"};
  p.mem_fit(MemClass::kGelu) = MemFit{7.0, 1.0, 1.0, 0, "t"};  // 1e3 bytes/us
  auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const auto gelu_sc = schedule::build({shape, t.layout, 0, false, 4}, Kind::kS1);
  const StepCost gelu = step_named(predict(p, gelu_sc, shape, t), "experts");
  shape.expert_mlp = ExpertMlp::kSwiglu;
  const auto sw_sc = schedule::build({shape, t.layout, 0, false, 4}, Kind::kS1);
  const StepCost sw = step_named(predict(p, sw_sc, shape, t), "experts");
  // R = 4 blocks x C1 2 = 8 rows, E_loc 2, Hl 4, M 4: every GEMM 2 x 8 x 4 x 4 = 256 flops.
  const double flops = 2.0 * 8 * 4 * 4 / 1e3;
  const double elementwise = 4.0 * 2 * 8 * 4 / 1e3;  // bytes of R Hl floats, both experts
  // (The copies, b2's add among them, are free in this profile; the one elementwise call's
  // alpha of 7 us cancels.)
  EXPECT_NEAR(sw.fwd_us - gelu.fwd_us, 2 * (2.0 + flops) + elementwise, 1e-6);
  EXPECT_NEAR(sw.bwd_us - gelu.bwd_us, 2 * (3.0 + flops) + 2 * (5.0 + flops) + 2 * elementwise,
              1e-6);
}

// Shared experts run during the dispatch AllToAll (Step::overlap_next, docs/spec.md §9): the
// prediction takes the shorter of the two off each pass, as an entry of its own; without the
// overlap the same steps are priced one after the other.
TEST(PerfModel, SharedExpertsOverlapTheDispatchAllToAll) {
  Profile p = comm_only_profile(5.0, 1e-3, 5.0, 1e-3);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  p.gemm_fit(GemmClass::kExpertTN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  p.gemm_fit(GemmClass::kExpertNT) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  auto shape = shape_of(64, 8, 16, 4, 2, "1.0");
  shape.shared_experts = 2;
  shape.shared_hidden = 16;
  const Target t = make_target(0, 2, 2, 1, 1);  // mp 2, ep 2: S2 has a plain dispatch AllToAll
  Prediction on, off;
  for (bool overlap : {true, false}) {
    shape.shared_overlap = overlap;
    (overlap ? on : off) = predict_kind(p, shape, t, Kind::kS2, false);
  }
  const auto a2a = step_named(on, "dispatch alltoall");
  const auto shared = step_named(on, "shared experts");
  const auto& credit = on.steps.back();
  EXPECT_NE(credit.label.find("overlap: shared experts during dispatch alltoall"),
            std::string::npos) << credit.label;
  EXPECT_DOUBLE_EQ(credit.fwd_us, -std::min(a2a.fwd_us, shared.fwd_us));
  EXPECT_DOUBLE_EQ(credit.bwd_us, -std::min(a2a.bwd_us, shared.bwd_us));
  EXPECT_NEAR(off.total_us() - on.total_us(),
              std::min(a2a.fwd_us, shared.fwd_us) + std::min(a2a.bwd_us, shared.bwd_us), 1e-6);
  EXPECT_GT(off.total_us() - on.total_us(), 0.0);
}

// Groups on 2 nodes x 2 ranks (nodes {0, 0, 1, 1}), by hand (model.h):
//   mp = {0,1}, {2,3}: inside a node.
//   ep with esp = 2: {0,2}, {1,3}: n = 2, local 1 everywhere: nothing stays inside a node
//     (intra share 0); node 0 carries ranks 0 and 1, each (2-1)/(2-1) = 1: link share 2.
//   world: n = 4, local 2: intra share (2-1)/3 = 1/3; node 0: 2 x (4-2)/3 = 4/3.
TEST(PerfModel, GroupSpanOfTwoNodesWithTwoRanksEach) {
  const Target t = make_target(0, 2, 2, 2, 2);
  const GroupSpan mp = group_span(t, Group::kMp);
  EXPECT_EQ(mp.link, Link::kIntra);
  EXPECT_EQ(mp.size, 2);
  EXPECT_DOUBLE_EQ(mp.intra_share, 1.0);
  EXPECT_DOUBLE_EQ(mp.link_share, 0.0);
  const GroupSpan ep = group_span(t, Group::kEp);
  EXPECT_EQ(ep.link, Link::kInter);
  EXPECT_DOUBLE_EQ(ep.intra_share, 0.0);
  EXPECT_DOUBLE_EQ(ep.link_share, 2.0);
  const GroupSpan world = group_span(t, Group::kWorld);
  EXPECT_EQ(world.size, 4);
  EXPECT_DOUBLE_EQ(world.intra_share, 1.0 / 3);
  EXPECT_DOUBLE_EQ(world.link_share, 4.0 / 3);
  // EP = 4 over (mp 2, esp 1) is the world group: the same span.
  const GroupSpan ep4 = group_span(make_target(4, 2, 4, 1, 2), Group::kEp);
  EXPECT_DOUBLE_EQ(ep4.link_share, 4.0 / 3);
  // Uneven: 3 ranks on node 0, 1 on node 1. Node 0: 3 x (4-3)/3 = 1; node 1: (4-1)/3 = 1;
  // intra share max(2/3, 0).
  const GroupSpan uneven = span_of_instances({{0, 0, 0, 1}});
  EXPECT_DOUBLE_EQ(uneven.link_share, 1.0);
  EXPECT_DOUBLE_EQ(uneven.intra_share, 2.0 / 3);
  // 2 nodes x 4 ranks, one rank per node in each of 4 instances: link share 4.
  EXPECT_DOUBLE_EQ(span_of_instances({{0, 1}, {0, 1}, {0, 1}, {0, 1}}).link_share, 4.0);
}

TEST(PerfModel, CollectiveUsOfEachTerm) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  p.collective(Link::kIntra, CommOp::kAllToAll) = comm_fit(10.0, 1e-3, 2.0);
  p.collective(Link::kInter, CommOp::kAllToAll) = comm_fit(100.0, 1e-2, 10.0);
  const Target t = make_target(0, 2, 2, 2, 2);
  const double b = 300.0;
  // mp (intra, n = 2): 10 + 1e-3 * 300.
  EXPECT_DOUBLE_EQ(collective_us(p, CommOp::kAllToAll, group_span(t, Group::kMp), b), 10.3);
  // ep (one rank per node): 100 + 1e-2 * 2 * 300.
  EXPECT_DOUBLE_EQ(collective_us(p, CommOp::kAllToAll, group_span(t, Group::kEp), b), 106.0);
  // world (n = 4): alpha 100 + 10 * 2; 1e-3 * 1/3 * 300 inside; 1e-2 * 4/3 * 300 across.
  EXPECT_NEAR(collective_us(p, CommOp::kAllToAll, group_span(t, Group::kWorld), b),
              120.0 + 0.1 + 4.0, 1e-12);
  EXPECT_DOUBLE_EQ(collective_alpha_us(p, CommOp::kAllToAll, group_span(t, Group::kWorld)),
                   120.0);
  // An intra group of 4 (one node): alpha 10 + 2 * 2.
  const Target one = make_target(4, 4, 1, 1, 0);
  EXPECT_DOUBLE_EQ(collective_us(p, CommOp::kAllToAll, group_span(one, Group::kMp), b),
                   14.0 + 0.3);
}

// Every collective step pays the rendezvous once per direction, a fused one too.
TEST(PerfModel, StepSyncOncePerCollectiveStep) {
  Profile p = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const Prediction plain = predict_kind(p, shape, t, Kind::kS1, true);
  p.step_sync.us = p.step_sync_intra.us = 7.0;  // across the nodes and within one
  const Prediction synced = predict_kind(p, shape, t, Kind::kS1, true);
  int stepped = 0;
  for (size_t i = 0; i < plain.steps.size(); ++i) {
    const auto& a = plain.steps[i];
    const auto& b = synced.steps[i];
    EXPECT_DOUBLE_EQ(b.fwd_us - a.fwd_us, a.fwd_parts.empty() ? 0.0 : 7.0) << a.label;
    EXPECT_DOUBLE_EQ(b.bwd_us - a.bwd_us, a.bwd_parts.empty() ? 0.0 : 7.0) << a.label;
    stepped += !a.fwd_parts.empty();
  }
  EXPECT_GE(stepped, 3);
}

// The rendezvous grows with the compute since the previous collective step, in the order the
// executor runs the steps (backward reversed), and a step on the world uses the world's line.
TEST(PerfModel, RendezvousAfterTheComputeBeforeIt) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  for (GemmClass c : {GemmClass::kExpertNN, GemmClass::kExpertTN, GemmClass::kExpertNT})
    p.gemm_fit(c) = GemmFit{2.0, 1.0, 1.0, 0, "t"};  // only the experts compute
  p.step_sync = SyncFit{7.0, 0.5, 1.0, 0, "t"};
  p.step_sync_world = SyncFit{3.0, 0.25, 1.0, 0, "t"};
  p.step_sync_intra = SyncFit{2.0, 0.1, 1.0, 0, "t"};
  EXPECT_DOUBLE_EQ(rendezvous_us(p, false, 100.0), 57.0);
  EXPECT_DOUBLE_EQ(rendezvous_us(p, true, 100.0), 28.0);
  EXPECT_DOUBLE_EQ(rendezvous_us(p, false, -1.0), 7.0);
  EXPECT_DOUBLE_EQ(intra_rendezvous_us(p, false, 100.0), 12.0);
  EXPECT_DOUBLE_EQ(intra_rendezvous_us(p, true, 100.0), 28.0);
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  // 2 nodes x 2, mp = ep = esp = 2: every group has 2 of the 4 ranks; mp and esp within a
  // node, ep across. Forward: dispatch alltoall (ep), esp allgather, experts, esp
  // reduce_scatter (within a node, right after the experts: the intra line over them),
  // combine alltoall (across: the experts are the compute since the dispatch alltoall, the
  // last step across), mp allgather. Backward, reversed: combine alltoall, esp reduce_scatter's
  // adjoint, experts, esp allgather's adjoint (intra, after them), dispatch alltoall (across,
  // the experts since the combine alltoall), mp slice's adjoint.
  const Prediction s1 = predict_kind(p, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, false);
  const StepCost& ex = step_named(s1, "experts");
  ASSERT_GT(ex.fwd_us, 4.0);
  ASSERT_GT(ex.bwd_us, 8.0);
  auto across = [](const std::vector<PartCost>& parts) {
    for (const auto& q : parts)
      if (q.link == Link::kInter) return true;
    return false;
  };
  int collectives = 0, inter_steps = 0;
  double fwd_sync = 0.0, bwd_sync = 0.0;
  for (const auto& c : s1.steps) {
    const double fwd = c.label == "esp reduce_scatter" ? 2.0 + 0.1 * ex.fwd_us
                       : c.label == "combine alltoall" ? 7.0 + 0.5 * ex.fwd_us
                       : across(c.fwd_parts)           ? 7.0
                                                       : 2.0;
    const double bwd = c.label == "esp allgather"       ? 2.0 + 0.1 * ex.bwd_us
                       : c.label == "dispatch alltoall" ? 7.0 + 0.5 * ex.bwd_us
                       : across(c.bwd_parts)            ? 7.0
                                                        : 2.0;
    if (c.fwd_parts.empty()) EXPECT_EQ(c.fwd_sync_us, 0.0) << c.label;
    else EXPECT_DOUBLE_EQ(c.fwd_sync_us, fwd) << c.label;
    if (c.bwd_parts.empty()) EXPECT_EQ(c.bwd_sync_us, 0.0) << c.label;
    else EXPECT_DOUBLE_EQ(c.bwd_sync_us, bwd) << c.label;
    collectives += !c.fwd_parts.empty();
    inter_steps += across(c.fwd_parts);
    fwd_sync += c.fwd_sync_us;
    bwd_sync += c.bwd_sync_us;
  }
  EXPECT_GE(collectives, 5);
  EXPECT_EQ(inter_steps, 2);  // the two ep alltoalls
  Profile unsynced = p;
  unsynced.step_sync = unsynced.step_sync_world = unsynced.step_sync_intra = SyncFit{};
  const Prediction plain =
      predict_kind(unsynced, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, false);
  EXPECT_NEAR(s1.fwd_us - plain.fwd_us, fwd_sync, 1e-9);
  EXPECT_NEAR(s1.bwd_us - plain.bwd_us, bwd_sync, 1e-9);
  // ep = 4 on 2 nodes x 2: the ep alltoall holds every rank and takes the world's line.
  const Prediction world = predict_kind(p, shape, make_target(0, 1, 4, 1, 2), Kind::kS1, false);
  const StepCost& wex = step_named(world, "experts");
  EXPECT_DOUBLE_EQ(step_named(world, "combine alltoall").fwd_sync_us, 3.0 + 0.25 * wex.fwd_us);
  EXPECT_DOUBLE_EQ(step_named(world, "dispatch alltoall").bwd_sync_us, 3.0 + 0.25 * wex.bwd_us);
  EXPECT_DOUBLE_EQ(step_named(world, "dispatch alltoall").fwd_sync_us, 3.0);
  // One node: every step within it. The esp reduce_scatter takes the intra line after the
  // experts, the combine alltoall after nothing.
  const Prediction one = predict_kind(p, shape, make_target(0, 2, 2, 2, 0), Kind::kS1, false);
  const StepCost& oex = step_named(one, "experts");
  EXPECT_DOUBLE_EQ(step_named(one, "esp reduce_scatter").fwd_sync_us, 2.0 + 0.1 * oex.fwd_us);
  EXPECT_DOUBLE_EQ(step_named(one, "combine alltoall").fwd_sync_us, 2.0);
}

// A fused step of an inter-node and an intra-node collective pays both rendezvous, the one
// within the node times 1 - overlap (model.h): fused S1 on 2 nodes x 2, mp = ep = esp = 2.
TEST(PerfModel, FusedStepAcrossBothLinksPaysBothRendezvous) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  for (GemmClass c : {GemmClass::kExpertNN, GemmClass::kExpertTN, GemmClass::kExpertNT})
    p.gemm_fit(c) = GemmFit{2.0, 1.0, 1.0, 0, "t"};  // only the experts compute
  p.step_sync = p.step_sync_world = SyncFit{7.0, 0.5, 1.0, 0, "t"};
  p.step_sync_intra = SyncFit{2.0, 0.1, 1.0, 0, "t"};
  p.fused.overlap = 0.25;
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Prediction f = predict_kind(p, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, true, 2);
  const StepCost& ex = step_named(f, "experts");
  ASSERT_GT(ex.fwd_us, 4.0);
  // Forward: the fused combine (esp reduce_scatter + ep alltoall) right after the experts:
  // 0.75 x (2 + 0.1 x experts) + (7 + 0.5 x experts); the fused dispatch after no compute:
  // 0.75 x 2 + 7. Backward, reversed: the fused dispatch's adjoint after the experts.
  const StepCost& comb = step_named(f, "fused combine (esp reduce_scatter + ep alltoall)");
  const StepCost& disp = step_named(f, "fused dispatch (ep alltoall + esp allgather)");
  EXPECT_DOUBLE_EQ(comb.fwd_sync_us, 0.75 * (2.0 + 0.1 * ex.fwd_us) + 7.0 + 0.5 * ex.fwd_us);
  EXPECT_DOUBLE_EQ(disp.fwd_sync_us, 0.75 * 2.0 + 7.0);
  EXPECT_DOUBLE_EQ(disp.bwd_sync_us, 0.75 * (2.0 + 0.1 * ex.bwd_us) + 7.0 + 0.5 * ex.bwd_us);
  EXPECT_DOUBLE_EQ(comb.bwd_sync_us, 0.75 * 2.0 + 7.0);
  // At overlap 1 the wait within the node is hidden; at 0 it is paid whole, as unfused S1
  // pays its esp reduce_scatter's and its combine alltoall's.
  for (double ov : {0.0, 1.0}) {
    p.fused.overlap = ov;
    const Prediction g = predict_kind(p, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, true, 2);
    EXPECT_DOUBLE_EQ(
        step_named(g, "fused combine (esp reduce_scatter + ep alltoall)").fwd_sync_us,
        (1.0 - ov) * (2.0 + 0.1 * ex.fwd_us) + 7.0 + 0.5 * ex.fwd_us);
  }
  const Prediction u = predict_kind(p, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, false);
  EXPECT_DOUBLE_EQ(step_named(u, "esp reduce_scatter").fwd_sync_us +
                       step_named(u, "combine alltoall").fwd_sync_us,
                   (2.0 + 0.1 * ex.fwd_us) + 7.0 + 0.5 * ex.fwd_us);
}

// calibrate's per_compute from one measured layer (model.h): the rest's excess over its price
// per us of compute the ranks did before their collective steps.
TEST(PerfModel, RendezvousPerComputeHandComputed) {
  // Measured 100 us, 40 of it compute; priced 70 without a rendezvous, 50 of it compute; R1
  // 30 us. Rest 60 against 20 priced: 40 us more, over R1 scaled to the compute done,
  // 30 x 40 / 50 = 24: 40 / 24.
  EXPECT_DOUBLE_EQ(rendezvous_per_compute(100.0, 40.0, 70.0, 50.0, 30.0), 40.0 / 24.0);
  // A rest at or below its price measures no rendezvous: 0, never negative.
  EXPECT_DOUBLE_EQ(rendezvous_per_compute(60.0, 40.0, 70.0, 50.0, 30.0), 0.0);
  // Nothing to divide by: 0.
  EXPECT_DOUBLE_EQ(rendezvous_per_compute(100.0, 40.0, 70.0, 50.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(rendezvous_per_compute(100.0, 0.0, 70.0, 50.0, 30.0), 0.0);
}

// The measurement inverts the price: a layer "measured" at what a profile with per_compute
// 0.3 predicts (its compute exactly at its price) gives back 0.3, with R1 the difference of
// the prices at per_compute 1 and 0, as calibrate_rendezvous takes it.
TEST(PerfModel, RendezvousPerComputeRecoversThePricedLine) {
  Profile p = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  for (GemmClass c : {GemmClass::kExpertNN, GemmClass::kExpertTN, GemmClass::kExpertNT})
    p.gemm_fit(c) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Target t = make_target(0, 2, 2, 2, 2);
  const Prediction p0 = predict_kind(p, shape, t, Kind::kS1, false);
  Profile one = p, line = p;
  one.step_sync.per_compute = one.step_sync_world.per_compute = 1.0;
  line.step_sync.per_compute = line.step_sync_world.per_compute = 0.3;
  const double r1 = predict_kind(one, shape, t, Kind::kS1, false).total_us() - p0.total_us();
  ASSERT_GT(r1, 0.0);
  const Prediction measured = predict_kind(line, shape, t, Kind::kS1, false);
  const double c = compute_steps_us(p0);
  ASSERT_GT(c, 0.0);
  EXPECT_NEAR(rendezvous_per_compute(measured.total_us(), c, p0.total_us(), c, r1), 0.3, 1e-12);
}

// The two terms through the medians of the two computations (model.h: fit_rendezvous).
TEST(PerfModel, RendezvousFitHandComputed) {
  using T = RendezvousTiming;
  // Medians: small (E 1000, A 100), large (E 3000, A 1000); 4 steps. per_compute 2000 / 900,
  // us (1000 - 100 x 2000 / 900) / 4.
  const std::vector<T> small{{1000, 100}, {1200, 110}, {900, 90}};
  const std::vector<T> large{{3000, 1000}, {2800, 900}, {5000, 1100}};
  RendezvousTerms t = fit_rendezvous(small, large, 4.0);
  EXPECT_DOUBLE_EQ(t.per_compute, 2000.0 / 900.0);
  EXPECT_DOUBLE_EQ(t.us, (1000.0 - 100.0 * 2000.0 / 900.0) / 4.0);
  // More compute waited less: per_compute 0, us the mean excess per step, (3000 + 1000) / 2 / 4.
  t = fit_rendezvous({{3000, 100}}, {{1000, 1000}}, 4.0);
  EXPECT_DOUBLE_EQ(t.per_compute, 0.0);
  EXPECT_DOUBLE_EQ(t.us, 500.0);
  // The line would cross below 0 at no compute: us 0, per_compute (100 + 3000) / (100 + 1000).
  t = fit_rendezvous({{100, 100}}, {{3000, 1000}}, 4.0);
  EXPECT_DOUBLE_EQ(t.us, 0.0);
  EXPECT_DOUBLE_EQ(t.per_compute, 3100.0 / 1100.0);
  // Rests under their price: nothing.
  t = fit_rendezvous({{-50, 100}}, {{-20, 1000}}, 4.0);
  EXPECT_DOUBLE_EQ(t.us, 0.0);
  EXPECT_DOUBLE_EQ(t.per_compute, 0.0);
  // No steps, or a size not timed: nothing.
  EXPECT_DOUBLE_EQ(fit_rendezvous(small, large, 0.0).per_compute, 0.0);
  EXPECT_DOUBLE_EQ(fit_rendezvous({}, large, 4.0).us, 0.0);
}

// The cap (model.h: fit_rendezvous) on a hand-computed case. Two steps per timing whose
// compute before them is (1, 2), (4, 8) and (16, 32) ms, "measured" at us 100 per step,
// per_compute 0.5, cap 6 ms: excess 200 + 0.5 x (1000 + 2000) = 1700, 200 + 0.5 x (4000 + 6000)
// = 5200, 200 + 0.5 x (6000 + 6000) = 6200 us. The line through the two smaller alone is per
// compute 3500 / 9000 (0.389) and would price the largest at 19200; the fit finds the cap and
// refits the line at it until both settle on the terms that made the data.
TEST(PerfModel, RendezvousCapHandComputed) {
  using T = RendezvousTiming;
  const std::vector<T> small{{1700, 3000, {1000, 2000}}};
  const std::vector<T> large{{5200, 12000, {4000, 8000}}};
  const std::vector<T> largest{{6200, 48000, {16000, 32000}}};
  EXPECT_DOUBLE_EQ(rendezvous_at_one(largest[0], 6000), 12000.0);
  EXPECT_DOUBLE_EQ(rendezvous_at_one(largest[0], 0), 48000.0);
  EXPECT_DOUBLE_EQ(rendezvous_at_one(largest[0], 20000), 36000.0);
  RendezvousTerms t = fit_rendezvous(small, large, 2.0, largest);
  EXPECT_NEAR(t.compute_cap_us, 6000.0, 1e-3);
  EXPECT_NEAR(t.per_compute, 0.5, 1e-7);
  EXPECT_NEAR(t.us, 100.0, 1e-4);
  // The price of that profile: a step after 20 ms of compute pays 100 + 0.5 x 6000.
  Profile p;
  p.step_sync = SyncFit{t.us, t.per_compute, 1.0, 0, "t", t.compute_cap_us};
  EXPECT_NEAR(rendezvous_us(p, false, 20000.0), 3100.0, 1e-2);
  EXPECT_NEAR(rendezvous_us(p, false, 1000.0), 600.0, 1e-4);
  // Without the largest, or where it waited as long as the line says (the data on a line,
  // 200 + 0.5 x 48000): no cap, the line of the two smaller.
  const std::vector<T> on_line{{24200, 48000, {16000, 32000}}};
  for (const auto& top : {std::vector<T>{}, on_line}) {
    t = fit_rendezvous(small, large, 2.0, top);
    EXPECT_DOUBLE_EQ(t.compute_cap_us, 0.0);
    EXPECT_DOUBLE_EQ(t.per_compute, 3500.0 / 9000.0);
  }
  // Longer than the line: no cap either (the line stays; more than linear is not modelled).
  t = fit_rendezvous(small, large, 2.0, {{40000, 48000, {16000, 32000}}});
  EXPECT_DOUBLE_EQ(t.compute_cap_us, 0.0);
  EXPECT_DOUBLE_EQ(t.per_compute, 3500.0 / 9000.0);
}

// The fit inverts the price: the rendezvous layer at the three sizes "measured" at what a
// profile with us 5, per_compute 0.3 and a cap between the large and the largest size's
// compute per step predicts gives back 5, 0.3 and the cap, each size's excess, R1 and compute
// per step taken as calibrate_rendezvous takes them.
TEST(PerfModel, RendezvousFitRecoversThePricedTerms) {
  Profile p = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  for (GemmClass c : {GemmClass::kExpertNN, GemmClass::kExpertTN, GemmClass::kExpertNT})
    p.gemm_fit(c) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  const Target t = make_target(0, 2, 2, 2, 2);
  auto priced = [&](const MoeShape& shape, SyncFit f) {
    Profile q = p;
    q.step_sync = q.step_sync_world = q.step_sync_intra = f;
    return predict_kind(q, shape, t, Kind::kS1, false);
  };
  std::vector<double> step_compute[3];
  for (int i = 0; i < 3; ++i)
    for (const StepCost& c : priced(rendezvous_calibration_shape(t.layout, kRendezvousHidden[i]),
                                    SyncFit{0.0, 1.0, 1.0, 0, "t"}).steps)
      for (double v : {c.fwd_sync_us, c.bwd_sync_us})
        if (v > 0.0) step_compute[i].push_back(v);
  const double top_large = *std::max_element(step_compute[1].begin(), step_compute[1].end());
  const double top = *std::max_element(step_compute[2].begin(), step_compute[2].end());
  ASSERT_GT(top, top_large);
  const double cap = 0.5 * (top_large + top);
  for (const double c : {0.0, cap}) {
    std::vector<RendezvousTiming> at[3];
    double steps = 0.0;
    for (int i = 0; i < 3; ++i) {
      const MoeShape shape = rendezvous_calibration_shape(t.layout, kRendezvousHidden[i]);
      const double p0 = priced(shape, SyncFit{}).total_us();
      auto with = [&](SyncFit f) { return priced(shape, f).total_us() - p0; };
      steps = with(SyncFit{1.0, 0.0, 1.0, 0, "t"});
      at[i].push_back({with(SyncFit{5.0, 0.3, 1.0, 0, "t", c}),
                       with(SyncFit{0.0, 1.0, 1.0, 0, "t"}), step_compute[i]});
    }
    ASSERT_GT(steps, 0.0);
    const RendezvousTerms r = fit_rendezvous(at[0], at[1], steps, at[2]);
    EXPECT_NEAR(r.us, 5.0, 1e-6) << "cap " << c;
    EXPECT_NEAR(r.per_compute, 0.3, 1e-9) << "cap " << c;
    EXPECT_NEAR(r.compute_cap_us, c, 1e-6 * top) << "cap " << c;
  }
}

// compute_steps_us sums exactly the steps that are not collectives and not the executor's.
TEST(PerfModel, ComputeStepsAreTheNonCollectiveSteps) {
  Profile p = comm_only_profile(10.0, 1e-3, 100.0, 1e-2);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};
  p.mem_fit(MemClass::kCopy) = MemFit{1.0, 1.0, 1.0, 0, "t"};  // the executor's copies cost
  const auto shape = shape_of(8, 4, 8, 4, 2, "1.0");
  const Prediction s1 = predict_kind(p, shape, make_target(0, 2, 2, 2, 2), Kind::kS1, false);
  ASSERT_TRUE(s1.steps.back().executor);
  ASSERT_GT(s1.steps.back().fwd_us, 0.0);
  double compute = 0.0, other = 0.0;
  for (const auto& c : s1.steps) {
    const bool computes = !c.executor && (c.kind == StepKind::kGate || c.kind == StepKind::kAuxLoss ||
                                          c.kind == StepKind::kDispatch ||
                                          c.kind == StepKind::kExperts ||
                                          c.kind == StepKind::kCombine);
    (computes ? compute : other) += c.fwd_us + c.bwd_us;
  }
  EXPECT_GT(compute, 0.0);
  EXPECT_GT(other, 0.0);
  EXPECT_DOUBLE_EQ(compute_steps_us(s1), compute);
  EXPECT_NEAR(compute_steps_us(s1) + other, s1.total_us(), 1e-9);
}

// The experts step prices the busiest rank's rows: lambda (Target::load_max_over_mean)
// times the mean routed rows, at most the exchange layout's rows.
TEST(PerfModel, ImbalancedFillsPriceTheBusiestRank) {
  Profile p = comm_only_profile(0.0, 0.0, 0.0, 0.0);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{2.0, 1.0, 1.0, 0, "t"};  // 1e3 flop/us
  auto two_gemms = [](double R) { return 2 * (2.0 + 2.0 * R * 4 * 4 / 1e3); };
  // T 8, M 4, H 8, E 4, k 2 on mp = ep = esp = 2 (2 nodes of 2): S1 gates T/2 = 4 tokens,
  // 2 local experts, 4 blocks (ep x esp) per expert, k T_gate / E = 2 routed rows a segment.
  Target t = make_target(0, 2, 2, 2, 2);
  auto experts_fwd = [&](const char* f, double lambda) {
    const auto shape = shape_of(8, 4, 8, 4, 2, f);
    const auto sc = schedule::build({shape, t.layout, 0, false, 4}, Kind::kS1);
    t.load_max_over_mean = lambda;
    return step_named(predict(p, sc, shape, t), "experts").fwd_us;
  };
  const auto one = shape_of(8, 4, 8, 4, 2, "1.0");
  const auto sc1 = schedule::build({one, t.layout, 0, false, 4}, Kind::kS1);
  // Mean routed rows per rank: 2 experts x 4 blocks x 2 = 16.
  EXPECT_DOUBLE_EQ(mean_routed_rows(sc1, one, t.layout), 16.0);
  // Balanced: 8 rows per local expert. f = 1.0 has C1 = 2 slots a segment: R_pad 8.
  EXPECT_NEAR(experts_fwd("1.0", 1.0), 2 * two_gemms(8), 1e-9);
  // Imbalanced: the busiest rank filled 10 rows (5 per local expert), lambda = 10 / 16.
  const double lambda = load_of_busiest_rows(sc1, one, t.layout, 10.0);
  EXPECT_DOUBLE_EQ(lambda, 0.625);
  EXPECT_NEAR(experts_fwd("1.0", lambda), 2 * two_gemms(5), 1e-9);
  // Never more rows than the exchange layout holds: lambda 1.5 still 8 rows at f = 1.0, but
  // at f = 2.0 (C1 = 4 slots, R_pad 16) the busiest rank computes 1.5 x 8 = 12 per expert.
  EXPECT_NEAR(experts_fwd("1.0", 1.5), 2 * two_gemms(8), 1e-9);
  EXPECT_NEAR(experts_fwd("2.0", 1.5), 2 * two_gemms(12), 1e-9);
  EXPECT_NEAR(experts_fwd("2.0", 1.0), 2 * two_gemms(8), 1e-9);
  EXPECT_THROW(load_of_busiest_rows(sc1, one, t.layout, -1.0), Error);
}

// One input: a measured lambda moves a dropless schedule's exchanges and its experts' rows
// alike (the mean routed rows times lambda in both).
TEST(PerfModel, OneImbalanceInputForExchangesAndExperts) {
  Profile p = comm_only_profile(0.0, 1e-6, 0.0, 1e-6);
  p.gemm_fit(GemmClass::kExpertNN) = GemmFit{0.0, 1.0, 1.0, 0, "t"};  // 1e3 flop/us
  // T 64, M 4, H 8, E 4, k 2 dropless on ep = 2 (mp = esp = 1): a rank's 2 experts get
  // k T / E = 32 routed rows each from each of the 2 blocks: mean 128 rows a rank.
  Target t = make_target(0, 1, 2, 1, 0);
  const auto shape = shape_of(64, 4, 8, 4, 2, "none");
  const auto sc = schedule::build({shape, t.layout, 0, false, 1}, Kind::kS1);
  ASSERT_TRUE(sc.dropless);
  EXPECT_DOUBLE_EQ(mean_routed_rows(sc, shape, t.layout), 128.0);
  // The busiest rank computed 160 rows: lambda 1.25.
  t.load_max_over_mean = load_of_busiest_rows(sc, shape, t.layout, 160.0);
  EXPECT_DOUBLE_EQ(t.load_max_over_mean, 1.25);
  const Prediction pr = predict(p, sc, shape, t);
  // Experts: 2 experts x 2 GEMMs of 80 rows x 8 x 4 (2 flops each) at 1e3 flop/us.
  EXPECT_NEAR(step_named(pr, "experts").fwd_us, 2 * 2 * (2.0 * 80 * 8 * 4 / 1e3), 1e-9);
  // Dispatch alltoall: 1.25 x the routed rows of the (E, C = T) buffer: 1.25 x k T / E of
  // 64 slots = 0.625 of its bytes; bus bytes (n - 1) / n of 4 x 64 x 4 x 4 bytes = 2048.
  double bytes = 0.0;
  for (const auto& part : step_named(pr, "dispatch alltoall").fwd_parts) bytes += part.bus_bytes;
  EXPECT_DOUBLE_EQ(bytes, 0.625 * 2048.0);
}

// Dropless fused (comm/fused_rows.h): the fused pipeline over the routed rows. Its fused
// dispatch costs the pipeline formula over the parts the unfused dropless steps move (the
// busiest rank's routed rows), not their sum and not the listed worst-case buffers.
TEST(PerfModel, DroplessFusedIsThePipelineOverTheRoutedRows) {
  const double ai = 10.0, bi = 1e-3, ae = 100.0, be = 1e-2;
  const Profile prof = comm_only_profile(ai, bi, ae, be, 1.0);
  const auto shape = shape_of(64, 4, 8, 4, 2, "none");
  Target t = make_target(0, 2, 2, 2, 2);
  for (double lambda : {1.0, 1.5}) {
    SCOPED_TRACE(testing::Message() << "lambda " << lambda);
    t.load_max_over_mean = lambda;
    const auto fused_sc = schedule::build({shape, t.layout, 0, true, 4}, Kind::kS1);
    ASSERT_TRUE(fused_sc.dropless && fused_sc.fused);
    const Prediction f = predict(prof, fused_sc, shape, t);
    const Prediction u = predict_kind(prof, shape, t, Kind::kS1, false);
    const auto& a = step_named(u, "dispatch alltoall").fwd_parts;
    const auto& g = step_named(u, "esp allgather").fwd_parts;
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(g.size(), 1u);
    // The routed rows: k T_gate / E = 16 of the C = T_gate = 32-row segments (T_gate = T /
    // N_MP), times lambda, of the ep alltoall's listed bus bytes: (n - 1) / n of the
    // (E, C, M) buffer's 2048 bytes.
    EXPECT_DOUBLE_EQ(a[0].bus_bytes, 0.5 * lambda * 1024.0);
    const auto& d = step_named(f, "fused dispatch (ep alltoall + esp allgather)");
    ASSERT_EQ(d.fwd_parts.size(), 2u);
    EXPECT_DOUBLE_EQ(d.fwd_parts[0].bus_bytes, a[0].bus_bytes);
    EXPECT_DOUBLE_EQ(d.fwd_parts[1].bus_bytes, g[0].bus_bytes);
    // ep crosses the nodes (both ranks of a node share the link: 2x), esp stays inside.
    const double ca = ae + be * 2 * a[0].bus_bytes / 4, cb = ai + bi * g[0].bus_bytes / 4;
    EXPECT_NEAR(d.fwd_us, 4 * std::max(ca, cb) + std::min(ca, cb), 1e-9);
  }
}

// ---- profile file ----

std::string temp_path(const std::string& name) {
  return fmt::format("/tmp/parm_test_perfmodel_{}_{}", getpid(), name);
}

Profile sample_profile() {
  Profile p;
  p.machine = {{"hostname", "test-host"}, {"cores", 2}};
  double v = 1.0;
  for (auto& link : p.comm)
    for (auto& f : link) {
      f = comm_fit(v, v * 1e-4, v / 10);
      f.r2 = 0.99;
      f.samples = 12;
      f.group_sizes = {2, 4};
      f.source = "measured";
      f.alpha_per_rank_source = "assumed 0 (measured at one group size, 2)";
      f.handshake_us = 7.0 * v;
      f.handshake_source = "measured (test)";
      v += 1.0;
    }
  p.fused = FusedFit{0.75, 3.5, 0.9, 24, "emulated"};
  p.fused.eager_limit_bytes = 65536.0;
  p.fused.eager_limit_source = "assumed (test)";
  p.fused.eager_gain = 0.4;
  p.fused.eager_gain_source = "measured";
  p.fused.eager_gain_mixed = 0.2;
  p.fused.eager_gain_mixed_source = "emulated";
  p.layer_compute = ComputeScale{1.25, "measured"};
  p.step_sync = SyncFit{42.0, 0.125, 0.8, 10, "measured"};
  p.step_sync_world = SyncFit{5.0, 0.5, 0.7, 8, "emulated"};
  p.step_sync_intra = SyncFit{3.0, 0.25, 0.9, 9, "measured", 60000.0};
  for (auto& g : p.gemm) {
    g = GemmFit{v, 10.0 * v, 0.95, 54, "measured"};
    v += 1.0;
  }
  for (auto& m : p.mem) {
    m = MemFit{v, 3.0 * v, 0.9, 9, "measured"};
    v += 1.0;
  }
  return p;
}

TEST(Profile, WriteReadRoundTrip) {
  const Profile p = sample_profile();
  const std::string path = temp_path("roundtrip.json");
  write_profile(p, path);
  const Profile q = read_profile(path);
  std::remove(path.c_str());
  EXPECT_EQ(q.machine, p.machine);
  for (size_t l = 0; l < p.comm.size(); ++l)
    for (size_t o = 0; o < p.comm[l].size(); ++o) {
      EXPECT_DOUBLE_EQ(q.comm[l][o].alpha_us, p.comm[l][o].alpha_us);
      EXPECT_DOUBLE_EQ(q.comm[l][o].beta_us_per_byte, p.comm[l][o].beta_us_per_byte);
      EXPECT_DOUBLE_EQ(q.comm[l][o].r2, p.comm[l][o].r2);
      EXPECT_EQ(q.comm[l][o].samples, p.comm[l][o].samples);
      EXPECT_DOUBLE_EQ(q.comm[l][o].alpha_per_rank_us, p.comm[l][o].alpha_per_rank_us);
      EXPECT_EQ(q.comm[l][o].group_sizes, p.comm[l][o].group_sizes);
      EXPECT_EQ(q.comm[l][o].source, p.comm[l][o].source);
      EXPECT_EQ(q.comm[l][o].alpha_per_rank_source, p.comm[l][o].alpha_per_rank_source);
      EXPECT_DOUBLE_EQ(q.comm[l][o].handshake_us, p.comm[l][o].handshake_us);
      EXPECT_EQ(q.comm[l][o].handshake_source, p.comm[l][o].handshake_source);
    }
  EXPECT_DOUBLE_EQ(q.fused.overlap, 0.75);
  EXPECT_DOUBLE_EQ(q.fused.per_piece_us, 3.5);
  EXPECT_EQ(q.fused.source, "emulated");
  EXPECT_DOUBLE_EQ(q.fused.eager_limit_bytes, 65536.0);
  EXPECT_EQ(q.fused.eager_limit_source, "assumed (test)");
  EXPECT_DOUBLE_EQ(q.fused.eager_gain, 0.4);
  EXPECT_EQ(q.fused.eager_gain_source, "measured");
  EXPECT_DOUBLE_EQ(q.fused.eager_gain_mixed, 0.2);
  EXPECT_EQ(q.fused.eager_gain_mixed_source, "emulated");
  EXPECT_DOUBLE_EQ(q.layer_compute.scale, 1.25);
  EXPECT_EQ(q.layer_compute.source, "measured");
  EXPECT_DOUBLE_EQ(q.step_sync.us, 42.0);
  EXPECT_DOUBLE_EQ(q.step_sync.per_compute, 0.125);
  EXPECT_DOUBLE_EQ(q.step_sync.r2, 0.8);
  EXPECT_DOUBLE_EQ(q.step_sync_world.us, 5.0);
  EXPECT_DOUBLE_EQ(q.step_sync_world.per_compute, 0.5);
  EXPECT_EQ(q.step_sync_world.source, "emulated");
  EXPECT_DOUBLE_EQ(q.step_sync.compute_cap_us, 0.0);
  EXPECT_DOUBLE_EQ(q.step_sync_intra.compute_cap_us, 60000.0);
  // A profile from before the world was measured apart: the world copies step_sync.
  nlohmann::json old = profile_to_json(p);
  // A profile of one measured share: it prices both spans.
  old["fused"].erase("eager_gain_mixed");
  old["fused"].erase("eager_gain_mixed_source");
  const Profile one = profile_from_json(old, "one-share.json");
  EXPECT_DOUBLE_EQ(one.fused.eager_gain_mixed, 0.4);
  EXPECT_NE(one.fused.eager_gain_mixed_source.find("copied from eager_gain"), std::string::npos);
  old.erase("step_sync_world");
  old["step_sync"].erase("per_compute");
  for (const char* key : {"eager_limit_bytes", "eager_limit_source", "eager_gain",
                          "eager_gain_source"})
    old["fused"].erase(key);
  old.erase("layer_compute");
  for (auto& [lname, ops] : old["collectives"].items())
    for (auto& [oname, e] : ops.items()) {
      e.erase("handshake_us");
      e.erase("handshake_source");
    }
  const Profile o = profile_from_json(old, "old.json");
  // A profile from before the handshake was fitted: none priced.
  EXPECT_DOUBLE_EQ(o.collective(Link::kInter, CommOp::kAllToAll).handshake_us, 0.0);
  EXPECT_NE(o.collective(Link::kInter, CommOp::kAllToAll).handshake_source.find("assumed 0"),
            std::string::npos);
  // A profile from before the eager gain was measured: fusion's rendezvous saving unpriced.
  EXPECT_DOUBLE_EQ(o.fused.eager_gain, 0.0);
  EXPECT_DOUBLE_EQ(o.fused.eager_limit_bytes, 0.0);
  EXPECT_NE(o.fused.eager_gain_source.find("assumed 0"), std::string::npos);
  EXPECT_DOUBLE_EQ(o.layer_compute.scale, 1.0);  // and the compute as calibrated alone
  EXPECT_NE(o.layer_compute.source.find("assumed 1"), std::string::npos);
  EXPECT_DOUBLE_EQ(o.step_sync.per_compute, 0.0);
  EXPECT_DOUBLE_EQ(o.step_sync_world.us, 42.0);
  EXPECT_NE(o.step_sync_world.source.find("assumed"), std::string::npos);
  EXPECT_EQ(q.step_sync.source, "measured");
  for (size_t c = 0; c < p.gemm.size(); ++c) {
    EXPECT_DOUBLE_EQ(q.gemm[c].gflops, p.gemm[c].gflops);
    EXPECT_DOUBLE_EQ(q.gemm[c].alpha_us, p.gemm[c].alpha_us);
  }
  for (size_t c = 0; c < p.mem.size(); ++c) EXPECT_DOUBLE_EQ(q.mem[c].gbps, p.mem[c].gbps);
  // The JSON names its entries by link and op.
  const auto j = profile_to_json(p);
  EXPECT_EQ(j.at("version"), 2);
  EXPECT_DOUBLE_EQ(j.at("collectives").at("inter").at("alltoall").at("alpha_us").get<double>(),
                   p.collective(Link::kInter, CommOp::kAllToAll).alpha_us);
}

// The refusal message of `j` read as `origin`.
std::string refusal(const nlohmann::json& j, const std::string& origin = "p.json") {
  try {
    profile_from_json(j, origin);
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  return "(accepted)";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Profile, RefusesWrongVersion) {
  auto j = profile_to_json(sample_profile());
  j["version"] = 3;
  const std::string m = refusal(j, "prof.json");
  EXPECT_TRUE(has(m, "prof.json")) << m;
  EXPECT_TRUE(has(m, "'version' is 3")) << m;
  EXPECT_TRUE(has(m, "version 2")) << m;
  // A version 1 profile (one latency per link, inter beta per bus byte of one group) is
  // refused with the reason and what to do.
  j["version"] = 1;
  const std::string v1 = refusal(j, "old.json");
  EXPECT_TRUE(has(v1, "old.json")) << v1;
  EXPECT_TRUE(has(v1, "'version' is 1")) << v1;
  EXPECT_TRUE(has(v1, "re-run `parm calibrate --out FILE`")) << v1;
  j["version"] = 2;
  j["collectives"]["intra"]["alltoall"]["group_sizes"] = {1};
  EXPECT_TRUE(has(refusal(j), "'collectives.intra.alltoall.group_sizes[0]' = 1 is out of range"))
      << refusal(j);
  j["collectives"]["intra"]["alltoall"].erase("alpha_per_rank_us");
  EXPECT_TRUE(has(refusal(j), "missing entry 'collectives.intra.alltoall.alpha_per_rank_us'"))
      << refusal(j);
  j.erase("version");
  EXPECT_TRUE(has(refusal(j), "missing entry 'version'")) << refusal(j);
  j["version"] = "2";
  EXPECT_TRUE(has(refusal(j), "'version' is \"2\"")) << refusal(j);
}

TEST(Profile, RefusesMissingEntries) {
  auto j = profile_to_json(sample_profile());
  j["collectives"]["inter"].erase("alltoall");
  std::string m = refusal(j, "prof.json");
  EXPECT_TRUE(has(m, "prof.json")) << m;
  EXPECT_TRUE(has(m, "missing entry 'collectives.inter.alltoall'")) << m;
  j = profile_to_json(sample_profile());
  j["gemm"]["expert_tn"].erase("gflops");
  EXPECT_TRUE(has(refusal(j), "missing entry 'gemm.expert_tn.gflops'")) << refusal(j);
  j = profile_to_json(sample_profile());
  j.erase("memory");
  EXPECT_TRUE(has(refusal(j), "missing entry 'memory'")) << refusal(j);
  j = profile_to_json(sample_profile());
  j.erase("fused");
  EXPECT_TRUE(has(refusal(j), "missing entry 'fused'")) << refusal(j);
}

TEST(Profile, RefusesNonNumbersAndBadRanges) {
  auto j = profile_to_json(sample_profile());
  j["collectives"]["intra"]["allreduce"]["alpha_us"] = "fast";
  std::string m = refusal(j, "prof.json");
  EXPECT_TRUE(has(m, "prof.json")) << m;
  EXPECT_TRUE(has(m, "'collectives.intra.allreduce.alpha_us' must be a number, got \"fast\""))
      << m;
  j = profile_to_json(sample_profile());
  j["gemm"]["gate"]["gflops"] = nullptr;
  EXPECT_TRUE(has(refusal(j), "'gemm.gate.gflops' must be a number, got null")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["gemm"]["gate"]["gflops"] = 0;
  EXPECT_TRUE(has(refusal(j), "'gemm.gate.gflops' = 0 is out of range")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["collectives"]["inter"]["allgather"]["beta_us_per_byte"] = -1e-3;
  EXPECT_TRUE(has(refusal(j), "collectives.inter.allgather.beta_us_per_byte")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["fused"]["overlap"] = 1.5;
  EXPECT_TRUE(has(refusal(j), "'fused.overlap' = 1.5 is out of range")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["layer_compute"]["scale"] = 0.1;
  EXPECT_TRUE(has(refusal(j), "'layer_compute.scale' = 0.1 is out of range")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["fused"]["eager_gain"] = 1.5;
  EXPECT_TRUE(has(refusal(j), "'fused.eager_gain' = 1.5 is out of range")) << refusal(j);
  j = profile_to_json(sample_profile());
  j["memory"]["copy"]["samples"] = 2.5;
  EXPECT_TRUE(has(refusal(j), "'memory.copy.samples' must be a whole number")) << refusal(j);
}

TEST(Profile, RefusesUnreadableAndNonJsonFiles) {
  const std::string path = temp_path("broken.json");
  write_file_atomic(path, "{\"version\": 1, \"collectives\": ");
  try {
    read_profile(path);
    ADD_FAILURE() << "accepted broken JSON";
  } catch (const InvalidConfig& e) {
    EXPECT_TRUE(has(e.what(), path)) << e.what();
    EXPECT_TRUE(has(e.what(), "not valid JSON")) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(read_profile(temp_path("does_not_exist.json")), InvalidConfig);
}

// ---- simulator ----

// Splits one CSV line (fields may be quoted, with commas inside).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::vector<std::string> csv_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i)
    if (text[i] == '\n') {
      lines.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  return lines;
}

nlohmann::json small_cluster() {
  // 2 nodes x 2 devices; compute is free so that times are the collectives alone.
  return {{"name", "tiny"},
          {"nodes", 2},
          {"devices_per_node", 2},
          {"intra", {{"alpha_us", 10.0}, {"beta_us_per_byte", 0.01}}},
          {"inter", {{"alpha_us", 100.0}, {"beta_us_per_byte", 0.1}}},
          {"gemm", {{"tflops", 1e9}, {"alpha_us", 0.0}}},
          {"memory", {{"gbps", 1e15}, {"alpha_us", 0.0}}},
          {"fused_overlap", 1.0}};
}

nlohmann::json small_grid() {
  return {{"name", "small"}, {"B", {2}},    {"L", {4}},        {"M", {4}},
          {"H", {8}},        {"E", {4}},    {"k", {1, 2}},     {"f", {"1.0"}},
          {"N_MP", {2}},     {"N_ESP", {1, 2}}, {"N_EP", {2, 4}}};
}

TEST(Simulator, CsvOfSmallGrid) {
  const auto cluster = cluster_from_json(small_cluster(), "tiny.json");
  const auto grid = grid_from_json(small_grid(), "small.json");
  ASSERT_EQ(grid.configs.size(), 8u);  // k (2) x N_ESP (2) x N_EP (2)
  const auto rows = simulate(cluster, grid);
  const auto lines = csv_lines(sim_csv(rows));
  ASSERT_EQ(lines.size(), 9u);  // header + every configuration
  const auto header = csv_fields(lines[0]);
  ASSERT_EQ(header.size(), 26u);
  EXPECT_EQ(header[15], "baseline_ms");
  EXPECT_EQ(header[24], "speedup_auto_vs_baseline");
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(csv_fields(lines[i]).size(), 26u) << lines[i];
  // Row order: N_EP fastest, then N_ESP, then k. Row 4 = k 1, N_ESP 2, N_EP 2... index:
  // (k=1: esp1 ep2, esp1 ep4, esp2 ep2, esp2 ep4), (k=2: ...).
  const auto r = csv_fields(lines[1 + 2]);  // k=1, N_ESP=2, N_EP=2
  EXPECT_EQ(r[7], "1");
  EXPECT_EQ(r[10], "2");
  EXPECT_EQ(r[11], "2");
  EXPECT_EQ(r[12], "intra");  // mp
  EXPECT_EQ(r[14], "inter");  // ep: ranks {0, 2} on two nodes
  // By hand: T = 8, C = ceil(8 / 4) = 2. The baseline moves, each way, two ep alltoalls of
  // the (4, 2, 4) dispatch buffer (128 bytes -> 64 bus bytes, inter, through a node link
  // both ranks of the node share: link share 2) and one esp allreduce of (2, 2, 2, 4) = 128
  // bytes (-> 128 bus bytes, intra):
  //   per pass 2 (100 + 0.1 * 2 * 64) + (10 + 0.01 * 128) = 236.88 us; twice = 0.47376 ms.
  EXPECT_NEAR(std::stod(r[15]), 0.47376, 1e-4);
  // N_ESP = 2 with N_EP = 4 needs 8 devices: skipped, with empty times and a reason.
  const auto skipped = csv_fields(lines[1 + 3]);
  EXPECT_EQ(skipped[15], "");
  EXPECT_EQ(skipped[22], "");
  EXPECT_TRUE(has(skipped[25], "skipped")) << skipped[25];
  const auto s = summarize(rows);
  EXPECT_EQ(s.configs, 8);
  EXPECT_EQ(s.skipped, 2);
  EXPECT_EQ(s.evaluated, 6);
  EXPECT_EQ(s.with_baseline, 6);
  EXPECT_EQ(s.choose_s1 + s.choose_s2 + s.choose_baseline, 6);
  EXPECT_EQ(s.choose_fused + s.choose_unfused, 6);
  EXPECT_GE(s.speedup_min, 1.0 - 1e-12);  // auto never predicts slower than the baseline
  const std::string svg = speedup_svg(rows, s, "tiny <test>");
  EXPECT_TRUE(has(svg, "<svg")) << svg;
  EXPECT_TRUE(has(svg, "tiny &lt;test&gt;")) << svg;
}

TEST(Simulator, RefusesBadFiles) {
  auto c = small_cluster();
  c["intra"]["beta_us_per_byte"] = "slow";
  try {
    cluster_from_json(c, "c.json");
    ADD_FAILURE();
  } catch (const InvalidConfig& e) {
    EXPECT_TRUE(has(e.what(), "c.json")) << e.what();
    EXPECT_TRUE(has(e.what(), "intra.beta_us_per_byte")) << e.what();
  }
  // The handshake: inter-node only, and only with the eager limit it applies above.
  c = small_cluster();
  c["inter"]["handshake_us"] = 70.0;
  for (const char* want : {"inter.handshake_us", "fused_eager_limit_bytes"}) {
    try {
      cluster_from_json(c, "c.json");
      ADD_FAILURE();
    } catch (const InvalidConfig& e) {
      EXPECT_TRUE(has(e.what(), want)) << e.what();
    }
  }
  c["fused_eager_limit_bytes"] = 65472.0;
  c["fused_eager_gain"] = 0.0;
  const ClusterSpec ok = cluster_from_json(c, "c.json");
  EXPECT_DOUBLE_EQ(ok.profile.collective(Link::kInter, CommOp::kAllToAll).handshake_us, 70.0);
  EXPECT_DOUBLE_EQ(ok.profile.collective(Link::kIntra, CommOp::kAllToAll).handshake_us, 0.0);
  c["intra"]["handshake_us"] = 5.0;
  try {
    cluster_from_json(c, "c.json");
    ADD_FAILURE();
  } catch (const InvalidConfig& e) {
    EXPECT_TRUE(has(e.what(), "intra.handshake_us")) << e.what();
  }
  auto g = small_grid();
  g.erase("N_EP");
  EXPECT_THROW(grid_from_json(g, "g.json"), InvalidConfig);
  g = small_grid();
  g["f"] = {"1.x"};
  EXPECT_THROW(grid_from_json(g, "g.json"), InvalidConfig);
  g = small_grid();
  g["k"] = {0};
  EXPECT_THROW(grid_from_json(g, "g.json"), InvalidConfig);
}

TEST(Fit, PooledAnchoredLines) {
  // Two series on y = 1 + 2x and y = 5 + 2x: one slope, an intercept each.
  const auto f = fit_anchored_pooled({{1, 2, 4}, {10, 20}}, {{3, 5, 9}, {25, 45}});
  EXPECT_NEAR(f.slope, 2.0, 1e-12);
  ASSERT_EQ(f.intercepts.size(), 2u);
  EXPECT_NEAR(f.intercepts[0], 1.0, 1e-12);
  EXPECT_NEAR(f.intercepts[1], 5.0, 1e-12);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_EQ(f.samples, 5);
  // Slopes 1 and 3 (equal spreads): the pooled slope is 2, each line through its anchor.
  const auto g = fit_anchored_pooled({{0, 1}, {0, 1}}, {{0, 1}, {10, 13}});
  EXPECT_NEAR(g.slope, 2.0, 1e-12);
  EXPECT_NEAR(g.intercepts[1], 10.0, 1e-12);
  EXPECT_THROW(fit_anchored_pooled({{1}}, {{1}}), Error);
  // A delayed smallest sample (1000 instead of 12 on y = 10 + 2x) does not set the latency:
  // the line is anchored at the second size, timed faster.
  const auto h = fit_anchored_pooled({{1, 2, 4, 8}}, {{1000, 14, 18, 26}});
  EXPECT_NEAR(h.intercepts[0], 10.0, 1e-9);
  EXPECT_NEAR(h.slope, 2.0, 1e-9);
}

TEST(Fit, PooledAnchoredLinesWithAStepAtTheFlaggedSamples) {
  // y = 10 + 2x, and 50 more from x = 8 on (the messages above the eager limit); a second
  // series y = 30 + 2x with its step from x = 40.
  const auto f = fit_anchored_pooled({{1, 2, 4, 8, 16}, {10, 20, 40, 80}},
                                     {{12, 14, 18, 76, 92}, {50, 70, 160, 240}},
                                     {{false, false, false, true, true}, {false, false, true, true}});
  EXPECT_TRUE(f.step_fitted);
  EXPECT_NEAR(f.slope, 2.0, 1e-9);
  EXPECT_NEAR(f.step, 50.0, 1e-9);
  ASSERT_EQ(f.intercepts.size(), 2u);
  EXPECT_NEAR(f.intercepts[0], 10.0, 1e-9);
  EXPECT_NEAR(f.intercepts[1], 30.0, 1e-9);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  // Without flags the same samples give one steeper line and no step.
  const auto plain = fit_anchored_pooled({{1, 2, 4, 8, 16}}, {{12, 14, 18, 76, 92}});
  EXPECT_FALSE(plain.step_fitted);
  EXPECT_DOUBLE_EQ(plain.step, 0.0);
  EXPECT_GT(plain.slope, 2.0);
  // A step down is bounded at 0, the slope then fitted alone (y = 10 + 2x exactly).
  const auto down = fit_anchored_pooled({{1, 2, 4, 8}}, {{12, 14, 18, 26}},
                                        {{false, false, true, true}});
  EXPECT_TRUE(down.step_fitted);
  EXPECT_DOUBLE_EQ(down.step, 0.0);
  EXPECT_NEAR(down.slope, 2.0, 1e-9);
  // Not fitted: one flagged size per series (the slope above the step not seen), every sample
  // beyond the anchor flagged or none, or the anchor itself flagged.
  EXPECT_FALSE(fit_anchored_pooled({{1, 2, 4, 8}, {10, 20, 40}}, {{12, 14, 18, 76}, {50, 70, 160}},
                                   {{false, false, false, true}, {false, false, true}})
                   .step_fitted);
  EXPECT_FALSE(fit_anchored_pooled({{1, 2, 4}}, {{12, 64, 68}}, {{false, true, true}}).step_fitted);
  EXPECT_FALSE(fit_anchored_pooled({{1, 2, 4}}, {{12, 14, 18}}, {{false, false, false}}).step_fitted);
  EXPECT_FALSE(fit_anchored_pooled({{1, 2, 4}}, {{62, 64, 68}}, {{true, true, true}}).step_fitted);
  EXPECT_THROW(fit_anchored_pooled({{1, 2}}, {{1, 2}}, {{false}}), Error);
}

TEST(Fit, RelativeLine) {
  // Exact lines are recovered whatever the weights.
  const auto e = fit_line_relative({1, 2, 4}, {12, 14, 18});
  EXPECT_NEAR(e.intercept, 10.0, 1e-12);
  EXPECT_NEAR(e.slope, 2.0, 1e-12);
  // Weights 1 / y^2 = (1/4, 1/4, 1/64): weighted means x 52/33, y 24/11, slope 30/29 and
  // intercept 16/29, where absolute least squares has slope 15/7 and intercept -1 (the
  // large sample sets it).
  const auto r = fit_line_relative({1, 2, 4}, {2, 2, 8});
  EXPECT_NEAR(r.slope, 30.0 / 29.0, 1e-12);
  EXPECT_NEAR(r.intercept, 16.0 / 29.0, 1e-12);
  EXPECT_EQ(fit_line({1, 2, 4}, {2, 2, 8}).intercept, 0.0);
  // A negative weighted intercept (y = x^2, w = 1, 1/16, 1/81): the weighted fit through
  // the origin, sum(w x y) / sum(w x^2).
  const auto z = fit_line_relative({1, 2, 3}, {1, 4, 9});
  EXPECT_EQ(z.intercept, 0.0);
  const double wxy = 1.0 + 2.0 * 4 / 16 + 3.0 * 9 / 81, wxx = 1.0 + 4.0 / 16 + 9.0 / 81;
  EXPECT_NEAR(z.slope, wxy / wxx, 1e-12);
  EXPECT_THROW(fit_line_relative({1, 2}, {1, 0}), Error);
  EXPECT_THROW(fit_line_relative({1}, {1}), Error);
}

// One latency of a pair for every op on a link: the median of the ops' own fits. The quiet
// 2 x 2, 1 Gbit/s calibration's intra latencies (allreduce, allgather, reduce_scatter,
// alltoall): the outlying 312.66 us allreduce no longer sets what S1's two tiny allreduces pay.
TEST(Fit, PairLatencyIsTheMedianOverTheOps) {
  EXPECT_DOUBLE_EQ(pair_latency({312.66, 96.68, 83.88, 105.78}), (96.68 + 105.78) / 2);
  EXPECT_DOUBLE_EQ(pair_latency({95.74, 126.72, 0.0, 126.72, 500.0}), 126.72);
  EXPECT_DOUBLE_EQ(pair_latency({7.0}), 7.0);
  EXPECT_THROW(pair_latency({}), Error);
}

TEST(Fit, FusedOverlapIsAMedianOfRatiosInZeroOne) {
  // Per size (unfused - fused) / (unfused - pipelined): 0.5, 0.5, and one delayed size at
  // -1.2: the median is 0.5 (a free line through these points has a negative slope); the
  // excess over the formula (0, 0, 85) has median 0, so no per-piece cost.
  const auto a = fit_overlap({90, 80, 160}, {100, 100, 100}, {80, 60, 50}, 4);
  EXPECT_DOUBLE_EQ(a.overlap, 0.5);
  EXPECT_DOUBLE_EQ(a.raw, 0.5);
  EXPECT_EQ(a.sizes_used, 3);
  EXPECT_DOUBLE_EQ(a.per_piece_us, 0.0);
  // Slower than the parts: bounded to 0, the excess (10, 20: median 15) spread over the
  // W - 1 = 3 extra pieces.
  const auto b = fit_overlap({110, 120}, {100, 100}, {80, 60}, 4);
  EXPECT_DOUBLE_EQ(b.raw, -0.5);
  EXPECT_DOUBLE_EQ(b.overlap, 0.0);
  EXPECT_DOUBLE_EQ(b.per_piece_us, 5.0);
  // Faster than the pipeline: bounded to 1.
  EXPECT_DOUBLE_EQ(fit_overlap({70}, {100}, {80}, 4).overlap, 1.0);
  // No size gains (both parts on one link class; a gain under 2% does not count): overlap 1,
  // the rest over the pipeline (3, 6, 4.5: median 4.5) per extra piece.
  const auto c = fit_overlap({109, 118, 103.5}, {100, 100, 100}, {106, 112, 99}, 4);
  EXPECT_EQ(c.sizes_used, 0);
  EXPECT_DOUBLE_EQ(c.overlap, 1.0);
  EXPECT_DOUBLE_EQ(c.per_piece_us, 1.5);
  EXPECT_THROW(fit_overlap({1}, {1, 2}, {1}, 4), Error);
}

// The per-piece cost at a given overlap (calibrate_overlap_in_layer refits it at each ov):
// the median excess over unfused - ov (unfused - pipelined), per extra piece, >= 0.
TEST(Fit, FusedPerPieceAtAGivenOverlap) {
  const std::vector<double> t{10, 20}, u{8, 16}, p{12, 18};
  EXPECT_DOUBLE_EQ(overlap_per_piece_us(t, u, p, 3, 0.0), 1.5);   // excess 2, 4
  EXPECT_DOUBLE_EQ(overlap_per_piece_us(t, u, p, 3, 0.5), 0.75);  // 0, 3
  EXPECT_DOUBLE_EQ(overlap_per_piece_us(t, u, p, 3, 1.0), 0.0);   // -2, 2: median 0
  EXPECT_DOUBLE_EQ(overlap_per_piece_us(t, u, p, 1, 0.0), 0.0);   // one piece
  EXPECT_DOUBLE_EQ(overlap_per_piece_us({}, {}, {}, 4, 0.0), 0.0);
  const auto c = fit_overlap({109, 118, 103.5}, {100, 100, 100}, {106, 112, 99}, 4);
  EXPECT_DOUBLE_EQ(c.per_piece_us, overlap_per_piece_us({109, 118, 103.5}, {100, 100, 100},
                                                         {106, 112, 99}, 4, c.overlap));
}

// The layer's overlap: where what fusion adds to the price meets what it added measured.
TEST(Fit, LayerOverlapMeetsTheMeasuredDifference) {
  // Priced: +3.35 ms at overlap 0, -53.95 ms at 1 (a line). Measured -6.75 ms: ov 10.1 / 57.3.
  const auto priced = [](double v) { return 3.35 - 57.3 * v; };
  EXPECT_NEAR(layer_overlap(-6.75, priced), 10.1 / 57.3, 1e-12);
  // Fusion measured slower than its price at 0 (2 x 4, 10 Gbit/s: +32.7 ms against +5.9): 0.
  EXPECT_DOUBLE_EQ(layer_overlap(32.7, [](double v) { return 5.9 - 150.0 * v; }), 0.0);
  // Faster than its price at 1: 1.
  EXPECT_DOUBLE_EQ(layer_overlap(-80.0, priced), 1.0);
  // A curve: the root of 2 (0.75 - v)(1 + v) = 0.
  EXPECT_NEAR(layer_overlap(0.0, [](double v) { return 2.0 * (0.75 - v) * (1.0 + v); }), 0.75,
              1e-12);
}

// The overlap both halves of the rounds support: the smaller of the two halves' (sweep q's
// calibration: fusion 3.5% faster over all rounds; a half that measured it slower gives 0).
TEST(Fit, LayerOverlapIsWhatBothHalvesSupport) {
  const auto priced = [](double v) { return 4.5 - 128.5 * v; };  // ms: +4.5 at 0, -124 at 1
  LayerTimes t;
  t.unfused_us = 1453.0;
  t.fused_us = 1402.0;
  // Halves: fusion 60 ms and 20 ms faster: (4.5 + 60) / 128.5 and (4.5 + 20) / 128.5.
  t.unfused_half_us = {1450.0, 1456.0};
  t.fused_half_us = {1390.0, 1436.0};
  EXPECT_NEAR(supported_layer_overlap(t, priced), 24.5 / 128.5, 1e-12);
  // One half measured fusion 10 ms slower: nothing both support.
  t.fused_half_us = {1390.0, 1466.0};
  EXPECT_DOUBLE_EQ(supported_layer_overlap(t, priced), 0.0);
  // Halves not timed (one round): all rounds, (4.5 + 51) / 128.5.
  t.unfused_half_us = t.fused_half_us = {0.0, 0.0};
  EXPECT_NEAR(supported_layer_overlap(t, priced), 55.5 / 128.5, 1e-12);
}

// The overlap measured nowhere (no size of the fused collectives alone with a gain, no overlap
// layer) is bounded by the calibration layer's fused / unfused pair: a layer where fusion ran
// no faster gives 0, with the per-piece cost refitted at 0 (by hand: t - u = 500 and 600 us,
// median 550, over W - 1 = 3 pieces: 183.33 us); one where it ran faster keeps the fallback;
// a measured overlap is never changed.
TEST(PerfModel, UnmeasuredOverlapIsBoundedByTheCalibrationLayer) {
  FusedAlone alone;
  alone.measured = {1500.0, 2000.0};
  alone.unfused = {1000.0, 1400.0};
  alone.pipelined = {2500.0, 2600.0};  // no gain: fit_overlap's fallback
  FusedFit fallback;
  fallback.overlap = 1.0;
  fallback.per_piece_us = 0.0;
  fallback.source = "emulated";

  FusedFit ff = fallback;
  EXPECT_TRUE(bound_unmeasured_overlap(ff, alone, 41065.0, 38668.0, 4));  // sweep k's layer
  EXPECT_EQ(ff.overlap, 0.0);
  EXPECT_NEAR(ff.per_piece_us, 550.0 / 3.0, 1e-9);
  EXPECT_NE(ff.source.find("not the fallback 1"), std::string::npos) << ff.source;
  ff = fallback;
  EXPECT_TRUE(bound_unmeasured_overlap(ff, alone, 1000.0, 1000.0, 4));  // no faster
  EXPECT_EQ(ff.overlap, 0.0);

  ff = fallback;
  EXPECT_FALSE(bound_unmeasured_overlap(ff, alone, 12544.0, 18233.0, 4));  // sweep j's layer
  EXPECT_EQ(ff.overlap, 1.0);
  EXPECT_EQ(ff.per_piece_us, 0.0);
  EXPECT_EQ(ff.source, "emulated");

  FusedAlone measured = alone;
  measured.sizes_with_gain = 1;  // fit_overlap measured it
  EXPECT_FALSE(bound_unmeasured_overlap(ff, measured, 41065.0, 38668.0, 4));
  EXPECT_EQ(ff.overlap, 1.0);
  FusedAlone in_layer = alone;
  in_layer.overlap_in_layer = true;  // calibrate_overlap_in_layer measured it
  EXPECT_FALSE(bound_unmeasured_overlap(ff, in_layer, 41065.0, 38668.0, 4));
  EXPECT_EQ(ff.overlap, 1.0);
}

// The overlap layer: pieces at least twice the eager limit, the tokens doubled until overlap 1
// would save a tenth of the unfused price; none without a fused schedule or with one chunk.
TEST(PerfModel, OverlapCalibrationShapeGrowsUntilTheCreditIsMeasurable) {
  // Bytes as costly within a node as across, latencies of 20 and 500 us: fusion's overlap
  // credit (the shorter stage's bytes) grows with T against the pipeline's extra latencies.
  Profile p = comm_only_profile(20.0, 2e-3, 500.0, 2e-3, 0.3);
  for (GemmClass c : {GemmClass::kExpertNN, GemmClass::kExpertTN, GemmClass::kExpertNT})
    p.gemm_fit(c) = GemmFit{0.0, 1e3, 1.0, 0, "t"};
  p.fused.eager_limit_bytes = 65472.0;
  const Target t = make_target(0, 2, 2, 2, 2);
  const int W = 4;
  const auto shape = overlap_calibration_shape(p, t, W);
  ASSERT_TRUE(shape.has_value());
  const MoeShape first = eager_calibration_shape(t.layout, W * 65472.0);
  EXPECT_EQ(shape->tokens % first.tokens, 0);
  const int64_t f = shape->tokens / first.tokens;
  EXPECT_TRUE(f > 1 && f <= kOverlapShapeGrowth && (f & (f - 1)) == 0) << f;  // it grew
  auto credit = [&](int64_t T) {
    Profile q = p;
    q.fused.per_piece_us = 0.0;
    const MoeShape sh = MoeShape::of(T, 256, 256, first.experts, 1, "1");
    const double u = predict_kind(q, sh, t, Kind::kS1, false, W).total_us();
    q.fused.overlap = 0.0;
    const double a0 = predict_kind(q, sh, t, Kind::kS1, true, W).total_us();
    q.fused.overlap = 1.0;
    return (a0 - predict_kind(q, sh, t, Kind::kS1, true, W).total_us()) / u;
  };
  EXPECT_GE(credit(shape->tokens), kMinEligibleShare);
  EXPECT_LT(credit(shape->tokens / 2), kMinEligibleShare);
  // The S1 ep alltoall's per-peer message (E / N_EP experts' T / (N_MP E) slots of M floats)
  // is at least 2 W x the limit: its W pieces are above the limit.
  const double per_peer = static_cast<double>(shape->tokens) / (2 * shape->experts) *
                          (shape->experts / 2) * 256 * 4;
  EXPECT_GE(per_peer, 2.0 * W * 65472.0);
  EXPECT_FALSE(overlap_calibration_shape(p, t, 1).has_value());
  EXPECT_FALSE(overlap_calibration_shape(p, make_target(0, 2, 1, 1, 2), W).has_value());
  // Free bytes: overlap has nothing to save at any size.
  EXPECT_FALSE(
      overlap_calibration_shape(comm_only_profile(50.0, 0.0, 500.0, 0.0), t, W).has_value());
}

TEST(Fit, LineAndOrigin) {
  const auto f = fit_line({1, 2, 3, 4}, {12, 14, 16, 18});
  EXPECT_NEAR(f.intercept, 10.0, 1e-12);
  EXPECT_NEAR(f.slope, 2.0, 1e-12);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_EQ(f.samples, 4);
  // A negative free intercept is refitted through the origin.
  const auto g = fit_line({1, 2, 3}, {0.0, 2.0, 4.0});
  EXPECT_EQ(g.intercept, 0.0);
  EXPECT_NEAR(g.slope, (0 + 4 + 12) / 14.0, 1e-12);
  EXPECT_THROW(fit_line({1}, {1}), Error);
  // Anchored at the smallest sample: the latency survives a large sample above the line,
  // which pulls a free least-squares intercept below 0 (refitted through the origin).
  const std::vector<double> xs = {1e3, 1e4, 1e5, 1e6}, ys = {11, 20, 110, 1300};
  EXPECT_EQ(fit_line(xs, ys).intercept, 0.0);
  const auto a = fit_anchored(xs, ys);
  EXPECT_NEAR(a.intercept + a.slope * 1e3, 11.0, 1e-9);  // through the smallest sample
  EXPECT_GT(a.intercept, 9.0);
  EXPECT_NEAR(fit_anchored({1, 2, 3}, {12, 14, 16}).slope, 2.0, 1e-12);  // exact line kept
  // A falling cost is not a cost: the slope is clamped at 0 (a constant, the mean), unless
  // asked for a free slope.
  const auto h = fit_line({1, 2, 3}, {5.0, 4.0, 3.0});
  EXPECT_EQ(h.slope, 0.0);
  EXPECT_NEAR(h.intercept, 4.0, 1e-12);
  const auto free_slope = fit_line({1, 2, 3}, {5.0, 4.0, 3.0}, /*nonneg_slope=*/false);
  EXPECT_NEAR(free_slope.slope, -1.0, 1e-12);
  EXPECT_NEAR(free_slope.intercept, 6.0, 1e-12);
}

}  // namespace
}  // namespace parm::perfmodel
