// Trainer's step: the passes, the gradients' reduction, norm and update, and the step's
// metrics (train/trainer.h).
#include <algorithm>

#include "core/fault.h"
#include "moe/load_balance.h"
#include "parm/timer.h"
#include "train/pipeline_schedule.h"
#include "train/trainer.h"

namespace parm::train {

Trainer::Passes Trainer::forward_backward(double lm_targets) {
  const int dp = topo_->layout().dp, dp_rank = topo_->host_comm(Group::kDp).rank();
  // Each MoE layer gates once per MP group and micro-batch: dp x accum calls in the step.
  const model::LossDenominators d{lm_targets, static_cast<double>(dp * accum_)};
  std::vector<model::Batch> batches;
  for (int64_t a = 0; a < accum_; ++a) {
    const int64_t j = a * dp + dp_rank;
    batches.push_back(source_.train_batch(data_position_ + j * micro_, micro_));
  }
  Passes p;
  if (pipeline_) {
    // The stage's time not spent waiting for its neighbours counts as compute.
    const double t0 = now_us();
    const auto parts = pipeline_->run(batches, d, 1.0f);
    p.bubble_us = pipeline_->last_recv_wait_us();
    p.sums[0] = parts.lm_loss_sum;
    p.sums[1] = parts.aux_loss;
    p.sums[2] = parts.z_loss;
    p.comm_us += p.bubble_us;
    p.compute_us += now_us() - t0 - p.bubble_us;
    topo_->host_comm(Group::kPp).allreduce(p.sums, 3);  // lm: the last stage's; aux: every stage's
  } else {
    for (const auto& b : batches) {
      const auto parts = model_->forward_backward(b, d, 1.0f);
      p.sums[0] += parts.lm_loss_sum;
      p.sums[1] += parts.aux_loss;
      p.sums[2] += parts.z_loss;
      p.comm_us += model_->last_comm_us();
      p.compute_us += model_->last_compute_us();
    }
  }
  return p;
}

double Trainer::evaluate() {
  const int dp = topo_->layout().dp, dp_rank = topo_->host_comm(Group::kDp).rank();
  double sums[2] = {0.0, 0.0};  // lm loss sum, targets
  for (int64_t i = 0; i < cfg_.loop.eval_batches; ++i) {
    const model::Batch b = source_.val_batch(i * dp + dp_rank, micro_);
    const auto parts = pipeline_ ? pipeline_->forward(b) : model_->forward(b);
    sums[0] += parts.lm_loss_sum;
    sums[1] += static_cast<double>(parts.num_targets);
  }
  if (pipeline_) topo_->host_comm(Group::kPp).allreduce(sums, 2);  // the last stage's
  topo_->host_comm(Group::kDp).allreduce(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

StepMetrics Trainer::step() {
  fault::at_training_step(topo_->world_rank(), step_);
  const Layout& lay = topo_->layout();
  const double t0 = now_us();
  for (auto* p : params_) p->grad.zero();
  phases_.clear();
  model_->set_weights_version(weights_version_);
  // The global batch's targets, counted here rather than summed over dp (one collective
  // less per step): the step's micro-batches are sequences [data_position_, + global_batch_).
  const double num_targets =
      static_cast<double>(source_.train_targets(data_position_, global_batch_));
  Passes passes = forward_backward(std::max(1.0, num_targets));

  // The step's tail, each part timed apart (after the device has finished it) and with
  // --phase-times also a phase.
  double t = now_us();  // the model's last phase waited for the device
  const auto lap = [&](const char* name) {
    if (topo_->device() != Device::kCpu) device_sync();
    const double now = now_us(), dt = now - t;
    if (cfg_.loop.phase_times) phases_.add(name, dt);
    t = now;
    return dt;
  };
  model_->sum_tied_grads();
  opt_.reduce_gradients();
  passes.comm_us += lap("grad-reduce");
  const double norm = opt_.grad_norm();
  const double grad_norm_us = lap("grad-norm");
  const double clip =
      optim_.grad_clip > 0 && norm > optim_.grad_clip ? optim_.grad_clip / (norm + 1e-6) : 1.0;
  const double lr = lr_at(optim_, step_);
  opt_.step(optim_, lr, clip);
  const double optimizer_us = lap("optimizer");
  if (opt_.sharding() == OptimizerSharding::kDp) {
    opt_.gather_parameters();
    passes.comm_us += lap("param-gather");
  }
  ++weights_version_;
  model_->set_weights_version(weights_version_);
  StepMetrics m;
  m.phases = phases_;

  // The expert loads of the step's last micro-batch, per MoE layer (collective): measured
  // once, here for the router bias (DeepSeek-V3's update, from them) or below for the report,
  // which shares them.
  const bool report = report_step(step_ + 1);
  const auto moe_layers = model_->moe_layers();
  layer_loads_.resize(moe_layers.size());
  const auto measure_loads = [&] {
    for (size_t i = 0; i < moe_layers.size(); ++i)
      layer_loads_[i] = expert_loads(*topo_, *moe_layers[i]);
  };
  const bool bias_update = cfg_.model.router_bias_update > 0;
  if (bias_update) {
    measure_loads();
    for (size_t i = 0; i < moe_layers.size(); ++i)
      update_router_bias(*moe_layers[i], layer_loads_[i], cfg_.model.router_bias_update);
    passes.comm_us += now_us() - t;
  }
  data_position_ += global_batch_;
  topo_->host_comm(Group::kDp).allreduce(passes.sums, 3);
  const double step_us = now_us() - t0;

  const double batches = static_cast<double>(accum_ * lay.dp);
  m.step = step_ + 1;
  m.loss = passes.sums[0] / std::max(1.0, num_targets);
  m.aux_loss = passes.sums[1] / batches;
  m.z_loss = passes.sums[2] / batches;
  m.lr = lr;
  m.grad_norm = norm;
  double times[5] = {step_us, passes.comm_us, passes.compute_us, grad_norm_us, optimizer_us};
  world_.allreduce(times, 5, ReduceOp::kMax);
  m.step_ms = times[0] / 1e3;
  m.comm_ms = times[1] / 1e3;
  m.compute_ms = times[2] / 1e3;
  m.grad_norm_ms = times[3] / 1e3;
  m.optimizer_ms = times[4] / 1e3;
  m.mem_peak_bytes = max_memory_peaks(world_, topo_->device());
  if (pipeline_) {
    // The mean over ranks of the share of the step each spent waiting on pp.recv.
    double share = passes.bubble_us / step_us;
    double moe_us = pipeline_->last_moe_comm_us();
    world_.allreduce(&share, 1);
    world_.allreduce(&moe_us, 1);
    m.bubble = share / lay.world;
    m.bubble_1f1b = one_f_one_b_bubble(lay.pp, static_cast<int>(accum_));
    m.moe_comm_ms = moe_us / lay.world / 1e3;
  }
  m.tokens_per_s = static_cast<double>(tokens_per_step_) / (times[0] / 1e6);
  m.mfu = total_flops_ / (times[0] / 1e6) / (result_.gemm_gflops * 1e9 * lay.world);
  if (report) {
    // The worst MoE layer's, over every stage (collective: every rank, before evaluation
    // routes other tokens).
    if (!bias_update) measure_loads();
    double worst[2] = {0.0, 0.0};
    for (size_t i = 0; i < moe_layers.size(); ++i) {
      const LoadImbalance li = load_imbalance(*topo_, *moe_layers[i], layer_loads_[i]);
      worst[0] = std::max(worst[0], li.expert_max_over_mean);
      worst[1] = std::max(worst[1], li.rank_max_over_mean);
    }
    world_.allreduce(worst, 2, ReduceOp::kMax);
    m.load_expert_max_over_mean = worst[0];
    m.load_rank_max_over_mean = worst[1];
  }
  const bool last = step_ + 1 == cfg_.loop.steps;
  if ((cfg_.loop.eval_every > 0 && (step_ + 1) % cfg_.loop.eval_every == 0) || last)
    m.val_loss = evaluate();
  ++step_;
  return m;
}

}  // namespace parm::train
