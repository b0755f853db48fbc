// `parm plan`: the cost model's predicted time of every step of every candidate schedule for
// one layer on a described target, the totals and the choice. Pure computation: it runs as a
// single process; --mp --ep --esp (and --world) describe the target, --devices-per-node (or
// --ranks-per-node) which of its groups cross nodes.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "layer_flags.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "perfmodel/model.h"

namespace parm::cli {
namespace {

struct PlanFlags {
  LayerFlags layer;
  int world = 0;
  int devices_per_node = 0;
  std::string json;
};

std::string parts_text(const std::vector<perfmodel::PartCost>& parts) {
  std::string s;
  for (const auto& p : parts)
    s += fmt::format("{}{}.{} {} {:.2f}MB", s.empty() ? "" : ", ", group_name(p.group),
                     comm_op_name(p.op), perfmodel::link_name(p.link), p.bus_bytes / 1e6);
  return s;
}

nlohmann::json parts_json(const std::vector<perfmodel::PartCost>& parts) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : parts)
    a.push_back({{"group", group_name(p.group)}, {"op", comm_op_name(p.op)},
                 {"link", perfmodel::link_name(p.link)}, {"bus_bytes", p.bus_bytes},
                 {"alone_ms", p.us / 1e3}});
  return a;
}

int run_plan(PlanFlags f) {
  // The layer's flags first: a bad shape is named before the profile is asked for or read.
  const MoeShape shape = f.layer.shape();
  f.layer.layout.refuse_pp("plan");
  PARM_CONFIG_CHECK(!f.layer.profile.empty(),
                    "plan needs a cost profile: run `scripts/parmrun -n 4 -- calibrate --out "
                    "profile.json`, then pass --profile profile.json");
  const int rpn = f.layer.layout.ranks_per_node;
  PARM_CONFIG_CHECK(rpn == 0 || f.devices_per_node == 0 || rpn == f.devices_per_node,
                    "--ranks-per-node {} and --devices-per-node {} disagree; give one of them",
                    rpn, f.devices_per_node);
  const int dpn = f.devices_per_node > 0 ? f.devices_per_node : rpn;
  const auto profile = perfmodel::read_profile(f.layer.profile);
  const auto target = perfmodel::make_target(f.world, f.layer.layout.mp, f.layer.layout.ep,
                                             f.layer.layout.esp, dpn, f.layer.layout.order);
  const auto kinds = f.layer.schedules(target.layout);
  const auto fuse_modes = f.layer.fuse_modes(true);
  const auto cands = perfmodel::predict_candidates(profile, shape, target, f.layer.chunks, kinds,
                                                   fuse_modes);
  PARM_CONFIG_CHECK(!cands.empty(),
                    "no candidate schedule: --schedule {} is not defined for --mp {} --esp {} "
                    "(the baseline needs N_ESP = 1 or N_ESP = N_MP)",
                    f.layer.schedule, f.layer.layout.mp, f.layer.layout.esp);
  const size_t best = perfmodel::choose(cands);
  if (world_rank() != 0) return 0;

  const Layout& l = target.layout;
  const int nodes = target.node_of_rank.back() + 1;
  std::printf("# parm plan: %s\n", shape.str().c_str());
  std::printf("# target: %d devices on %d node(s) of %d; mp=%d ep=%d esp=%d (dp=%d edp=%d), "
              "order %s; links: mp %s, ep %s, esp %s\n",
              l.world, nodes, l.world / nodes, l.mp, l.ep, l.esp, l.dp, l.edp,
              l.order_name().c_str(),
              perfmodel::link_name(perfmodel::group_link(target, Group::kMp)),
              perfmodel::link_name(perfmodel::group_link(target, Group::kEp)),
              perfmodel::link_name(perfmodel::group_link(target, Group::kEsp)));
  const auto& mach = profile.machine;
  std::printf("# profile: %s (%s); fused overlap %.3f, chunks %d\n", f.layer.profile.c_str(),
              mach.contains("hostname") ? mach["hostname"].dump().c_str()
              : mach.contains("cluster") ? mach["cluster"].dump().c_str()
                                         : "?",
              profile.fused.overlap, f.layer.chunks);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : cands) {
    const auto& p = c.pred;
    std::printf("\n== %s: forward %.3f ms, backward %.3f ms, total %.3f ms\n", p.name().c_str(),
                p.fwd_us / 1e3, p.bwd_us / 1e3, p.total_us() / 1e3);
    std::printf("  %-64s %-15s %9s %9s  %s\n", "step", "kind", "fwd_ms", "bwd_ms",
                "collectives: group.op link bus-bytes (fwd | bwd)");
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : p.steps) {
      std::string coll;
      if (!s.fwd_parts.empty() || !s.bwd_parts.empty())
        coll = parts_text(s.fwd_parts) + " | " + parts_text(s.bwd_parts);
      const bool executor = s.executor;
      std::printf("  %-64s %-15s %9.3f %9.3f  %s\n", s.label.c_str(),
                  executor ? "-" : schedule::step_kind_name(s.kind), s.fwd_us / 1e3,
                  s.bwd_us / 1e3, coll.c_str());
      steps.push_back({{"step", s.label},
                       {"kind", executor ? "executor" : schedule::step_kind_name(s.kind)},
                       {"fwd_ms", s.fwd_us / 1e3},
                       {"bwd_ms", s.bwd_us / 1e3},
                       {"fwd_collectives", parts_json(s.fwd_parts)},
                       {"bwd_collectives", parts_json(s.bwd_parts)}});
    }
    out.push_back({{"schedule", p.name()},
                   {"fwd_ms", p.fwd_us / 1e3},
                   {"bwd_ms", p.bwd_us / 1e3},
                   {"total_ms", p.total_us() / 1e3},
                   {"compute_ms", perfmodel::compute_steps_us(p) / 1e3},
                   {"steps", steps}});
  }
  double baseline = 0.0;
  for (const auto& c : cands)
    if (c.kind == schedule::Kind::kBaseline) baseline = c.pred.total_us();
  std::printf("\n  %-14s %10s %10s %10s %12s\n", "schedule", "fwd_ms", "bwd_ms", "total_ms",
              "vs baseline");
  for (size_t i = 0; i < cands.size(); ++i) {
    const auto& p = cands[i].pred;
    std::printf("  %-14s %10.3f %10.3f %10.3f %12s%s\n", p.name().c_str(), p.fwd_us / 1e3,
                p.bwd_us / 1e3, p.total_us() / 1e3,
                baseline > 0 ? fmt::format("{:.3f}x", baseline / p.total_us()).c_str() : "-",
                i == best ? "  <- choice" : "");
  }
  std::printf("choice: %s (predicted %.3f ms forward+backward)\n",
              cands[best].pred.name().c_str(), cands[best].pred.total_us() / 1e3);
  if (!f.json.empty()) {
    nlohmann::json cfg = f.layer.config_json();
    cfg["world"] = l.world;
    cfg["order"] = l.order_name();
    cfg["devices_per_node"] = dpn;
    write_file_atomic(f.json, nlohmann::json{{"config", cfg},
                                             {"candidates", out},
                                             {"choice", cands[best].pred.name()}}
                                      .dump(2) + "\n");
  }
  return 0;
}

}  // namespace

Command add_plan(CLI::App& root) {
  auto* app = root.add_subcommand(
      "plan", "predicted time of every step of every schedule for one layer (cost model)");
  auto f = std::make_shared<PlanFlags>();
  f->layer.fuse = "auto";
  f->layer.add_to(app);
  f->layer.add_profile_to(app);
  app->add_option("--world", f->world,
                  "devices of the target (default: the smallest that fits the layout, rounded "
                  "up to whole nodes)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--devices-per-node", f->devices_per_node,
                  "devices per node of the target (same as --ranks-per-node; default: one node)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--json", f->json, "also write the table to this JSON file");
  return {app, [f] { return run_plan(*f); }};
}

}  // namespace parm::cli
