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

PipelineRunner::PipelineRunner(Topology& topo, model::Model& model, int num_micro, bool overlap)
    : pp_(topo.comm(Group::kPp)), model_(model), stage_(model.stage()),
      num_micro_(num_micro), overlap_(overlap) {
  PARM_CHECK_EQ(pp_.size(), stage_.num_stages);
  PARM_CHECK_EQ(pp_.rank(), stage_.stage);
  slots_ = pipeline_slots(stage_.stage, stage_.num_stages, num_micro);
  steps_ = one_f_one_b(stage_.stage, stage_.num_stages, num_micro);
  if (overlap)
    groups_ = overlap_groups(stage_.stage, stage_.num_stages, num_micro);
  else
    for (int i = 0; i < static_cast<int>(steps_.size()); ++i) groups_.push_back({i});
  peer_world_rank_ = group_members(topo.layout(), Group::kPp, topo.world_rank());
  // The activations travel in the model's memory space (device buffers over comm(pp)).
  const Shape act = model.stage_input(0).shape();
  const Device device = model.stage_input(0).device();
  for (int k = 0; k < slots_; ++k) {
    model.stage_input(k);  // throws when the model has fewer slots than the schedule needs
    dy_.emplace_back(act, device);
    dx_send_.emplace_back(act, device);
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

struct PipelineRunner::StepRequests {
  std::vector<RequestPtr> recv_act, recv_grad, send_act, send_grad;  // by slot
  const std::vector<model::Batch>* batches = nullptr;
  size_t n = 0;  // elements of one activation
};

namespace {
void post_recv_act(Communicator& pp, model::Model& model, std::vector<RequestPtr>& recv_act,
                   int micro, int slots, int prev, size_t n) {
  const int k = micro % slots;
  recv_act[static_cast<size_t>(k)] =
      pp.irecv(model.stage_input(k).data(), n, DType::kF32, prev, kActivationTag);
}
}  // namespace

bool PipelineRunner::start(const PipeStep& st, const model::Batch& batch, StepRequests& rq) {
  const auto k = static_cast<size_t>(st.slot);
  if (st.op == PipeOp::kForward) {
    wait_recv(rq.recv_act[k], st);
    wait_if_set(rq.send_act[k]);  // the slot's previous output has left
    if (overlap_)
      return model_.start_stage_forward(st.slot, batch, denominators_, loss_scale_, true);
    model_.stage_forward(st.slot, batch, denominators_, loss_scale_, true);
    return false;
  }
  wait_recv(rq.recv_grad[k], st);
  if (overlap_) return model_.start_stage_backward(st.slot, batch, dy_[k], loss_scale_);
  model_.stage_backward(st.slot, batch, dy_[k], loss_scale_);
  return false;
}

void PipelineRunner::finish(const PipeStep& st, StepRequests& rq, model::LossParts& total) {
  const auto k = static_cast<size_t>(st.slot);
  const bool forward = st.op == PipeOp::kForward;
  moe_comm_us_ += model_.stage_moe_comm_us(st.slot, !forward);
  if (forward) {
    const model::LossParts lp = model_.stage_loss(st.slot);
    total.lm_loss_sum += lp.lm_loss_sum;
    total.num_targets += lp.num_targets;
    total.aux_loss += lp.aux_loss;
    total.z_loss += lp.z_loss;
    if (!stage_.last()) {
      const int next = stage_.stage + 1;
      rq.send_act[k] = pp_.isend(model_.stage_output(st.slot).data(), rq.n, DType::kF32, next,
                                 kActivationTag);
      rq.recv_grad[k] = pp_.irecv(dy_[k].data(), rq.n, DType::kF32, next, kGradientTag);
    }
    return;
  }
  if (stage_.first()) return;
  wait_if_set(rq.send_grad[k]);
  dx_send_[k].copy_from(model_.stage_input_grad());
  rq.send_grad[k] =
      pp_.isend(dx_send_[k].data(), rq.n, DType::kF32, stage_.stage - 1, kGradientTag);
  // The slot is free: its next micro-batch's activation may arrive.
  if (st.micro + slots_ < num_micro_)
    post_recv_act(pp_, model_, rq.recv_act, st.micro + slots_, slots_, stage_.stage - 1, rq.n);
}

model::LossParts PipelineRunner::run(const std::vector<model::Batch>& batches,
                                     const model::LossDenominators& d, float loss_scale) {
  PARM_CHECK(static_cast<int>(batches.size()) == num_micro_,
             "pipeline step of {} micro-batches, but the runner was built for {}",
             batches.size(), num_micro_);
  denominators_ = d;
  loss_scale_ = loss_scale;
  StepRequests rq;
  for (auto* list : {&rq.recv_act, &rq.recv_grad, &rq.send_act, &rq.send_grad})
    list->resize(static_cast<size_t>(slots_));
  rq.n = static_cast<size_t>(model_.stage_input(0).numel());
  recv_wait_us_ = 0.0;
  moe_comm_us_ = 0.0;
  overlapped_pieces_ = 0;
  if (!stage_.first())
    for (int i = 0; i < slots_; ++i)
      post_recv_act(pp_, model_, rq.recv_act, i, slots_, stage_.stage - 1, rq.n);

  model::LossParts total;
  for (const auto& group : groups_) {
    // Start the group's passes in order, then resume the stopped ones in turn, in that
    // order, until all have ended: a fixed order, the same on every rank of the stage.
    std::vector<const PipeStep*> stopped;
    for (int j : group) {
      const PipeStep& st = steps_[static_cast<size_t>(j)];
      overlapped_pieces_ += stopped.empty() ? 0 : 1;
      if (start(st, batches[static_cast<size_t>(st.micro)], rq))
        stopped.push_back(&st);
      else
        finish(st, rq, total);
    }
    while (!stopped.empty())
      for (size_t i = 0; i < stopped.size();) {
        overlapped_pieces_ += stopped.size() > 1 ? 1 : 0;
        if (model_.resume_stage(stopped[i]->slot)) {
          ++i;
          continue;
        }
        finish(*stopped[i], rq, total);
        stopped.erase(stopped.begin() + static_cast<std::ptrdiff_t>(i));
      }
  }
  std::vector<RequestPtr> pending;
  for (auto* list : {&rq.send_act, &rq.send_grad})
    for (auto& r : *list)
      if (r) pending.push_back(std::move(r));
  wait_all(pending);
  return total;
}

model::LossParts PipelineRunner::forward(const model::Batch& batch) {
  const auto n = static_cast<size_t>(model_.stage_input(0).numel());
  if (!stage_.first())
    pp_.recv(model_.stage_input(0).data(), n, DType::kF32, stage_.stage - 1, kActivationTag);
  const model::LossParts lp = model_.stage_forward(0, batch, {}, 0.0f, false);
  if (!stage_.last())
    pp_.send(model_.stage_output(0).data(), n, DType::kF32, stage_.stage + 1, kActivationTag);
  return lp;
}

}  // namespace parm::train
