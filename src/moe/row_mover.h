// The moves of a dropless layer's segmented buffers (moe/mover.h): only each segment's
// routed rows travel, as the row exchanges of comm/row_exchange.h and the fused pipelines
// of comm/fused_rows.h, over the packed layout of StepBuffers (docs/dropless.md). The fill
// counts travel ahead of the rows they size: a move that carries them completes their
// exchange before its rows move.
#pragma once

#include <memory>
#include <vector>

#include "comm/fused_rows.h"
#include "comm/row_exchange.h"
#include "moe/backend.h"
#include "moe/mover.h"
#include "moe/step_buffers.h"
#include "parm/topology.h"

namespace parm {

class RowMover final : public Mover {
 public:
  // Runs `steps` (of sc, over bufs; each moves segmented buffers) and sizes the reductions'
  // scratch and the row exchanges' packing buffers for them; the references are kept.
  RowMover(Topology& topo, const schedule::Schedule& sc, moe::LayerBackend& backend,
           StepBuffers& bufs, const std::vector<const schedule::Step*>& steps);

  void keep_chunk(const schedule::Step& s, bool backward) override;
  void allgather(const schedule::Step& s, bool backward) override;
  void alltoall(const schedule::Step& s, bool backward) override;
  void reduce_scatter(const schedule::Step& s, bool backward) override;
  void allreduce(const schedule::Step& s, bool backward) override;
  void fused_dispatch(const schedule::Step& s, bool backward) override;
  void fused_combine(const schedule::Step& s, bool backward) override;
  int64_t held_bytes() const override { return scratch_bytes() + packing_bytes(); }
  // Of held_bytes(): the reductions' scratch of received rows, and the row exchanges'
  // packing buffers.
  int64_t scratch_bytes() const { return scratch_.bytes(); }
  int64_t packing_bytes() const { return rows_.held_bytes(); }

 private:
  // Buffer id's data (or gradient) as segments; `split` > 1 views each segment as `split`
  // parts of its routed rows, part j being dropless_part(fill, j, split) (an S2 MP gather's
  // (E, N_MP, Cs) side).
  Segments segments(int id, bool grad, int64_t split = 1);
  // The reductions' scratch, checked to hold `rows` rows (step s names the error).
  float* scratch(const schedule::Step& s, int64_t rows);
  // S2's "keep my slots": MP rank j keeps part j of every expert's routed rows
  // (dropless_part), so the ranks share the rows evenly (step s's output counts).
  void slice_fills(const schedule::Step& s);

  Topology& topo_;
  const schedule::Schedule& sc_;
  StepBuffers& bufs_;
  std::unique_ptr<RowOps> ops_;     // local copies and sums on the layer's backend
  RowExchange rows_;
  FusedRows fused_rows_;
  Tensor scratch_;                  // the reductions' received rows
  std::vector<int32_t> view_fills_; // fill counts of a split view (segments())
  std::vector<int64_t> view_first_; // and the first row of each of its parts
};

}  // namespace parm
