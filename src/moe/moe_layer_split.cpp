// The MoE layer's passes in pieces (moe_layer.h: start_forward, start_backward, resume): the
// executor's step list, run as forward() / backward() run it, except that an AllToAll step
// is posted (Communicator::ialltoall, with its fill counts' exchange) and its wait is left
// to the next resume(). The bytes moved and the order of every collective are those of the
// whole pass, so the result is bit-identical, and every rank of the step's group posts it at
// the same point of the same list.
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

using schedule::Move;
using schedule::Step;

bool MoeLayer::start_forward(const Tensor& x) {
  Tensor& in = bufs_[static_cast<size_t>(schedule_.input)];
  PARM_CHECK(x.numel() == in.numel(), "MoE layer input {} but the layer takes {}",
             shape_str(x.shape()), shape_str(in.shape()));
  PARM_CHECK(!split_.active, "MoE layer: start_forward while a split pass has an AllToAll "
                             "in flight (resume() it first)");
  in.copy_from(x);
  for (auto& p : fwd_phases_) p.clear();
  backend_->sync();
  split_ = SplitPass{};
  split_.active = true;
  return run_split_steps();
}

bool MoeLayer::start_backward(const Tensor& dout, float dl_aux, float dl_z) {
  set_dl_z(dl_z);
  PARM_CHECK(!split_.active, "MoE layer: start_backward while a split pass has an AllToAll "
                             "in flight (resume() it first)");
  for (size_t i = 0; i < dbufs_.size(); ++i)
    if (accumulated_[i]) dbufs_[i].zero();
  dwg_call_.zero();
  for (auto& p : bwd_phases_) p.clear();
  dbufs_[static_cast<size_t>(schedule_.output)].copy_from(dout);
  backend_->sync();
  split_ = SplitPass{};
  split_.active = true;
  split_.backward = true;
  split_.dl_aux = dl_aux;
  return run_split_steps();
}

bool MoeLayer::resume() {
  PARM_CHECK(split_.active && split_.in_flight,
             "MoE layer: resume() without a split pass in flight (start_forward / "
             "start_backward first)");
  const double t0 = now_us();
  split_.in_flight->wait();
  split_.in_flight.reset();
  meta_.wait();  // the fill counts posted beside it (no-op when none)
  auto& us = split_.backward ? bwd_us_ : fwd_us_;
  us[split_.posted] = split_.post_us + (now_us() - t0);
  return run_split_steps();
}

const Tensor& MoeLayer::pass_result() const {
  PARM_CHECK(!split_.active, "MoE layer: pass_result() while its pass is still in flight");
  return split_.backward ? dbufs_[static_cast<size_t>(schedule_.input)]
                         : bufs_[static_cast<size_t>(schedule_.output)];
}

bool MoeLayer::run_split_steps() {
  const size_t n = schedule_.steps.size();
  const bool backward = split_.backward;
  const bool timed = step_timed();
  auto& us = backward ? bwd_us_ : fwd_us_;
  while (split_.done < n) {
    const size_t i = backward ? n - 1 - split_.done : split_.done;
    const Step& s = schedule_.steps[i];
    ++split_.done;
    const double t0 = now_us();
    // Dropless exchanges (alltoallv of the routed rows, comm/row_exchange.h) run in one piece.
    if (schedule::step_move(s.kind, backward) != Move::kAllToAll || schedule_.dropless) {
      run_step(s, backward, split_.dl_aux);
      if (!timed) continue;
      backend_->sync();
      us[i] = now_us() - t0;
      continue;
    }
    // The AllToAll: forward in -> out, backward d out -> d in (as run_step moves it).
    Tensor& src = backward ? dbufs_[static_cast<size_t>(s.out)] : bufs_[static_cast<size_t>(s.in)];
    Tensor& dst = backward ? dbufs_[static_cast<size_t>(s.in)] : bufs_[static_cast<size_t>(s.out)];
    Communicator& c = topo_.comm(s.group);
    backend_->sync();  // the source is complete before the collective reads it
    if (!backward && s.carries_fills) post_fills(s.group, false, fills(s.in), fills(s.out));
    split_.in_flight = c.ialltoall(src.data(), dst.data(),
                                   static_cast<size_t>(src.numel() / c.size()), DType::kF32);
    split_.posted = i;
    split_.post_us = now_us() - t0;
    return true;
  }
  if (backward) backend_->add(grads_.wg.data(), dwg_call_.data(), grads_.wg.numel());
  backend_->sync();
  split_.active = false;
  return false;
}

}  // namespace parm
