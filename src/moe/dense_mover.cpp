#include "moe/dense_mover.h"

#include <algorithm>

#include "comm/fused_any.h"
#include "parm/error.h"

namespace parm {

using schedule::Move;
using schedule::Step;

DenseMover::DenseMover(Topology& topo, const schedule::Schedule& sc, moe::LayerBackend& backend,
                       StepBuffers& bufs, const std::vector<const Step*>& steps)
    : topo_(topo), sc_(sc), backend_(backend), bufs_(bufs) {
  // The interleaving allgathers' scratch: the largest destination of one.
  int64_t scratch = 0;
  for (const Step* s : steps)
    for (bool backward : {false, true})
      if (schedule::step_move(s->kind, backward) == Move::kAllGather && s->outer > 1)
        scratch = std::max(scratch, bufs_.pass_numel(backward ? s->in : s->out, backward));
  if (scratch > 0) gather_scratch_ = Tensor({scratch}, topo.device());
}

Tensor& DenseMover::source(const Step& s, bool backward) {
  return bufs_.pass(backward ? s.out : s.in, backward);
}

Tensor& DenseMover::destination(const Step& s, bool backward) {
  return bufs_.pass(backward ? s.in : s.out, backward);
}

void DenseMover::keep(Communicator& c, int64_t outer, const Tensor& full, Tensor& mine) {
  backend_.take_chunk(full.data(), outer, c.size(), c.rank(), mine.numel() / outer,
                      mine.data());
}

void DenseMover::slice_fills(const Step& s) {
  // MP rank j keeps slots [j*cs, (j+1)*cs) of every expert, so its fill is the part of the
  // expert's filled prefix that falls there.
  const auto& in = bufs_.fills(s.in);
  auto& out = bufs_.fills(s.out);
  const int64_t cs = s.chunk / bufs_.model_dim();
  const int64_t lo = topo_.comm(s.group).rank() * cs;
  out.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = static_cast<int32_t>(std::clamp<int64_t>(in[i] - lo, 0, cs));
}

void DenseMover::keep_chunk(const Step& s, bool backward) {
  keep(topo_.comm(s.group), s.outer, source(s, backward), destination(s, backward));
  if (!backward && !bufs_.fills(s.in).empty()) slice_fills(s);
}

void DenseMover::allgather(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const Tensor& mine = source(s, backward);
  Tensor& full = destination(s, backward);
  bufs_.post_step_fills(s, backward, true);
  const int64_t chunk = mine.numel() / s.outer;
  if (s.outer == 1) {
    c.allgather(mine.data(), full.data(), static_cast<size_t>(chunk));
  } else {
    PARM_CHECK(gather_scratch_.numel() >= full.numel(),
               "interleaved allgather into {} elements, scratch sized {} at construction",
               full.numel(), gather_scratch_.numel());
    // (n, outer, chunk) blocks, then interleaved into (outer, n, chunk).
    c.allgather(mine.data(), gather_scratch_.data(), static_cast<size_t>(s.outer * chunk));
    backend_.interleave(gather_scratch_.data(), s.outer, c.size(), chunk, full.data());
  }
  bufs_.wait_fills();
}

void DenseMover::alltoall(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const Tensor& src = source(s, backward);
  bufs_.post_step_fills(s, backward, false);
  c.alltoall(src.data(), destination(s, backward).data(),
             static_cast<size_t>(src.numel() / c.size()));
  bufs_.wait_fills();
}

RequestPtr DenseMover::start_alltoall(const Step& s, bool backward) {
  Communicator& c = topo_.comm(s.group);
  const Tensor& src = source(s, backward);
  backend_.sync();  // the source is complete before the collective reads it
  bufs_.post_step_fills(s, backward, false);
  return c.ialltoall(src.data(), destination(s, backward).data(),
                     static_cast<size_t>(src.numel() / c.size()), DType::kF32);
}

void DenseMover::reduce_scatter(const Step& s, bool backward) {
  Tensor& dst = destination(s, backward);
  topo_.comm(s.group).reduce_scatter(source(s, backward).data(), dst.data(),
                                     static_cast<size_t>(dst.numel()));
}

void DenseMover::allreduce(const Step& s, bool backward) {
  Tensor& buf = source(s, backward);  // in place: the source is the destination
  topo_.comm(s.group).allreduce(buf.data(), static_cast<size_t>(buf.numel()));
}

// The fused moves' two groups: (group, group2) forward, (group2, group) backward.

void DenseMover::fused_dispatch(const Step& s, bool backward) {
  Communicator& c1 = topo_.comm(backward ? s.group2 : s.group);
  Communicator& c2 = topo_.comm(backward ? s.group : s.group2);
  const Tensor* from = &source(s, backward);
  if (s.has_mp_part()) {  // the adjoint of the MP gather: keep my chunk first
    Tensor& mid = bufs_.pass(s.mid, backward);
    keep(topo_.comm(s.group3), s.outer, *from, mid);
    from = &mid;
  }
  // The counts take the data's two hops: the EP exchange runs beside the pipeline, the
  // (intra-node, tiny) ESP gather of its result after it.
  const bool with_fills = !backward && s.carries_fills;
  const Group g1 = backward ? s.group2 : s.group, g2 = backward ? s.group : s.group2;
  if (with_fills) bufs_.post_fills(g1, false, bufs_.fills(s.in), bufs_.fills_stage());
  fused_dispatch_any(c1, c2, from->data(), destination(s, backward).data(),
                     static_cast<size_t>(s.block), sc_.chunks);
  bufs_.wait_fills();
  if (with_fills) {
    bufs_.post_fills(g2, true, bufs_.fills_stage(), bufs_.fills(s.out));
    bufs_.wait_fills();
  }
}

void DenseMover::fused_combine(const Step& s, bool backward) {
  Communicator& c1 = topo_.comm(backward ? s.group2 : s.group);
  Communicator& c2 = topo_.comm(backward ? s.group : s.group2);
  Tensor& dst = destination(s, backward);
  // With an MP part the combine lands in mid and its last stage gathers into dst.
  MpGatherPart mp{s.has_mp_part() ? &topo_.comm(s.group3) : nullptr, s.outer, s.chunk,
                  dst.data()};
  Tensor& to = s.has_mp_part() ? bufs_.pass(s.mid, backward) : dst;
  fused_combine_any(c1, c2, source(s, backward).data(), to.data(),
                    static_cast<size_t>(s.block), sc_.chunks, s.has_mp_part() ? &mp : nullptr);
}

}  // namespace parm
