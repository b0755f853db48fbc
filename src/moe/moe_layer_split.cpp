// The MoE layer's passes in pieces (moe_layer.h: start_forward, start_backward, resume): the
// executor's step list, run as forward() / backward() run it, except that an AllToAll step
// is posted (Mover::start_alltoall: Communicator::ialltoall with its fill counts' exchange;
// a dropless layer's row exchanges run whole) and its wait is left to the next resume(). The
// bytes moved and the order of every collective are those of the whole pass, so the result
// is bit-identical, and every rank of the step's group posts it at the same point of the
// same list.
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

using schedule::Move;
using schedule::Step;

bool MoeLayer::start_forward(const Tensor& x) {
  bufs_.bind();
  Tensor& in = bufs_.value(schedule_.input);
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
  for (auto& p : bwd_phases_) p.clear();
  begin_backward(dout);
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
  bufs_.wait_fills();  // the fill counts posted beside it (no-op when none)
  auto& us = split_.backward ? bwd_us_ : fwd_us_;
  us[split_.posted] = split_.post_us + (now_us() - t0);
  return run_split_steps();
}

const Tensor& MoeLayer::pass_result() const {
  PARM_CHECK(!split_.active, "MoE layer: pass_result() while its pass is still in flight");
  return split_.backward ? bufs_.grad(schedule_.input) : bufs_.value(schedule_.output);
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
    const bool alltoall = schedule::step_move(s.kind, backward) == Move::kAllToAll;
    if (alltoall && !schedule::joins_sum(s, backward))
      split_.in_flight = movers_[i]->start_alltoall(s, backward);
    else
      run_step(s, backward, split_.dl_aux);
    if (split_.in_flight) {
      split_.posted = i;
      split_.post_us = now_us() - t0;
      return true;
    }
    if (!timed) continue;
    backend_->sync();
    us[i] = now_us() - t0;
  }
  if (backward) add_weight_grads();
  backend_->sync();
  split_.active = false;
  return false;
}

}  // namespace parm
