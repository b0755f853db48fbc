#include "train/moe_across_stages.h"

#include <cstdint>
#include <limits>

#include "moe/moe_layer.h"
#include "parm/error.h"
#include "train/schedule_plan.h"

namespace parm::train {
namespace {

// The MoE blocks before this pipeline stage's first block.
int64_t moe_blocks_before(model::Model& m, const model::ModelConfig& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < m.stage().begin; ++i) n += model::is_moe_block(c, i) ? 1 : 0;
  return n;
}

}  // namespace

std::vector<double> measured_load_max_over_mean(Communicator& world, model::Model& m,
                                                const model::ModelConfig& c, const Layout& lay,
                                                const std::vector<std::vector<double>>& loads) {
  std::vector<double> v(static_cast<size_t>(model::num_moe_blocks(c)),
                        -std::numeric_limits<double>::infinity());
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  for (size_t l = 0; l < loads.size(); ++l)
    v[first + l] = routed_load_max_over_mean(loads[l], lay.ep);
  world.allreduce(v.data(), v.size(), ReduceOp::kMax);
  return v;
}

nlohmann::json gather_router_bias(Communicator& world, model::Model& m,
                                  const model::ModelConfig& c) {
  const auto E = static_cast<size_t>(c.experts);
  const auto n = static_cast<size_t>(model::num_moe_blocks(c));
  std::vector<double> v(n * E, -std::numeric_limits<double>::infinity());
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  const auto layers = m.moe_layers();
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t e = 0; e < E; ++e) v[(first + l) * E + e] = layers[l]->router_bias()[e];
  world.allreduce(v.data(), v.size(), ReduceOp::kMax);
  nlohmann::json out = nlohmann::json::array();
  for (size_t l = 0; l < n; ++l) out.push_back(std::vector<double>(v.begin() + l * E, v.begin() + (l + 1) * E));
  return out;
}

void set_router_bias(model::Model& m, const model::ModelConfig& c, const nlohmann::json& saved,
                     const std::string& where) {
  if (saved.is_null()) return;
  const int64_t n = model::num_moe_blocks(c);
  bool ok = saved.is_array() && static_cast<int64_t>(saved.size()) == n;
  for (size_t l = 0; ok && l < saved.size(); ++l)
    ok = saved[l].is_array() && static_cast<int64_t>(saved[l].size()) == c.experts;
  PARM_CONFIG_CHECK(ok, "checkpoint {}: router_bias must hold {} MoE layers of {} numbers, got {}",
                    where, n, c.experts, saved.dump().substr(0, 200));
  const auto first = static_cast<size_t>(moe_blocks_before(m, c));
  const auto layers = m.moe_layers();
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t e = 0; e < static_cast<size_t>(c.experts); ++e)
      layers[l]->router_bias()[e] = static_cast<float>(saved[first + l][e].get<double>());
}

}  // namespace parm::train
