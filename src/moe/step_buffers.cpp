#include "moe/step_buffers.h"

#include "parm/error.h"
#include "shape/packed_rows.h"

namespace parm {

using schedule::Step;
using schedule::StepKind;

std::vector<bool> recomputable_buffers(const schedule::Schedule& sc) {
  const size_t n = sc.buffers.size();
  std::vector<bool> by_compute(n, false), by_collective(n, false);
  for (const Step& s : sc.steps) {
    auto& mark = schedule::is_collective(s.kind) ? by_collective : by_compute;
    for (int id : {s.out, s.mid, s.joined_sum})
      if (id >= 0) mark[static_cast<size_t>(id)] = true;
  }
  std::vector<bool> out(n, false);
  for (size_t i = 0; i < n; ++i)
    out[i] = by_compute[i] && !by_collective[i] && static_cast<int>(i) != sc.input;
  return out;
}


StepBuffers::StepBuffers(Topology& topo, const schedule::Schedule& sc, const MoeShape& shape,
                         moe::ActivationPool* pool, const std::vector<bool>& pooled_values)
    : topo_(topo), sc_(sc), model_dim_(shape.model_dim), pool_(pool) {
  PARM_CHECK(pool == nullptr || pooled_values.size() == sc.buffers.size(),
             "step buffers: {} pooled flags for {} buffers", pooled_values.size(),
             sc.buffers.size());
  const Device device = topo.device();
  const int64_t M = shape.model_dim, E = shape.experts;
  // The gate weight's gradient, then the shared gate's (Schedule::gate_weight_numel).
  PARM_CHECK(sc.gate_weight_numel >= M * E, "gate weight of {} values for M {} x E {}",
             sc.gate_weight_numel, M, E);
  dweights_call_ = Tensor({sc.gate_weight_numel}, device);
  dwg_call_ = Tensor::view(dweights_call_.data(), {M, E}, device);
  dsg_call_ = Tensor::view(dweights_call_.data() + M * E, {sc.gate_weight_numel - M * E},
                           device);
  // The backends write the statistics as 2E x sets + 1 values (the z-loss sum last) and their
  // gradient likewise: without the z-loss the step buffer is a view of all but the last.
  int stats = -1;
  for (const Step& s : sc.steps)
    if (s.kind == StepKind::kGate) stats = s.out;
  for (size_t i = 0; i < sc.buffers.size(); ++i) {
    const schedule::BufferSpec& b = sc.buffers[i];
    const bool short_stats = static_cast<int>(i) == stats && !sc.z_loss;
    const int64_t n = schedule::stats_numel(E, false, shape.aux_sequences());
    // The stats are allocated 2E x sets + 1 long, seen one shorter.
    const Shape held = short_stats               ? Shape{n + 1}
                       : b.max_routed_rows > 0   ? Shape{b.max_routed_rows, M}
                                                 : b.shape;
    held_.push_back(held);
    seen_.push_back(short_stats ? n : -1);
    for (const bool grad : {false, true}) {
      auto& list = grad ? grads_ : values_;
      if (pool_ != nullptr && (grad || pooled_values[i])) {
        pool_->require(moe::ActivationPool::buffer_key(static_cast<int>(i), grad),
                       shape_numel(held));
        list.emplace_back();  // bind() points it at the pool
        pooled_.push_back({i, grad});
        continue;
      }
      Tensor t(held, device);
      list.push_back(short_stats ? t.slice_rows(0, n) : t);
    }
    size_t own = i;
    while (sc.buffers[own].fills_like >= 0) own = static_cast<size_t>(sc.buffers[own].fills_like);
    own_fills_.push_back(own);
  }
  fills_.assign(sc.buffers.size(), {});
  starts_.assign(sc.buffers.size(), {});
}

void StepBuffers::bind() {
  if (pool_ == nullptr || bound_lane_ == pool_->lane()) return;
  for (const auto& [i, grad] : pooled_) {
    Tensor t = Tensor::view(pool_->data(moe::ActivationPool::buffer_key(static_cast<int>(i), grad)),
                            held_[i], topo_.device());
    (grad ? grads_ : values_)[i] = seen_[i] >= 0 ? t.slice_rows(0, seen_[i]) : t;
  }
  bound_lane_ = pool_->lane();
}

int64_t StepBuffers::pass_numel(int id, bool backward) const {
  if (backward && id == schedule::kGateWeight) return dweights_call_.numel();
  const auto i = static_cast<size_t>(id);
  return seen_[i] >= 0 ? seen_[i] : shape_numel(held_[i]);
}

Tensor& StepBuffers::pass(int id, bool backward) {
  if (!backward) return value(id);
  return id == schedule::kGateWeight ? dweights_call_ : grad(id);
}

const int64_t* StepBuffers::starts(int id) {
  if (!sc_.packed) return nullptr;
  const auto& spec = sc_.buffers[static_cast<size_t>(id)];
  const auto& f = fills(id);
  auto& first = starts_[static_cast<size_t>(id)];
  first.resize(f.size());  // E or blocks x E_loc: no allocation after the first pass
  const int64_t rows = packed_starts(f.data(), static_cast<int64_t>(f.size()), first.data());
  PARM_CHECK(rows <= spec.max_routed_rows,
             "buffer {}: its {} segments hold {} routed rows, more than the {} it is sized "
             "for (routing counts past the bound of docs/dropless.md)",
             spec.name, f.size(), rows, spec.max_routed_rows);
  return first.data();
}

void StepBuffers::post_fills(Group g, bool gather, const std::vector<int32_t>& in,
                             std::vector<int32_t>& out) {
  Communicator& c = topo_.host_comm(g);  // the counts are host memory on every device
  const size_t n = in.size(), size = static_cast<size_t>(c.size());
  PARM_CHECK(n > 0, "fill counts to exchange over {} are missing", c.name());
  if (gather) {
    out.resize(n * size);
    meta_.post_allgather(c, in.data(), out.data(), n);
  } else {
    out.resize(n);
    meta_.post_alltoall(c, in.data(), out.data(), n / size);
  }
}

int64_t StepBuffers::held_bytes() const {
  int64_t b = dweights_call_.bytes();
  for (const auto* list : {&values_, &grads_})
    for (const Tensor& t : *list)
      if (t.owns()) b += t.bytes();  // not the pool's views
  return b;
}

}  // namespace parm
