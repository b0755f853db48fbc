// AdamW, the learning-rate schedule, and the gradient reduction and global norm across a
// hybrid-parallel layout.
#pragma once

#include <cstdint>
#include <vector>

#include "model/dense_ops.h"
#include "model/param.h"

namespace parm::train {

struct OptimConfig {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 10;
  int64_t total_steps = 100;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

// Linear warmup from lr / warmup_steps to lr, then cosine decay to min_lr at total_steps.
// `step` counts from 0.
double lr_at(const OptimConfig& c, int64_t step);

// Sums every gradient over its Param::grad_reduce group (dp for dense, edp for experts), in
// one flat all-reduce per group: host gradients on the group's host communicator, device
// gradients in device memory on its device communicator (topo.comm). Every gradient lives on
// one device (else parm::Error). `scratch` (may be null): the flat buffer, kept by the caller
// so that a step allocates nothing; grown (reallocated) when too small.
void reduce_gradients(Topology& topo, const std::vector<model::Param*>& params,
                      Tensor* scratch = nullptr);

// sqrt of the sum of squares of every distinct parameter element's gradient: each rank counts
// only the copies it owns (model/param.h), on the gradients' device, then one all-reduce of
// that one number over the world (host).
double global_grad_norm(Topology& topo, const std::vector<model::Param*>& params);

// The moments live where the parameters do; the update runs there (model/dense_ops.h).
class AdamW {
 public:
  explicit AdamW(const std::vector<model::Param*>& params);

  // One update with learning rate lr, gradients multiplied by grad_scale (clipping).
  void step(const OptimConfig& c, double lr, double grad_scale);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // First and second moments, one per parameter, shaped like Param::value.
  std::vector<Tensor>& first_moments() { return m_; }
  std::vector<Tensor>& second_moments() { return v_; }

 private:
  std::vector<model::Param*> params_;
  const model::DenseOps* ops_ = nullptr;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

}  // namespace parm::train
