// The whole model's MoE layers seen from one pipeline stage: per MoE layer of the whole model
// (in block order), numbers that are the same on every rank. Each stage puts in its own
// layers, -inf elsewhere, and a max over the world picks them (a max moves no bits).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "parm/topology.h"

namespace parm::train {

// The routing imbalance of each MoE layer's last loads (routed_load_max_over_mean over
// lay.ep; `loads`: this stage's layers' expert_loads), so that every rank plans from the same
// numbers. Collective over `world`.
std::vector<double> measured_load_max_over_mean(Communicator& world, model::Model& m,
                                                const model::ModelConfig& c, const Layout& lay,
                                                const std::vector<std::vector<double>>& loads);

// The router bias of every MoE layer, E numbers each, as a checkpoint holds it (an array of
// arrays; resume is exact). Collective over `world`.
nlohmann::json gather_router_bias(Communicator& world, model::Model& m,
                                  const model::ModelConfig& c);

// Sets this stage's MoE layers' router bias from a checkpoint's (null: none saved, the bias
// stays zero). Throws InvalidConfig naming `where` for a bias of the wrong shape.
void set_router_bias(model::Model& m, const model::ModelConfig& c, const nlohmann::json& saved,
                     const std::string& where);

}  // namespace parm::train
