// The predictor of model/memory_plan.h: model/transformer.cpp's tensors, counted from the
// shapes (parameters: transformer_params.cpp; activations and scratch: allocate_buffers).
#include "model/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "moe/layer_memory.h"
#include "parm/error.h"
#include "schedule/schedule.h"

namespace parm::model {

std::vector<MemoryPlan> plan_memory(const MemoryPlanInput& in) {
  const ModelConfig& c = in.model;
  const Layout& lay = in.layout;
  validate_model(c, lay, in.schedules, in.micro_batch);
  constexpr int64_t kF = sizeof(float);
  const int64_t B = in.micro_batch, L = c.seq_len, T = B * L, M = c.model_dim, V = c.vocab;
  const int64_t Ml = M / lay.mp, Hl = c.num_heads / lay.mp, Fl = c.ffn_hidden / lay.mp;
  PARM_CHECK(static_cast<int>(in.slots.size()) == lay.pp &&
                 static_cast<int>(in.split.size()) == lay.pp,
             "memory plan: {} slot counts and {} stage sizes for pp {}", in.slots.size(),
             in.split.size(), lay.pp);
  const bool block = in.recompute == Recompute::kBlock;
  const auto block_acts = [&](bool dense) {
    return 2 * T * M + 4 * T + 3 * T * Ml + B * Hl * L * L + T * Ml + T * M +
           (dense ? 2 * T * Fl : 0);
  };
  std::vector<MemoryPlan> out;
  int moe_index = 0;
  for (int k = 0; k < lay.pp; ++k) {
    const StageBlocks st = stage_blocks(in.split, k);
    const int64_t slots = in.slots[static_cast<size_t>(k)];
    // kBlock: one set of block activations and one MoE layer per block for each lane; kMoe:
    // one set of the pool for each lane.
    const int64_t lanes = recompute_lanes(in.recompute, in.lanes, static_cast<int>(slots));
    MemoryPlan p;
    p.stage = k;
    double dense_params = 0, expert_params = 0;  // floats
    if (st.first() || st.last()) dense_params += static_cast<double>(V * M);  // wte
    if (st.first()) dense_params += static_cast<double>(L * M);               // wpe
    // The model's activations in floats (first the residual stream), the MoE layers' and the
    // pool's in bytes.
    int64_t acts = slots * (st.end - st.begin + 1) * T * M;
    int64_t moe_acts = 0;
    std::vector<int64_t> pool;  // by pool key: the largest need over the stage's layers
    bool any_dense = false;
    for (int64_t i = st.begin; i < st.end; ++i) {
      dense_params += static_cast<double>(4 * M + 3 * M * Ml + 3 * Ml + Ml * M + M);
      const bool moe = is_moe_block(c, i);
      if (!block) acts += slots * block_acts(!moe);
      if (!moe) {
        any_dense = true;
        dense_params += static_cast<double>(M * Fl + Fl + Fl * M + M);
        continue;
      }
      const LayerSchedule ls =
          in.schedules.empty()       ? LayerSchedule{}
          : in.schedules.size() == 1 ? in.schedules[0]
                                     : in.schedules[static_cast<size_t>(moe_index)];
      ++moe_index;
      // Every rank of an ESP group holds the same sizes; ESP rank 0 names them.
      const MoeShape shape = layer_shape(c, B, ls);
      const schedule::Schedule sc = schedule::build(
          {shape, lay, 0, ls.fuse, ls.chunks, c.router_z_loss > 0.0f, c.aux_scope}, ls.kind);
      const bool pool_buffers = in.recompute == Recompute::kMoe;
      const moe::LayerMemory lm = moe::plan_layer_memory(
          sc, shape, lay, in.precision, pool_buffers || in.recompute == Recompute::kMoeAct,
          pool_buffers);
      // The gate weight and the shared experts are dense (reduced over dp), the routed
      // experts' shards over edp.
      expert_params += static_cast<double>(lm.routed_parameters / kF);
      dense_params += static_cast<double>((lm.parameters - lm.routed_parameters) / kF);
      moe_acts += (block ? lanes : slots) * lm.activations;
      if (pool.size() < lm.pooled.size()) pool.resize(lm.pooled.size(), 0);
      for (size_t key = 0; key < lm.pooled.size(); ++key)
        pool[key] = std::max(pool[key], lm.pooled[key]);
    }
    if (block && st.end > st.begin) acts += lanes * block_acts(any_dense);  // a set per lane
    if (st.last()) {
      dense_params += static_cast<double>(2 * M);  // the final LN
      if (c.arch == Arch::kBert)  // the MLM head
        dense_params += static_cast<double>(M * M + 3 * M + V);
      acts += T * M + 2 * T + T * M + T * V;  // lnf, its statistics, head_in, logits
      if (c.arch == Arch::kBert) acts += 3 * T * M + 2 * T;
    }
    const double params = dense_params + expert_params;
    p.parameters = static_cast<int64_t>(params) * kF;
    p.gradients = p.parameters;
    p.optimizer = static_cast<int64_t>(
        std::ceil(2.0 * kF * (dense_params / in.dense_optimizer_divisor +
                              expert_params / in.expert_optimizer_divisor)));
    p.activations = acts * kF + moe_acts;
    for (int64_t b : pool) p.activations += lanes * b;
    // Gradient scratch: dres, dtmp, dln, dqkv, datt, dfc, dscores (the CPU's L x L); the head's.
    int64_t other = 3 * T * M + 3 * T * Ml + T * Ml + T * std::max<int64_t>(Fl, 1) + L * L;
    if (st.last()) other += 2 * T * M;
    p.other = other * kF;
    out.push_back(p);
  }
  return out;
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const auto bad = [&] {
    return InvalidConfig(fmt::format(
        "{} '{}' is not a size: give bytes, optionally with a suffix B, KiB, MiB, GiB, TiB "
        "(powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. 8GiB",
        what, text));
  };
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw bad();
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove_if(unit.begin(), unit.end(),
                            [](unsigned char ch) { return std::isspace(ch); }),
             unit.end());
  double scale = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1},           {"B", 1},          {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
      {"GB", 1e9},       {"TB", 1e12}};
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  if (scale == 0 || !std::isfinite(value) || value < 0 || value * scale > 9.0e18) throw bad();
  return static_cast<int64_t>(std::llround(value * scale));
}

}  // namespace parm::model
