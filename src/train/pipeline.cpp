#include "train/pipeline.h"

#include "parm/error.h"
#include "parm/timer.h"

namespace parm::train {
namespace {

// Messages between neighbouring stages keep their order (MPI's non-overtaking rule), so one
// tag per direction is enough: micro-batches travel in order both ways.
constexpr int kActivationTag = 1;
constexpr int kGradientTag = 2;

void wait_if_set(RequestPtr& r) {
  if (r) {
    r->wait();
    r.reset();
  }
}

}  // namespace

PipelineRunner::PipelineRunner(Topology& topo, model::Model& model, int num_micro)
    : pp_(topo.host_comm(Group::kPp)), model_(model), stage_(model.stage()),
      num_micro_(num_micro) {
  PARM_CHECK_EQ(pp_.size(), stage_.num_stages);
  PARM_CHECK_EQ(pp_.rank(), stage_.stage);
  slots_ = pipeline_slots(stage_.stage, stage_.num_stages, num_micro);
  steps_ = one_f_one_b(stage_.stage, stage_.num_stages, num_micro);
  peer_world_rank_ = group_members(topo.layout(), Group::kPp, topo.world_rank());
  const Shape act = model.stage_input(0).shape();
  for (int k = 0; k < slots_; ++k) {
    model.stage_input(k);  // throws when the model has fewer slots than the schedule needs
    dy_.emplace_back(act);
    dx_send_.emplace_back(act);
  }
}

void PipelineRunner::wait_recv(RequestPtr& r, const PipeStep& st) {
  if (!r) return;
  const double t0 = now_us();
  try {
    r->wait();
  } catch (const Timeout& e) {
    // Name the stage that did not send, so that a stuck or dead rank maps to its stage.
    const int from = st.op == PipeOp::kForward ? stage_.stage - 1 : stage_.stage + 1;
    throw Timeout(fmt::format(
        "rank {} (pp stage {} of {}): the {} of micro-batch {} from rank {} (pp stage {} of "
        "{}) did not arrive: {}",
        pp_.world_rank(), stage_.stage, stage_.num_stages,
        st.op == PipeOp::kForward ? "activation" : "activation gradient", st.micro,
        peer_world_rank_[static_cast<size_t>(from)], from, stage_.num_stages, e.what()));
  }
  r.reset();
  recv_wait_us_ += now_us() - t0;
}

model::LossParts PipelineRunner::run(const std::vector<model::Batch>& batches,
                                     double lm_denominator, float loss_scale) {
  PARM_CHECK(static_cast<int>(batches.size()) == num_micro_,
             "pipeline step of {} micro-batches, but the runner was built for {}",
             batches.size(), num_micro_);
  const bool first = stage_.first(), last = stage_.last();
  const int prev = stage_.stage - 1, next = stage_.stage + 1;
  const auto n = static_cast<size_t>(model_.stage_input(0).numel());
  std::vector<RequestPtr> recv_act(static_cast<size_t>(slots_)),
      recv_grad(static_cast<size_t>(slots_)), send_act(static_cast<size_t>(slots_)),
      send_grad(static_cast<size_t>(slots_));
  auto post_recv_act = [&](int micro) {
    const int k = micro % slots_;
    recv_act[static_cast<size_t>(k)] =
        pp_.irecv(model_.stage_input(k).data(), n, DType::kF32, prev, kActivationTag);
  };
  recv_wait_us_ = 0.0;
  if (!first)
    for (int i = 0; i < slots_; ++i) post_recv_act(i);

  model::LossParts total;
  for (const PipeStep& st : steps_) {
    const auto k = static_cast<size_t>(st.slot);
    const model::Batch& batch = batches[static_cast<size_t>(st.micro)];
    if (st.op == PipeOp::kForward) {
      wait_recv(recv_act[k], st);
      wait_if_set(send_act[k]);  // the slot's previous output has left
      const model::LossParts lp =
          model_.stage_forward(st.slot, batch, lm_denominator, loss_scale, true);
      total.lm_loss_sum += lp.lm_loss_sum;
      total.num_targets += lp.num_targets;
      total.aux_loss += lp.aux_loss;
      total.z_loss += lp.z_loss;
      if (!last) {
        send_act[k] = pp_.isend(model_.stage_output(st.slot).data(), n, DType::kF32, next,
                                kActivationTag);
        recv_grad[k] = pp_.irecv(dy_[k].data(), n, DType::kF32, next, kGradientTag);
      }
    } else {
      wait_recv(recv_grad[k], st);
      const Tensor& dx = model_.stage_backward(st.slot, batch, dy_[k], loss_scale);
      if (!first) {
        wait_if_set(send_grad[k]);
        dx_send_[k].copy_from(dx);
        send_grad[k] = pp_.isend(dx_send_[k].data(), n, DType::kF32, prev, kGradientTag);
        // The slot is free: its next micro-batch's activation may arrive.
        if (st.micro + slots_ < num_micro_) post_recv_act(st.micro + slots_);
      }
    }
  }
  std::vector<RequestPtr> pending;
  for (auto* list : {&send_act, &send_grad})
    for (auto& r : *list)
      if (r) pending.push_back(std::move(r));
  wait_all(pending);
  return total;
}

model::LossParts PipelineRunner::forward(const model::Batch& batch) {
  const auto n = static_cast<size_t>(model_.stage_input(0).numel());
  if (!stage_.first())
    pp_.recv(model_.stage_input(0).data(), n, DType::kF32, stage_.stage - 1, kActivationTag);
  const model::LossParts lp = model_.stage_forward(0, batch, 0.0, 0.0f, false);
  if (!stage_.last())
    pp_.send(model_.stage_output(0).data(), n, DType::kF32, stage_.stage + 1, kActivationTag);
  return lp;
}

}  // namespace parm::train
