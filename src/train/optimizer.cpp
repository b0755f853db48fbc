#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "model/dense_ops.h"
#include "parm/error.h"
#include "parm/memory.h"

namespace parm::train {

OptimizerSharding parse_optimizer_sharding(const std::string& s, const std::string& what) {
  if (s == "none") return OptimizerSharding::kNone;
  if (s == "dp") return OptimizerSharding::kDp;
  throw InvalidConfig(fmt::format("{} '{}' is not valid; use none (every rank keeps the whole "
                                  "AdamW state) or dp (sharded over dp and edp)",
                                  what, s));
}

const char* optimizer_sharding_name(OptimizerSharding s) {
  return s == OptimizerSharding::kDp ? "dp" : "none";
}

double lr_at(const OptimConfig& c, int64_t step) {
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const int64_t decay = std::max<int64_t>(1, c.total_steps - c.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - c.warmup_steps) / static_cast<double>(decay));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

int64_t OptimizerMemory::moment_bytes_of(Group g) const {
  int64_t n = 0;
  for (const Part& p : groups)
    if (p.group == g) n += p.moment_bytes;
  return n;
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

Device grad_device(const std::vector<model::Param*>& params) {
  return common_device(params, [](const model::Param& p) -> const Tensor& { return p.grad; },
                       "the gradient");
}

// g's reduced shard (`shard`) all-gathered through `flat` into every gradient of g.
void gather_gradients(Topology& topo, const model::DenseOps& ops, const FlatGroup& g,
                      const Tensor& shard, Tensor& flat) {
  group_comm(topo, g.group, ops.device)
      .allgather(shard.data(), flat.data(), static_cast<size_t>(g.shard));
  for_each_piece(g, 0, g.total, [&](size_t i, int64_t to, int64_t at, int64_t n) {
    ops.copy(g.params[i]->grad.data() + to, flat.data() + at, n);
  });
}

}  // namespace

void reduce_gradients(Topology& topo, const std::vector<model::Param*>& params, Tensor* scratch) {
  const Device d = grad_device(params);
  const model::DenseOps& ops = model::dense_ops(d);
  const std::vector<FlatGroup> groups = flat_groups(&topo, params);
  Tensor local, shard;
  Tensor& flat = scratch != nullptr ? *scratch : local;
  for (const FlatGroup& g : groups) {
    if (g.num_shards == 1) continue;
    if (shard.numel() < g.shard) shard = Tensor({g.shard}, d);
    reduce_scatter_gradients(topo, ops, g, flat, shard);
    gather_gradients(topo, ops, g, shard, flat);
  }
}

double global_grad_norm(Topology& topo, const std::vector<model::Param*>& params) {
  const model::DenseOps& ops = model::dense_ops(grad_device(params));
  double sum = 0.0;
  for (const FlatGroup& g : flat_groups(&topo, params))
    sum += shard_sum_of_squares(&topo, ops, g, [&](size_t i, int64_t j) -> const float* {
      return g.params[i]->grad.data() + (j - g.offsets[i]);
    });
  return std::sqrt(world_sum_in_rank_order(&topo, sum));
}

// ---- AdamW ------------------------------------------------------------------------------

const float* AdamW::State::grad_at(size_t i, int64_t j) const {
  return from_shard ? grad_shard.data() + (j - layout.shard_begin())
                    : layout.params[i]->grad.data() + (j - layout.offsets[i]);
}

AdamW::AdamW(const std::vector<model::Param*>& params)
    : AdamW(nullptr, params, OptimizerSharding::kNone) {}

AdamW::AdamW(Topology& topo, const std::vector<model::Param*>& params, OptimizerSharding sharding)
    : AdamW(&topo, params, sharding) {}

AdamW::AdamW(Topology* topo, const std::vector<model::Param*>& params, OptimizerSharding sharding)
    : topo_(topo), params_(params), sharding_(sharding) {
  const Device d = common_device(
      params, [](const model::Param& p) -> const Tensor& { return p.value; }, "the value");
  grad_device(params);
  for (const model::Param* p : params)
    PARM_CHECK(p->grad.numel() == p->value.numel(), "parameter {} has {} values but {} gradients",
               p->name, p->value.numel(), p->grad.numel());
  ops_ = &model::dense_ops(d);
  const std::vector<FlatGroup> groups = flat_groups(topo, params);
  const bool sharded = sharding == OptimizerSharding::kDp;
  for (const FlatGroup& g : groups) {
    State s;
    s.layout = g;
    s.from_shard = sharded && g.num_shards > 1;
    s.begin = s.from_shard ? g.shard_begin() : 0;
    s.end = s.from_shard ? g.shard_end() : g.total;
    const int64_t n = s.from_shard ? g.shard : g.total;
    s.m = Tensor({n}, d);
    s.v = Tensor({n}, d);
    if (s.from_shard) {  // the reduced gradients' shard: gradients, not optimizer state
      MemoryKindScope kind(MemoryKind::kGradients);
      s.grad_shard = Tensor({g.shard}, d);
    }
    states_.push_back(std::move(s));
  }
  for (const model::Param* p : params_) {
    bool found = false;
    for (size_t a = 0; a < states_.size() && !found; ++a) {
      const auto& ps = states_[a].layout.params;
      const auto it = std::find(ps.begin(), ps.end(), p);
      if (it == ps.end()) continue;
      where_.emplace_back(a, static_cast<size_t>(it - ps.begin()));
      found = true;
    }
    PARM_CHECK(found, "parameter {} is in no reduction group", p->name);
  }
}

void AdamW::reduce_gradients() {
  for (State& s : states_) {
    const FlatGroup& g = s.layout;
    if (g.num_shards == 1) continue;
    if (s.from_shard) {
      reduce_scatter_gradients(*topo_, *ops_, g, flat_, s.grad_shard);
      continue;
    }
    if (shard_.numel() < g.shard) shard_ = Tensor({g.shard}, ops_->device);
    reduce_scatter_gradients(*topo_, *ops_, g, flat_, shard_);
    gather_gradients(*topo_, *ops_, g, shard_, flat_);
  }
}

double AdamW::grad_norm() {
  double sum = 0.0;
  for (const State& s : states_)
    sum += shard_sum_of_squares(topo_, *ops_, s.layout,
                                [&](size_t i, int64_t j) { return s.grad_at(i, j); });
  return std::sqrt(world_sum_in_rank_order(topo_, sum));
}

void AdamW::step(const OptimConfig& c, double lr, double grad_scale) {
  ++t_;
  model::AdamWStep st;
  st.lr = lr;
  st.beta1 = c.beta1;
  st.beta2 = c.beta2;
  st.eps = c.eps;
  st.weight_decay = c.weight_decay;
  st.step = t_;
  st.grad_scale = grad_scale;
  // Element by element: the same bits however the elements are cut into calls.
  for (State& s : states_)
    for_each_piece(s.layout, s.begin, s.end, [&](size_t i, int64_t at, int64_t j, int64_t n) {
      model::Param& p = *s.layout.params[i];
      st.decay = p.weight_decay;
      ops_->adamw(st, p.value.data() + at, s.grad_at(i, j), s.m.data() + (j - s.begin),
                  s.v.data() + (j - s.begin), n);
    });
}

void AdamW::gather_parameters() {
  for (State& s : states_) {
    if (!s.from_shard) continue;
    const FlatGroup& g = s.layout;
    // The reduced gradients are spent: their buffer carries the updated shard (its padding
    // stays the reduction's zeros).
    for_each_piece(g, s.begin, s.end, [&](size_t i, int64_t at, int64_t j, int64_t n) {
      ops_->copy(s.grad_shard.data() + (j - s.begin), g.params[i]->value.data() + at, n);
    });
    if (flat_.numel() < g.padded()) flat_ = Tensor({g.padded()}, ops_->device);
    group_comm(*topo_, g.group, ops_->device)
        .allgather(s.grad_shard.data(), flat_.data(), static_cast<size_t>(g.shard));
    for_each_piece(g, 0, g.total, [&](size_t i, int64_t at, int64_t j, int64_t n) {
      ops_->copy(g.params[i]->value.data() + at, flat_.data() + j, n);
    });
  }
}

Moments AdamW::gather_moments() {
  Moments out;
  std::vector<Tensor> whole_m, whole_v;  // per state: the flat moments of the whole group
  for (State& s : states_) {
    if (!s.from_shard) {
      whole_m.push_back(s.m);
      whole_v.push_back(s.v);
      continue;
    }
    const FlatGroup& g = s.layout;
    Communicator& c = group_comm(*topo_, g.group, ops_->device);
    Tensor m({g.padded()}, ops_->device), v({g.padded()}, ops_->device);
    c.allgather(s.m.data(), m.data(), static_cast<size_t>(g.shard));
    c.allgather(s.v.data(), v.data(), static_cast<size_t>(g.shard));
    whole_m.push_back(std::move(m));
    whole_v.push_back(std::move(v));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [a, i] = where_[k];
    const int64_t at = states_[a].layout.offsets[i];
    const model::Param& p = *params_[k];
    out.m.emplace_back(p.value.shape(), ops_->device);
    out.v.emplace_back(p.value.shape(), ops_->device);
    ops_->copy(out.m.back().data(), whole_m[a].data() + at, p.value.numel());
    ops_->copy(out.v.back().data(), whole_v[a].data() + at, p.value.numel());
  }
  return out;
}

void AdamW::scatter_moments(const Moments& whole) {
  PARM_CHECK(whole.m.size() == params_.size() && whole.v.size() == params_.size(),
             "moments of {} and {} parameters for an optimizer of {}", whole.m.size(),
             whole.v.size(), params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto [a, i] = where_[k];
    State& s = states_[a];
    const model::Param& p = *params_[k];
    PARM_CHECK(whole.m[k].numel() == p.value.numel() && whole.v[k].numel() == p.value.numel(),
               "moments of {} elements for parameter {} of {}", whole.m[k].numel(), p.name,
               p.value.numel());
    const Tensor m = whole.m[k].device() == ops_->device ? whole.m[k] : whole.m[k].to(ops_->device);
    const Tensor v = whole.v[k].device() == ops_->device ? whole.v[k] : whole.v[k].to(ops_->device);
    const int64_t lo = std::max(s.begin, s.layout.offsets[i]);
    const int64_t hi = std::min(s.end, s.layout.offsets[i] + p.value.numel());
    if (lo >= hi) continue;
    const int64_t from = lo - s.layout.offsets[i];
    ops_->copy(s.m.data() + (lo - s.begin), m.data() + from, hi - lo);
    ops_->copy(s.v.data() + (lo - s.begin), v.data() + from, hi - lo);
  }
}

OptimizerMemory AdamW::memory() const {
  OptimizerMemory r;
  for (const State& s : states_) {
    OptimizerMemory::Part part;
    part.group = s.layout.group;
    part.num_shards = s.from_shard ? s.layout.num_shards : 1;
    part.num_elements = s.layout.total;
    part.moment_bytes = s.m.bytes() + s.v.bytes();
    r.moment_bytes += part.moment_bytes;
    r.buffer_bytes += s.grad_shard.bytes();
    r.groups.push_back(part);
  }
  for (const model::Param* p : params_) r.grad_bytes += p->grad.bytes();
  r.buffer_bytes += flat_.bytes() + shard_.bytes();
  return r;
}

}  // namespace parm::train
