// The bytes a dropless layer's backend holds, from the formula of docs/dropless.md ("Worst
// case per buffer"): the gate's probabilities and their gradient, the experts' packed
// workspace (in, pre, act: one pool of blocks x B rows, B = min(E_loc slots, min(k, E_loc)
// slots [+ E_loc under S2's MP split]) rows per block) and the per-expert scratch (out_rows,
// d_out, d_act: blocks x slots rows), on every layout S1 and S2 run on; and the layer's
// scratch of the reductions' received rows, sized by the same bound; the packed exchange and
// step buffers (rows routed at most, per buffer); the row exchanges' packing buffers. Written out here
// from the layout, not through schedule::dropless_local_rows, so that a wrong bound or a
// layer that does not pack its workspace (E_loc pools of blocks x slots rows) fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "moe/moe_layer.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

using schedule::Kind;

TEST(DroplessHeld, BackendHoldsThePackedWorkspaceFormula) {
  int64_t checked = 0;
  for (const TopologyOptions& opts : test::all_layouts()) {
    auto topo = Topology::create(opts);
    const Layout& l = topo->layout();
    const MoeShape s = MoeShape::of(48, 16, 48, 24, 2, "none");
    if (s.tokens % l.mp != 0 || s.experts % l.ep != 0 || s.hidden % l.esp != 0) continue;
    const int64_t T = s.tokens, M = s.model_dim, E = s.experts, k = s.topk;
    const int64_t e_loc = E / l.ep, hl = s.hidden / l.esp, blocks = l.ep * l.esp;
    for (Kind kind : {Kind::kS1, Kind::kS2}) {
      // S1 gates T / N_MP tokens; S2 gates T and exchanges MP rank j's part of every
      // expert's rows, in slots of Cs = ceil(T / N_MP), each part rounded up by a row at most.
      const int64_t slots = kind == Kind::kS1 ? T / l.mp : (T + l.mp - 1) / l.mp;
      const int64_t gate_rows = kind == Kind::kS1 ? T / l.mp : T;
      const int64_t slack = kind == Kind::kS2 && l.mp > 1 ? e_loc : 0;
      const int64_t per_block = std::min(e_loc * slots, std::min(k, e_loc) * slots + slack);
      const int64_t pool_rows = blocks * per_block, max_rows = blocks * slots;
      const int64_t want = 4 * (2 * gate_rows * E + pool_rows * (M + 2 * hl) +
                                max_rows * (2 * M + hl));
      for (bool fuse : {false, true}) {
        const std::string where = fmt::format("mp={} ep={} esp={} {}{}", l.mp, l.ep, l.esp,
                                              schedule::kind_name(kind), fuse ? " fused" : "");
        MoeLayer layer(*topo, s, kind, fuse, 2);
        EXPECT_EQ(layer.backend().held_bytes(), want) << where << ": pool of " << pool_rows;
        // The reductions' scratch: an ESP reduce-scatter (the unfused combine's, or the
        // unfused dispatch's adjoint) receives N_ESP - 1 peers' rows of N_EP blocks; a fused
        // combine (or the fused dispatch's adjoint) holds N_ESP copies of N_EP blocks.
        const bool fused_dispatch = fuse && l.ep > 1 && l.esp > 1;
        const int parts = (l.esp > 1) + (l.ep > 1) + (kind == Kind::kS2 && l.mp > 1);
        const bool fused_combine = fuse && parts >= 2;
        const bool reduce_scatter = l.esp > 1 && !(fused_dispatch && fused_combine);
        const int64_t scratch_rows =
            std::max(reduce_scatter ? (l.esp - 1) * l.ep * per_block : 0,
                     fused_combine ? l.esp * l.ep * per_block : 0);
        EXPECT_EQ(layer.row_scratch_bytes(), scratch_rows * M * 4) << where;
        // The exchange and step buffers, packed: the rows routed at most ("Worst case per
        // buffer"): k T_g for a whole gate call's experts, k Cs + E for S2's MP part of
        // them, per_block for one source block of E_loc experts.
        const int64_t part_rows = std::min(E * slots, k * slots + E);
        const int64_t call_rows = kind == Kind::kS1 ? k * gate_rows
                                  : l.mp > 1        ? part_rows
                                                    : k * T;
        int64_t segmented = 0;
        for (size_t id = 0; id < layer.schedule().buffers.size(); ++id) {
          const schedule::BufferSpec& b = layer.schedule().buffers[id];
          if (b.slots == 0) continue;
          ++segmented;
          const int64_t want_rows = b.name == "dispatch"                              ? k * gate_rows
                                    : b.name == "dispatch_slice"                      ? part_rows
                                    : b.name == "ep_back"                             ? call_rows
                                    : b.name == "combine_in"                          ? k * T
                                    : b.name == "ep_recv" || b.name == "esp_reduced"  ? l.ep * per_block
                                    : b.name == "esp_gathered" || b.name == "expert_out"
                                        ? l.esp * l.ep * per_block
                                        : -1;
          EXPECT_EQ(layer.buffer_rows(static_cast<int>(id)), want_rows) << where << ": " << b.name;
        }
        EXPECT_GE(segmented, 2) << where;
        // The row exchanges' packing buffers, held from construction: per side, (n - 1) x
        // ranges per peer x 32 KiB for the largest unfused row exchange (an EP alltoall:
        // E_loc ranges per peer; an ESP allgather / reduce-scatter: N_EP E_loc; S2's MP
        // gather of the slots, the MP slice's adjoint: E).
        int64_t ranges = 0;
        if (!fused_dispatch) {
          if (l.ep > 1) ranges = std::max(ranges, (l.ep - 1) * e_loc);
          if (l.esp > 1) ranges = std::max(ranges, (l.esp - 1) * l.ep * e_loc);
        }
        if (kind == Kind::kS2 && l.mp > 1) ranges = std::max(ranges, (l.mp - 1) * E);
        EXPECT_EQ(layer.row_packing_bytes(), 2 * ranges * 32 * 1024) << where;
      }
      // Below E_loc pools of blocks x slots rows once k < E_loc.
      if (k < e_loc)
        EXPECT_LT(pool_rows, e_loc * max_rows) << fmt::format("mp={} ep={} esp={}", l.mp, l.ep, l.esp);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace parm
