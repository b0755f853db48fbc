// The collective moves of a schedule's steps (schedule::Move), as the executor
// (moe_layer.cpp) runs them over the layer's StepBuffers. One interface, two data paths,
// each in its own file, chosen per step when the layer is built (schedule::moves_routed_rows):
// - DenseMover (dense_mover.h): whole buffers, through the communicators' collectives and the
//   fused pipelines of comm/fused_any.h: every step of a capacity-factor layer, and a
//   dropless layer's steps on unsegmented buffers (S1's token slice and output gather);
// - RowMover (row_mover.h): a dropless layer's steps on segmented buffers, only their routed
//   rows (comm/row_exchange.h, comm/fused_rows.h).
//
// Every call is one pass of step s: forward it moves buffer s.in to s.out, backward the
// gradient of s.out to the gradient of s.in (StepBuffers::pass), with the semantics, groups
// and layouts schedule.h gives the move. Forward, a step that carries_fills also exchanges
// its source's fill counts for its destination's (StepBuffers::post_fills), complete when
// the call returns. A mover holds its scratch from construction on, sized for the steps it
// is given, and allocates nothing afterwards.
#pragma once

#include <cstdint>

#include "parm/comm.h"
#include "schedule/schedule.h"

namespace parm {

class Mover {
 public:
  virtual ~Mover() = default;
  virtual void keep_chunk(const schedule::Step& s, bool backward) = 0;      // Move::kKeepChunk
  virtual void allgather(const schedule::Step& s, bool backward) = 0;       // kAllGather
  virtual void alltoall(const schedule::Step& s, bool backward) = 0;        // kAllToAll
  virtual void reduce_scatter(const schedule::Step& s, bool backward) = 0;  // kReduceScatter
  virtual void allreduce(const schedule::Step& s, bool backward) = 0;       // kAllReduce
  virtual void fused_dispatch(const schedule::Step& s, bool backward) = 0;  // kFusedDispatch
  virtual void fused_combine(const schedule::Step& s, bool backward) = 0;   // kFusedCombine
  // alltoall() left in flight (the layer's split passes): posts the move and returns its
  // request; the caller waits for it, then StepBuffers::wait_fills() for the counts posted
  // beside it. A mover whose move cannot be left in flight runs it whole and returns null.
  virtual RequestPtr start_alltoall(const schedule::Step& s, bool backward) {
    alltoall(s, backward);
    return nullptr;
  }
  // Bytes of the scratch the mover holds.
  virtual int64_t held_bytes() const = 0;
};

}  // namespace parm
