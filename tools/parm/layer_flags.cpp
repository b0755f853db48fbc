#include "layer_flags.h"

#include <nlohmann/json.hpp>

#include "moe/backend.h"
#include "parm/error.h"

namespace parm::cli {

void LayerFlags::add_to(CLI::App* app) {
  layout.add_to(app);
  app->add_option("--tokens", tokens, "tokens T per MP group (B x L)");
  app->add_option("--model-dim", model_dim, "model dimension M");
  app->add_option("--hidden", hidden, "expert hidden dimension H");
  app->add_option("--experts", experts, "number of experts E");
  app->add_option("--topk", topk, "experts per token k");
  app->add_option("--capacity-factor", capacity_factor, "capacity factor f (a decimal), or none: dropless routing");
  app->add_option("--pad-to-capacity", pad_to_capacity,
                  "with a capacity factor: on (default): the exchanges move whole capacity "
                  "buffers, E x C rows (GShard, DeepSpeed-MoE); off: the kept rows only, as "
                  "dropless routing's do (Megatron-Core's default)");
  app->add_option("--schedule", schedule,
                  "baseline, s1, s2, all, or auto (the cost model picks; needs --profile)");
  app->add_option("--seed", seed, "seed of the weights and inputs");
  app->add_option("--router-z-loss", router_z_loss,
                  "router z-loss coefficient: the gradient of the loss with respect to it "
                  "in the backward passes (0: off)")
      ->check(CLI::NonNegativeNumber);
  router.add_to(app);
  app->add_option("--expert-mlp", expert_mlp,
                  "the experts' FFN: gelu (GPT-2's, with biases; the default) or swiglu "
                  "((silu(x W1) * x W3) W2, no biases; Mixtral, DeepSeek)");
  app->add_option("--shared-experts", shared_experts,
                  "shared experts every token passes through, of the routed experts' kind, "
                  "split over MP like the dense FFN (0: none)");
  app->add_option("--shared-hidden", shared_hidden,
                  "a shared expert's hidden width H_s (default: --hidden)");
  app->add_option("--shared-gate", shared_gate,
                  "on: the shared output times sigmoid(x w_sg) (Qwen2-MoE); off (default)");
  app->add_option("--shared-overlap", shared_overlap,
                  "on: S1 and S2 compute the shared experts while the dispatch AllToAll is in "
                  "flight (where its transport moves data without MPI calls; needs "
                  "--shared-experts); off (default): one after the other");
  app->add_option("--fuse", fuse,
                  "fused dispatch/combine collectives for s1/s2: on, off, both, or auto (the "
                  "cost model picks; needs --profile)");
  app->add_option("--chunks", chunks, "pipeline depth of the fused collectives");
  app->add_option("--device", device, "where the layer computes: cpu or cuda");
  app->add_option("--precision", precision,
                  "expert products: fp32, or bf16 (bf16 operands; fp32 accumulation, fp32 "
                  "master weights and reductions; on the CPU AMX tiles where there are any)");
  app->add_option("--comm", comm,
                  "what moves device buffers (--device cuda): nccl, mpi (staged through host "
                  "memory; several ranks per GPU), or auto (nccl when every rank has a GPU)");
}

TopologyOptions LayerFlags::topology() const {
  TopologyOptions o = layout.topology();
  o.device = parse_device(device);
  o.comm = parse_comm_backend(comm);
  // Before check_device: the message holds in a build or on a machine without a GPU too.
  RouterSpec r;
  router.apply(r);
  moe::check_router_options(o.device, router_z_loss, 0.0f, r);
  moe::check_expert_mlp(o.device, precision_kind(), parse_expert_mlp(expert_mlp));
  moe::check_shared_experts(o.device, precision_kind(), shared_experts);
  check_device(o.device, precision_kind());
  return o;
}

void LayerFlags::add_profile_to(CLI::App* app) {
  app->add_option("--profile", profile,
                  "cost profile (JSON from `parm calibrate --out FILE`) for --schedule auto / "
                  "--fuse auto");
}

MoeShape LayerFlags::shape() const {
  auto s = MoeShape::of(tokens, model_dim, hidden, experts, topk, capacity_factor);
  router.apply(s.router);
  s.expert_mlp = parse_expert_mlp(expert_mlp);
  s.shared_experts = shared_experts;
  s.shared_hidden = shared_width(shared_experts, shared_hidden, hidden);
  s.shared_gate = parse_on_off(shared_gate, "--shared-gate (model.shared_gate)");
  s.shared_overlap = parse_on_off(shared_overlap, "--shared-overlap");
  s.pad_to_capacity = parse_on_off(pad_to_capacity, "--pad-to-capacity");
  s.validate();
  return s;
}

std::vector<schedule::Kind> LayerFlags::schedules(const Layout& lay) const {
  using schedule::Kind;
  if (schedule != "all" && schedule != "auto") {
    try {
      return {schedule::parse_kind(schedule)};
    } catch (const InvalidConfig&) {
      throw InvalidConfig(fmt::format(
          "--schedule '{}' is not valid; use baseline, s1, s2, all or auto", schedule));
    }
  }
  // "all": the schedules that exist on the layout (no baseline where it is not defined).
  std::vector<Kind> out;
  for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
    if (schedule::supports(kind, lay))
      out.push_back(kind);
  return out;
}

std::vector<bool> LayerFlags::fuse_modes(bool allow_both) const {
  if (fuse == "on") return {true};
  if (fuse == "off") return {false};
  if ((fuse == "both" || fuse == "auto") && allow_both) return {false, true};
  throw InvalidConfig(fmt::format("--fuse '{}' is not valid; use on, off{}", fuse,
                                  allow_both ? ", both or auto" : ""));
}

bool LayerFlags::fused_run_repeats(schedule::Kind kind, bool fuse,
                                   const std::vector<bool>& modes, const Layout& layout) const {
  if (!fuse || modes.size() < 2) return false;
  return !schedule::build({shape(), layout, 0, true, chunks}, kind).fused;
}

nlohmann::json LayerFlags::config_json() const {
  RouterSpec r;
  router.apply(r);
  return {{"mp", layout.mp}, {"ep", layout.ep}, {"esp", layout.esp}, {"order", layout.order},
          {"tokens", tokens}, {"model_dim", model_dim}, {"hidden", hidden},
          {"experts", experts}, {"topk", topk}, {"capacity_factor", capacity_factor},
          {"router_z_loss", router_z_loss}, {"router_score", router_score_name(r.score)},
          {"router_topk_norm", r.topk_norm}, {"router_scale", r.scale},
          {"router_groups", r.groups}, {"router_group_topk", r.group_topk},
          {"expert_mlp", expert_mlp}, {"shared_experts", shared_experts},
          {"shared_hidden", shared_hidden}, {"shared_gate", shared_gate},
          {"shared_overlap", shared_overlap}, {"pad_to_capacity", pad_to_capacity},
          {"schedule", schedule}, {"seed", seed}, {"fuse", fuse}, {"chunks", chunks},
          {"profile", profile}, {"device", device}, {"precision", precision},
          {"comm", comm}};
}

}  // namespace parm::cli
