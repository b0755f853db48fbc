// The moves of whole buffers (moe/mover.h): the communicators' collectives on the step
// buffers as schedule.h shapes them, and the fused pipelines of comm/fused_any.h. With a
// capacity factor the segmented buffers travel whole (every slot, filled or not); the fill
// counts travel beside the tokens, posted before the data collective and completed after it.
#pragma once

#include <vector>

#include "moe/backend.h"
#include "moe/mover.h"
#include "moe/step_buffers.h"
#include "parm/topology.h"

namespace parm {

class DenseMover final : public Mover {
 public:
  // Runs `steps` (of sc, over bufs) and sizes its scratch for them; the references are kept.
  DenseMover(Topology& topo, const schedule::Schedule& sc, moe::LayerBackend& backend,
             StepBuffers& bufs, const std::vector<const schedule::Step*>& steps);

  void keep_chunk(const schedule::Step& s, bool backward) override;
  void allgather(const schedule::Step& s, bool backward) override;
  void alltoall(const schedule::Step& s, bool backward) override;
  void reduce_scatter(const schedule::Step& s, bool backward) override;
  void allreduce(const schedule::Step& s, bool backward) override;
  void fused_dispatch(const schedule::Step& s, bool backward) override;
  void fused_combine(const schedule::Step& s, bool backward) override;
  RequestPtr start_alltoall(const schedule::Step& s, bool backward) override;
  int64_t held_bytes() const override { return gather_scratch_.bytes(); }

 private:
  // The pass's source and destination (forward in -> out, backward d out -> d in).
  Tensor& source(const schedule::Step& s, bool backward);
  Tensor& destination(const schedule::Step& s, bool backward);
  // mine (outer, chunk) = this rank's part of full (outer, c.size(), chunk).
  void keep(Communicator& c, int64_t outer, const Tensor& full, Tensor& mine);
  // S2's "keep my slots": the fill counts of the slots this rank keeps (step s's output).
  void slice_fills(const schedule::Step& s);

  Topology& topo_;
  const schedule::Schedule& sc_;
  moe::LayerBackend& backend_;
  StepBuffers& bufs_;
  Tensor gather_scratch_;  // permutation scratch of interleaved allgathers (the largest)
};

}  // namespace parm
