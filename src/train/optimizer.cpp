#include "train/optimizer.h"

#include <cmath>
#include <cstring>

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

void reduce_gradients(Topology& topo, const std::vector<model::Param*>& params) {
  for (Group g : {Group::kDp, Group::kEdp, Group::kMp, Group::kEp, Group::kEsp, Group::kWorld}) {
    // The gradients are host tensors (a cuda run stages the layer's through host memory):
    // the host communicator, whatever moves device buffers.
    Communicator& c = topo.host_comm(g);
    std::vector<model::Param*> mine;
    int64_t total = 0;
    for (auto* p : params)
      if (p->grad_reduce == g) {
        mine.push_back(p);
        total += p->grad.numel();
      }
    if (mine.empty() || c.size() == 1) continue;
    std::vector<float> flat(static_cast<size_t>(total));
    int64_t off = 0;
    for (auto* p : mine) {
      std::memcpy(flat.data() + off, p->grad.data(), static_cast<size_t>(p->grad.bytes()));
      off += p->grad.numel();
    }
    c.allreduce(flat.data(), flat.size());
    off = 0;
    for (auto* p : mine) {
      std::memcpy(p->grad.data(), flat.data() + off, static_cast<size_t>(p->grad.bytes()));
      off += p->grad.numel();
    }
  }
}

double global_grad_norm(Topology& topo, const std::vector<model::Param*>& params) {
  double sum = 0.0;
  for (auto* p : params) {
    if (!model::owns_copy(*p, topo)) continue;
    const float* g = p->grad.data();
    for (int64_t i = 0; i < p->grad.numel(); ++i) sum += static_cast<double>(g[i]) * g[i];
  }
  topo.host_comm(Group::kWorld).allreduce(&sum, 1);
  return std::sqrt(sum);
}

AdamW::AdamW(const std::vector<model::Param*>& params) : params_(params) {
  for (auto* p : params_) {
    m_.emplace_back(p->value.shape());
    v_.emplace_back(p->value.shape());
  }
}

void AdamW::step(const OptimConfig& c, double lr, double grad_scale) {
  ++t_;
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t_));
  const float b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const float scale = static_cast<float>(grad_scale);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(c.eps);
  for (size_t i = 0; i < params_.size(); ++i) {
    model::Param& p = *params_[i];
    float* w = p.value.data();
    const float* g = p.grad.data();
    float* m = m_[i].data();
    float* v = v_[i].data();
    const float decay = p.weight_decay ? static_cast<float>(1.0 - lr * c.weight_decay) : 1.0f;
    for (int64_t j = 0; j < p.value.numel(); ++j) {
      const float gj = g[j] * scale;
      m[j] = b1 * m[j] + (1.0f - b1) * gj;
      v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
      w[j] = w[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_bc2 + eps);
    }
  }
}

}  // namespace parm::train
