// `parm check-layer`: every schedule against the single-process oracle from the same seed.
#include <cstdio>

#include "layer_flags.h"
#include "moe/layer_check.h"
#include "parm/error.h"

namespace parm::cli {
namespace {

struct CheckLayerFlags {
  LayerFlags layer;
  double tolerance = 0;  // 0: the default of the precision
  float dl_aux = 0.5f;
  std::string dump;
  bool force_ties = false;
};

int run_check_layer(const CheckLayerFlags& f) {
  const MoeShape shape = f.layer.shape();
  f.layer.layout.refuse_pp("check-layer");
  const auto kinds = f.layer.schedules(f.layer.layout.layout(world_size()));
  const auto fuse_modes = f.layer.fuse_modes(true);
  PARM_CONFIG_CHECK(f.tolerance >= 0, "--tolerance {} must be positive", f.tolerance);
  const Precision precision = f.layer.precision_kind();
  const double tolerance = f.tolerance > 0 ? f.tolerance : default_tolerance(precision);
  auto topo = Topology::create(f.layer.topology());
  for (auto kind : kinds)  // refuse a bad layer before any work
    schedule::validate({shape, topo->layout(), 0}, kind);
  const bool root = topo->world_rank() == 0;
  if (root)
    std::printf("# parm check-layer: %s on %d ranks (mp=%d ep=%d esp=%d); device %s, %s "
                "products, communicator %s; tolerance %.1e on max|error| / max|oracle| against "
                "the fp64 oracle\n",
                shape.str().c_str(), topo->layout().world, topo->layout().mp,
                topo->layout().ep, topo->layout().esp, device_name(topo->device()),
                precision_name(precision), topo->comm_backend(), tolerance);
  bool all_ok = true;
  for (auto kind : kinds)
  for (bool fuse : fuse_modes) {
    if (f.layer.fused_run_repeats(kind, fuse, fuse_modes, topo->layout())) continue;
    LayerCheckOptions o;
    o.fuse = fuse;
    o.chunks = f.layer.chunks;
    o.shape = shape;
    o.kind = kind;
    o.seed = f.layer.seed;
    o.tolerance = tolerance;
    o.precision = precision;
    o.dl_aux = f.dl_aux;
    o.dl_z = f.layer.router_z_loss;
    o.dump_dir = f.dump;
    o.force_ties = f.force_ties;
    const LayerCheckResult r = check_layer(*topo, o);
    all_ok = all_ok && r.passed;
    if (!root) continue;
    std::printf("\n%s%s: %s (oracle gates %s; %lld choices dropped; %lld tokens routed by "
                "the tie rule; routing %s)\n",
                schedule::kind_name(kind),
                fuse && kind != schedule::Kind::kBaseline ? " (fused)" : "", r.passed ? "PASS" : "FAIL",
                r.oracle_slices > 1 ? "each MP slice separately" : "all T tokens at once",
                static_cast<long long>(r.dropped_choices),
                static_cast<long long>(r.tie_decided_tokens),
                r.routing_matches ? "identical" : "DIFFERS");
    std::printf("  %-8s %12s %12s  %s\n", "tensor", "max_abs", "max_rel", "");
    for (const auto& e : r.errors)
      std::printf("  %-8s %12.3e %12.3e  %s\n", e.name.c_str(), e.max_abs, e.max_rel,
                  e.passed ? "ok" : "EXCEEDS TOLERANCE");
  }
  if (root && !f.dump.empty()) std::printf("\ndumped to %s (see manifest.json)\n", f.dump.c_str());
  return all_ok ? 0 : 1;
}

}  // namespace

Command add_check_layer(CLI::App& root) {
  auto* app = root.add_subcommand("check-layer",
                                  "compare every schedule with the single-process MoE layer");
  auto f = std::make_shared<CheckLayerFlags>();
  f->layer.tokens = 256;
  f->layer.model_dim = 64;
  f->layer.hidden = 128;
  f->layer.add_to(app);
  app->add_option("--tolerance", f->tolerance,
                  "largest allowed max|error| / max|oracle| (default 2e-4 at fp32, 2e-2 at "
                  "bf16)");
  app->add_option("--dl-aux", f->dl_aux, "gradient of the loss with respect to l_aux");
  app->add_option("--dump", f->dump,
                  "write .npy files and manifest.json into this folder: inputs of every MP "
                  "group, parameters, results, gradients and routing (moe/layer_check.h)");
  app->add_flag("--force-ties", f->force_ties,
                "zero the gate weights of experts 0 and E-1, so that their probabilities are "
                "bitwise equal for every token and the tie rule (lower expert index) decides "
                "the routing of many");
  return {app, [f] { return run_check_layer(*f); }};
}

}  // namespace parm::cli
