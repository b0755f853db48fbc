#include "moe/step_buffers.h"

#include "parm/error.h"
#include "shape/packed_rows.h"

namespace parm {

using schedule::Step;
using schedule::StepKind;

StepBuffers::StepBuffers(Topology& topo, const schedule::Schedule& sc, const MoeShape& shape)
    : topo_(topo), sc_(sc), model_dim_(shape.model_dim) {
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
    if (static_cast<int>(i) == stats && !sc.z_loss) {
      const int64_t n = schedule::stats_numel(E, false, shape.aux_sequences());
      values_.push_back(Tensor({n + 1}, device).slice_rows(0, n));
      grads_.push_back(Tensor({n + 1}, device).slice_rows(0, n));
    } else {
      const Shape held = b.max_routed_rows > 0 ? Shape{b.max_routed_rows, M} : b.shape;
      values_.emplace_back(held, device);
      grads_.emplace_back(held, device);
    }
    size_t own = i;
    while (sc.buffers[own].fills_like >= 0) own = static_cast<size_t>(sc.buffers[own].fills_like);
    own_fills_.push_back(own);
  }
  fills_.assign(sc.buffers.size(), {});
  starts_.assign(sc.buffers.size(), {});
}

Tensor& StepBuffers::pass(int id, bool backward) {
  if (!backward) return value(id);
  return id == schedule::kGateWeight ? dweights_call_ : grad(id);
}

const int64_t* StepBuffers::starts(int id) {
  if (!sc_.dropless) return nullptr;
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
    for (const Tensor& t : *list) b += t.bytes();
  return b;
}

}  // namespace parm
