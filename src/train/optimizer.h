// AdamW, the learning-rate schedule, and the gradient reduction and global norm across a
// hybrid-parallel layout, with the optimizer state whole on every rank or sharded over dp and
// edp (Megatron's distributed optimizer; docs/optimizer.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/dense_ops.h"
#include "model/param.h"
#include "train/flat_groups.h"

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
  std::string sharding = "none";  // none | dp (OptimizerSharding)
};

// Where the AdamW state lives. kNone: every rank keeps the moments of every parameter it
// trains. kDp: each rank keeps those of its shard of each reduction group's flat buffer
// (1/dp of the dense parameters, 1/edp of its expert shards), the gradients are
// reduce-scattered instead of all-reduced, and the updated shards are all-gathered.
enum class OptimizerSharding { kNone, kDp };
// "none" or "dp"; anything else: InvalidConfig naming `what` and the valid values.
OptimizerSharding parse_optimizer_sharding(const std::string& s,
                                           const std::string& what = "optim.sharding");
const char* optimizer_sharding_name(OptimizerSharding s);

// Linear warmup from lr / warmup_steps to lr, then cosine decay to min_lr at total_steps.
// `step` counts from 0.
double lr_at(const OptimConfig& c, int64_t step);

// Sums every gradient over its Param::grad_reduce group (dp for dense, edp for experts), in
// group-rank order: per group one reduce-scatter of the flat gradients, then an all-gather
// back. Host gradients on the group's host communicator, device gradients in device memory on
// its device communicator (topo.comm). Every gradient lives on one device (else parm::Error).
// `scratch` (may be null): the flat buffer, kept by the caller so that a step allocates
// nothing; grown (reallocated) when too small. Overwrites every gradient.
void reduce_gradients(Topology& topo, const std::vector<model::Param*>& params,
                      Tensor* scratch = nullptr);

// sqrt of the sum of squares of every distinct parameter element's gradient, after
// reduce_gradients: each rank sums the squares of its shard of each group's flat gradients
// (train/flat_groups.h), of the parameters whose copy it counts, on the gradients' device;
// the ranks' sums are added in world-rank order (host). The same bits as AdamW::grad_norm.
double global_grad_norm(Topology& topo, const std::vector<model::Param*>& params);

// Bytes of training state one rank holds (AdamW::memory): what the memory report counts.
struct OptimizerMemory {
  struct Part {
    Group group;
    int num_shards = 1;          // ranks the group's state is cut over (1 under kNone)
    int64_t num_elements = 0;    // this rank's parameters reduced over the group
    int64_t moment_bytes = 0;    // AdamW's m and v of them held here
  };
  std::vector<Part> groups;    // in flat_groups order
  int64_t moment_bytes = 0;      // m and v: every group's
  // An fp32 master copy beside a lower-precision compute copy: none here, the parameters
  // are fp32 under every --precision (bf16 copies are rounded from them per step).
  int64_t master_bytes = 0;
  int64_t grad_bytes = 0;        // the parameters' gradients (Param::grad)
  int64_t buffer_bytes = 0;      // the reduction's flat and shard buffers
  int64_t state_bytes() const { return moment_bytes + master_bytes; }
  int64_t moment_bytes_of(Group g) const;  // 0 when no parameter reduces over g
};

// The AdamW moments of every parameter as a rank holds the parameter (shaped like
// Param::value, in the optimizer's parameter order): what checkpoints save and load.
struct Moments {
  std::vector<Tensor> m, v;
};

// The moments live where the parameters do; the update runs there (model/dense_ops.h).
// A step: reduce_gradients(), grad_norm(), step(), gather_parameters(). Every call but
// step() is collective over the parameters' reduction groups (grad_norm: the world).
class AdamW {
 public:
  AdamW(Topology& topo, const std::vector<model::Param*>& params,
        OptimizerSharding sharding = OptimizerSharding::kNone);
  // One process, no topology: every group one rank, nothing sharded, no communication.
  explicit AdamW(const std::vector<model::Param*>& params);

  OptimizerSharding sharding() const { return sharding_; }
  // Sums the gradients over their groups in group-rank order (a reduce-scatter per group);
  // kNone then all-gathers them back into every Param::grad, kDp keeps this rank's shard.
  void reduce_gradients();
  // The global gradient norm of the reduced gradients (global_grad_norm's sum, the same
  // bits under both shardings).
  double grad_norm();
  // One update with learning rate lr, gradients multiplied by grad_scale (clipping): of
  // every parameter (kNone, from Param::grad) or of this rank's shard of each group (kDp,
  // from the reduced shard; the other parameters' elements are left as they were).
  void step(const OptimConfig& c, double lr, double grad_scale);
  // kDp: all-gathers the updated shards into every parameter. kNone: nothing.
  void gather_parameters();

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // The whole moments (collective over each group under kDp: an all-gather).
  Moments gather_moments();
  // Sets the moments from whole ones (each rank keeps its shard; no communication). Each
  // tensor shaped like its parameter's value, on any device.
  void scatter_moments(const Moments& whole);
  OptimizerMemory memory() const;

 private:
  struct State {
    FlatGroup layout;
    int64_t begin = 0, end = 0;  // the flat range this rank updates
    // kDp over a group of more than one rank: the update reads the reduced shard (else
    // Param::grad, reduced whole).
    bool from_shard = false;
    Tensor m, v;                 // kNone: total elements; kDp: shard (the padding included)
    Tensor grad_shard;           // from_shard: the reduced gradients of the shard
    // The reduced gradient of layout.params[i] at flat element j.
    const float* grad_at(size_t i, int64_t j) const;
  };
  AdamW(Topology* topo, const std::vector<model::Param*>& params, OptimizerSharding sharding);

  Topology* topo_;  // null: one process
  std::vector<model::Param*> params_;
  OptimizerSharding sharding_;
  const model::DenseOps* ops_ = nullptr;
  std::vector<State> states_;
  std::vector<std::pair<size_t, size_t>> where_;  // params_[i] is states_[a].layout.params[b]
  Tensor flat_, shard_;  // scratch: a group's padded flat buffer; kNone's reduced shard
  int64_t t_ = 0;
};

}  // namespace parm::train
