#include "train/optimizer.h"

#include <cmath>
#include <cstring>

#include "model/dense_ops.h"
#include "parm/error.h"

namespace parm::train {

double lr_at(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const int64_t decay = std::max<int64_t>(1, c.total_steps - c.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - c.warmup_steps) / static_cast<double>(decay));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

namespace {

// The one device every tensor of `ts` lives on (the model allocates them all in one memory
// space); throws naming the first that is elsewhere.
template <typename Get>
Device common_device(const std::vector<model::Param*>& params, Get&& get, const char* what) {
  const Device d = params.empty() ? Device::kCpu : get(*params.front()).device();
  for (const auto* p : params)
    PARM_CHECK(get(*p).device() == d, "{} of {} is on {}, but {} of {} is on {}", what, p->name,
               device_name(get(*p).device()), what, params.front()->name, device_name(d));
  return d;
}

}  // namespace

void reduce_gradients(Topology& topo, const std::vector<model::Param*>& params, Tensor* scratch) {
  const Device d = common_device(params, [](const model::Param& p) -> const Tensor& { return p.grad; },
                                 "the gradient");
  const model::DenseOps& ops = model::dense_ops(d);
  Tensor local;
  Tensor& flat = scratch != nullptr ? *scratch : local;
  for (Group g : {Group::kDp, Group::kEdp, Group::kMp, Group::kEp, Group::kEsp, Group::kWorld}) {
    // Host gradients go over the host (MPI) communicator, device gradients over the group's
    // device communicator (NCCL, or MPI staged through host memory).
    Communicator& c = d == Device::kCpu ? topo.host_comm(g) : topo.comm(g);
    std::vector<model::Param*> mine;
    int64_t total = 0;
    for (auto* p : params)
      if (p->grad_reduce == g) {
        mine.push_back(p);
        total += p->grad.numel();
      }
    if (mine.empty() || c.size() == 1) continue;
    if (flat.numel() < total || flat.device() != d) flat = Tensor({total}, d);
    int64_t off = 0;
    for (auto* p : mine) {
      ops.copy(flat.data() + off, p->grad.data(), p->grad.numel());
      off += p->grad.numel();
    }
    c.allreduce(flat.data(), static_cast<size_t>(total));
    off = 0;
    for (auto* p : mine) {
      ops.copy(p->grad.data(), flat.data() + off, p->grad.numel());
      off += p->grad.numel();
    }
  }
}

double global_grad_norm(Topology& topo, const std::vector<model::Param*>& params) {
  const Device d = common_device(params, [](const model::Param& p) -> const Tensor& { return p.grad; },
                                 "the gradient");
  std::vector<const float*> bufs;
  std::vector<int64_t> sizes;
  for (auto* p : params) {
    if (!model::owns_copy(*p, topo)) continue;
    bufs.push_back(p->grad.data());
    sizes.push_back(p->grad.numel());
  }
  double sum = model::dense_ops(d).sum_of_squares(bufs.data(), sizes.data(),
                                                  static_cast<int64_t>(bufs.size()), 0.0);
  topo.host_comm(Group::kWorld).allreduce(&sum, 1);
  return std::sqrt(sum);
}

AdamW::AdamW(const std::vector<model::Param*>& params) : params_(params) {
  const Device d = common_device(params, [](const model::Param& p) -> const Tensor& { return p.value; },
                                 "the value");
  ops_ = &model::dense_ops(d);
  for (auto* p : params_) {
    m_.emplace_back(p->value.shape(), d);
    v_.emplace_back(p->value.shape(), d);
  }
}

void AdamW::step(const OptimConfig& c, double lr, double grad_scale) {
  ++t_;
  model::AdamWStep s;
  s.lr = lr;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.eps = c.eps;
  s.weight_decay = c.weight_decay;
  s.step = t_;
  s.grad_scale = grad_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    model::Param& p = *params_[i];
    s.decay = p.weight_decay;
    ops_->adamw(s, p.value.data(), p.grad.data(), m_[i].data(), v_[i].data(), p.value.numel());
  }
}

}  // namespace parm::train
