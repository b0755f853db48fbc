#include "moe/layer_memory.h"

#include "moe/activation_pool.h"
#include "moe/step_buffers.h"
#include "parm/tensor.h"

namespace parm::moe {

LayerMemory plan_layer_memory(const schedule::Schedule& sc, const MoeShape& shape,
                              const Layout& layout, Precision precision, bool pool_rows,
                              bool pool_buffers) {
  constexpr int64_t kF = sizeof(float);
  const int64_t M = shape.model_dim, E = shape.experts;
  const int64_t e_loc = E / layout.ep, hl = shape.hidden / layout.esp;
  const bool biases = has_expert_biases(shape.expert_mlp), gated = is_gated(shape.expert_mlp);
  LayerMemory m;
  // Parameters (moe_layer.cpp's make_params).
  const auto ffns = [&](int64_t n, int64_t h) {
    return n * (M * h * (gated ? 3 : 2) + (biases ? h + M : 0));
  };
  const int64_t hs = shape.has_shared() ? shape.shared_hidden / layout.mp : 0;
  m.routed_parameters = kF * ffns(e_loc, hl);
  m.parameters = m.routed_parameters +
                 kF * (M * E + ffns(shape.shared_experts, hs) + (shape.shared_gate ? M : 0));
  const auto pool = [&](int key, int64_t floats) {
    if (m.pooled.size() <= static_cast<size_t>(key))
      m.pooled.resize(static_cast<size_t>(key) + 1, 0);
    m.pooled[static_cast<size_t>(key)] = kF * floats;
  };
  // Step buffers and their gradients (moe/step_buffers.cpp), the gate-weight gradient.
  int64_t acts = sc.gate_weight_numel;
  int stats = -1;
  for (const schedule::Step& s : sc.steps)
    if (s.kind == schedule::StepKind::kGate) stats = s.out;
  const std::vector<bool> pooled =
      pool_buffers ? parm::recomputable_buffers(sc) : std::vector<bool>(sc.buffers.size(), false);
  for (size_t i = 0; i < sc.buffers.size(); ++i) {
    const schedule::BufferSpec& b = sc.buffers[i];
    // The statistics: 2E + 1 allocated (2E seen) without the z-loss.
    const int64_t n = static_cast<int>(i) == stats && !sc.z_loss
                          ? schedule::stats_numel(E, true)
                          : (b.max_routed_rows > 0 ? b.max_routed_rows * M : shape_numel(b.shape));
    const int id = static_cast<int>(i);
    if (pooled[i])
      pool(ActivationPool::buffer_key(id, false), n);
    else
      acts += n;
    if (pool_buffers)
      pool(ActivationPool::buffer_key(id, true), n);
    else
      acts += n;
  }
  // The gate's probabilities and their gradient (cpu_backend.cpp).
  acts += 2 * sc.gate_tokens * E;
  // The experts' workspace (experts.cpp's ExpertWorkspace::reserve).
  const int64_t max_rows = sc.expert_blocks * sc.exchange_slots;
  const int64_t total_rows =
      sc.packed ? schedule::dropless_local_rows(sc, shape.topk, e_loc) : max_rows;
  const int64_t pools = sc.packed ? 1 : e_loc;
  const bool bf16 = precision == Precision::kBf16;
  const int64_t rows_m = pools * total_rows * M, rows_h = pools * total_rows * hl;
  if (pool_rows) {
    if (!bf16) pool(ActivationPool::kIn, rows_m);
    pool(ActivationPool::kPre, rows_h);
    if (!bf16) pool(ActivationPool::kAct, rows_h);
    if (gated) pool(ActivationPool::kGate, rows_h);
  } else {
    acts += (bf16 ? 0 : rows_m) + rows_h + (bf16 ? 0 : rows_h) + (gated ? rows_h : 0);
  }
  acts += max_rows * M + (bf16 ? 0 : max_rows * M) + max_rows * hl + (gated ? max_rows * hl : 0);
  // The shared experts' workspace (shared_experts.cpp): per expert pre, act (not at bf16:
  // packed) and swiglu's gate.
  if (shape.has_shared()) {
    const int64_t r = sc.shared_rows;
    acts += shape.shared_experts * r * hs * (1 + (bf16 ? 0 : 1) + (gated ? 1 : 0)) + r * hs +
            (gated ? r * hs : 0) +
            r * M + (shape.shared_gate ? 2 * r * M + 2 * r : 0);
  }
  if (pool_buffers) acts += schedule::stats_numel(E, true);  // MoeLayer's replay_stats_
  m.activations = kF * acts;
  return m;
}

}  // namespace parm::moe
