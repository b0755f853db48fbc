// What the layer does beyond its results (which the equivalence suite checks): it holds all
// its buffers from construction on (held_bytes never grows); after warm-up a forward +
// backward pass makes no C++ heap allocation, at fp32 and at bf16 (counted through the
// replaced operator new of
// alloc_counter.cpp) and repeating it gives bit-identical outputs and
// gradients (nothing stale survives between passes); and the experts compute exactly the
// rows that kept choices fill, not the padded capacity (computing empty slots would leave
// every result the same, so only a count can catch it).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "alloc_counter.h"
#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

using schedule::Kind;

struct Snapshot {
  std::vector<float> out, dx, dwg, dw1, db1, dw2, db2;
  float l_aux = 0;
};

std::vector<float> copy_of(const Tensor& t) { return {t.data(), t.data() + t.numel()}; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(LayerSteadyState, NoHeapAllocationAndRepeatableResults) {
  int64_t checked = 0;
  for (const TopologyOptions& opts : test::all_layouts()) {
    auto topo = Topology::create(opts);
    // T, H, E divisible by every N_MP, N_ESP, N_EP up to 8 that divides the world; with
    // f = 1.1 some choices drop; dropless (fp32 only), the variable-size exchanges run,
    // fused and not.
    auto s = MoeShape::of(48, 16, 48, 24, 2, "1.1");
    if (s.tokens % opts.mp != 0 || s.experts % opts.ep != 0 || s.hidden % opts.esp != 0) continue;
    const int group = group_coord(topo->layout(), Group::kMp, topo->world_rank()).index;
    const auto params = ref::init_params<float>(s, 5);
    auto x = check_input(s, 5, group);
    auto dout = check_dout(s, 5, group);
    const Tensor xt = Tensor::view(x.data(), {s.tokens, s.model_dim});
    const Tensor dt = Tensor::view(dout.data(), {s.tokens, s.model_dim});
    for (const char* f : {"1.1", "none"})
    for (Precision precision : {Precision::kFp32, Precision::kBf16})
    for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
    for (bool fuse : {false, true}) {
      const Layout& l = topo->layout();
      if (!schedule::supports(kind, l) || (fuse && kind == Kind::kBaseline)) continue;
      s.capacity_factor = CapacityFactor::parse(f);
      if (s.capacity_factor.dropless && precision != Precision::kFp32) continue;
      const std::string where =
          fmt::format("mp={} ep={} esp={} f={} {}{} {}", l.mp, l.ep, l.esp, f,
                      schedule::kind_name(kind), fuse ? " fused" : "", precision_name(precision));
      MoeLayer layer(*topo, s, kind, fuse, 3, precision);
      layer.load_whole(params);
      const int64_t held = layer.held_bytes();  // all allocated at construction
      Snapshot first;
      for (int it = 0; it < 3; ++it) {
        layer.zero_grad();
        const int64_t before = test::heap_allocations();
        const Tensor& out = layer.forward(xt);
        const Tensor& dx = layer.backward(dt, 0.25f);
        const int64_t made = test::heap_allocations() - before;
        if (it >= 1) EXPECT_EQ(made, 0) << where << ": iteration " << it << " allocated";
        EXPECT_EQ(layer.held_bytes(), held) << where << ": iteration " << it << " grew the layer";
        Snapshot now{copy_of(out),
                     copy_of(dx),
                     copy_of(layer.grads().wg),
                     copy_of(layer.grads().experts.w1),
                     copy_of(layer.grads().experts.b1),
                     copy_of(layer.grads().experts.w2),
                     copy_of(layer.grads().experts.b2),
                     layer.l_aux()};
        if (it == 0) {
          first = std::move(now);
          continue;
        }
        EXPECT_TRUE(same_bits(first.out, now.out)) << where << " out, iteration " << it;
        EXPECT_TRUE(same_bits(first.dx, now.dx)) << where << " dx, iteration " << it;
        EXPECT_TRUE(same_bits(first.dwg, now.dwg)) << where << " dWg, iteration " << it;
        EXPECT_TRUE(same_bits(first.dw1, now.dw1)) << where << " dW1, iteration " << it;
        EXPECT_TRUE(same_bits(first.db1, now.db1)) << where << " db1, iteration " << it;
        EXPECT_TRUE(same_bits(first.dw2, now.dw2)) << where << " dW2, iteration " << it;
        EXPECT_TRUE(same_bits(first.db2, now.db2)) << where << " db2, iteration " << it;
        EXPECT_EQ(first.l_aux, now.l_aux) << where;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

int64_t sum_over_world(int64_t v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

TEST(LayerWork, ExpertsComputeTheFilledRowsOnly) {
  int64_t checked = 0;
  for (const TopologyOptions& opts : test::all_layouts()) {
    auto topo = Topology::create(opts);
    const Layout& l = topo->layout();
    auto s = MoeShape::of(48, 8, 48, 24, 2, "1.0");
    if (s.tokens % l.mp != 0 || s.experts % l.ep != 0 || s.hidden % l.esp != 0) continue;
    const int group = group_coord(l, Group::kMp, topo->world_rank()).index;
    auto x = check_input(s, 9, group);
    const Tensor xt = Tensor::view(x.data(), {s.tokens, s.model_dim});
    // f = 8: nothing drops and most slots stay empty; f = 0.5: most experts fill up.
    for (const char* f : {"8.0", "0.5", "none"})
    for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
    for (bool fuse : {false, true}) {
      if (!schedule::supports(kind, l) || (fuse && kind == Kind::kBaseline)) continue;
      s.capacity_factor = CapacityFactor::parse(f);
      MoeLayer layer(*topo, s, kind, fuse, 2);
      layer.load_whole(ref::init_params<float>(s, 9));
      layer.forward(xt);
      int64_t kept = 0, rows = 0;
      for (int64_t r : layer.routing().row) kept += r >= 0 ? 1 : 0;
      for (int64_t r : layer.expert_rows()) rows += r;
      const auto& sc = layer.schedule();
      const int64_t padded = static_cast<int64_t>(layer.expert_rows().size()) * sc.expert_blocks *
               sc.exchange_slots;
      // Every kept choice is computed once per ESP shard; a gate on the MP group's whole T
      // (baseline, S2) is duplicated on its N_MP ranks, S1's gate runs on disjoint slices.
      const int64_t gate_copies = kind == Kind::kS1 || l.mp == 1 ? 1 : l.mp;
      const std::string where = fmt::format("mp={} ep={} esp={} f={} {}{}", l.mp, l.ep, l.esp,
                                            f, schedule::kind_name(kind), fuse ? " fused" : "");
      EXPECT_EQ(sum_over_world(rows) * gate_copies, sum_over_world(kept) * l.esp) << where;
      if (std::string(f) != "0.5")  // most slots empty
        EXPECT_LT(2 * sum_over_world(rows), sum_over_world(padded)) << where;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace parm
