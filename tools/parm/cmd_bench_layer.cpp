// `parm bench-layer`: forward and backward time of the MoE layer under each schedule, and
// the bus bytes each (group, op) moved, as counted by the communicator.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>

#include "layer_flags.h"
#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"

namespace parm::cli {
namespace {

struct BenchLayerFlags {
  LayerFlags layer;
  int iters = 10;
  int warmup = 2;
  bool breakdown = false;
  std::string json;
};

using ByteMap = std::map<std::string, double>;

ByteMap counted_bytes(Topology& topo) {
  ByteMap b;
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    for (int op = 0; op < kNumCommOps; ++op) {
      const OpStats& s = topo.comm(g).stats().op(static_cast<CommOp>(op));
      if (s.calls > 0 && s.bus_bytes > 0)
        b[std::string(group_name(g)) + "." + comm_op_name(static_cast<CommOp>(op))] +=
            s.bus_bytes;
    }
  }
  return b;
}

std::string bytes_line(const ByteMap& b) {
  std::string s;
  for (const auto& [k, v] : b) s += fmt::format("  {}={:.0f}", k, v);
  return s.empty() ? "  (none)" : s;
}

struct Timing {
  double median = 0, max = 0;
};

Timing summarize(const std::vector<double>& per_iter_max_ms) {
  Timing t;
  t.median = median(per_iter_max_ms);
  for (double v : per_iter_max_ms) t.max = std::max(t.max, v);
  return t;
}

int run_bench_layer(const BenchLayerFlags& f) {
  const ref::MoeShape shape = f.layer.shape();
  const auto kinds = f.layer.schedules();
  PARM_CONFIG_CHECK(f.iters >= 1, "--iters {} must be at least 1", f.iters);
  PARM_CONFIG_CHECK(f.warmup >= 0, "--warmup {} must be at least 0", f.warmup);
  auto topo = Topology::create(f.layer.layout.topology());
  for (auto kind : kinds) schedule::validate({shape, topo->layout(), 0}, kind);
  const Layout& l = topo->layout();
  const bool root = topo->world_rank() == 0;
  Communicator& world = topo->comm(Group::kWorld);
  const int group = group_coord(l, Group::kMp, topo->world_rank()).index;
  const auto params = ref::init_params<float>(shape, f.layer.seed);
  auto x = check_input(shape, f.layer.seed, group);
  auto dout = check_dout(shape, f.layer.seed, group);
  const Tensor xt = Tensor::view(x.data(), {shape.tokens, shape.model_dim});
  const Tensor dt = Tensor::view(dout.data(), {shape.tokens, shape.model_dim});

  if (root)
    std::printf("# parm bench-layer: %s on %d ranks (mp=%d ep=%d esp=%d dp=%d edp=%d, %d "
                "node(s)); %d iters + %d warmup; ms = median (max) over iterations of the max "
                "over ranks\n",
                shape.str().c_str(), l.world, l.mp, l.ep, l.esp, l.dp, l.edp, topo->num_nodes(),
                f.iters, f.warmup);
  nlohmann::json results = nlohmann::json::array();
  double baseline_total = 0.0;
  for (auto kind : kinds) {
    MoeLayer layer(*topo, shape, kind);
    layer.load_whole(params);
    std::vector<double> fwd_ms, bwd_ms;
    const size_t num_steps = layer.schedule().steps.size();
    std::vector<double> step_fwd(num_steps, 0.0), step_bwd(num_steps, 0.0);
    ByteMap bytes_fwd, bytes_bwd;
    for (int it = 0; it < f.warmup + f.iters; ++it) {
      layer.zero_grad();
      world.barrier();
      topo->reset_stats();
      const double t0 = now_us();
      layer.forward(xt);
      const double t1 = now_us();
      bytes_fwd = counted_bytes(*topo);
      world.barrier();
      topo->reset_stats();
      const double t2 = now_us();
      layer.backward(dt, 0.01f);
      const double t3 = now_us();
      bytes_bwd = counted_bytes(*topo);
      if (it < f.warmup) continue;
      fwd_ms.push_back((t1 - t0) / 1e3);
      bwd_ms.push_back((t3 - t2) / 1e3);
      for (size_t i = 0; i < num_steps; ++i) {
        step_fwd[i] += layer.forward_step_us()[i] / 1e3 / f.iters;
        step_bwd[i] += layer.backward_step_us()[i] / 1e3 / f.iters;
      }
    }
    const Timing tf = summarize(max_over_ranks(fwd_ms));
    const Timing tb = summarize(max_over_ranks(bwd_ms));
    const auto step_fwd_max = max_over_ranks(step_fwd);
    const auto step_bwd_max = max_over_ranks(step_bwd);
    const double total = tf.median + tb.median;
    if (kind == schedule::Kind::kBaseline) baseline_total = total;
    if (!root) continue;
    const auto& sc = layer.schedule();
    std::printf("\n%-8s forward %8.3f ms (%8.3f)  backward %8.3f ms (%8.3f)  total %8.3f ms",
                schedule::kind_name(kind), tf.median, tf.max, tb.median, tb.max, total);
    if (baseline_total > 0 && kind != schedule::Kind::kBaseline)
      std::printf("  baseline/%s = %.3f", schedule::kind_name(kind), baseline_total / total);
    std::printf("\n  gate on %lld tokens, C=%lld, slots per expert: %lld dispatched, %lld "
                "exchanged\n",
                static_cast<long long>(sc.gate_tokens), static_cast<long long>(sc.capacity),
                static_cast<long long>(sc.dispatch_slots),
                static_cast<long long>(sc.exchange_slots));
    std::printf("  bytes forward (rank 0): %s\n", bytes_line(bytes_fwd).c_str());
    std::printf("  bytes backward (rank 0):%s\n", bytes_line(bytes_bwd).c_str());
    nlohmann::json row = {
        {"schedule", schedule::kind_name(kind)},
        {"forward_ms", {{"median", tf.median}, {"max", tf.max}}},
        {"backward_ms", {{"median", tb.median}, {"max", tb.max}}},
        {"bytes_forward", bytes_fwd},
        {"bytes_backward", bytes_bwd},
        {"capacity", sc.capacity},
        {"gate_tokens", sc.gate_tokens}};
    if (f.breakdown) {
      std::printf("  %-34s %12s %12s %12s %12s\n", "step", "fwd rank0", "fwd max", "bwd rank0",
                  "bwd max");
      nlohmann::json steps = nlohmann::json::array();
      for (size_t i = 0; i < num_steps; ++i) {
        const auto& s = sc.steps[i];
        std::printf("  %-34s %12.3f %12.3f %12.3f %12.3f\n", s.label.c_str(), step_fwd[i],
                    step_fwd_max[i], step_bwd[i], step_bwd_max[i]);
        steps.push_back({{"step", s.label},
                         {"kind", schedule::step_kind_name(s.kind)},
                         {"forward_ms_rank0", step_fwd[i]},
                         {"forward_ms_max", step_fwd_max[i]},
                         {"backward_ms_rank0", step_bwd[i]},
                         {"backward_ms_max", step_bwd_max[i]}});
      }
      row["breakdown"] = steps;
    }
    results.push_back(row);
  }
  if (root && !f.json.empty()) {
    nlohmann::json cfg = f.layer.config_json();
    cfg["iters"] = f.iters;
    cfg["warmup"] = f.warmup;
    cfg["world"] = l.world;
    write_file_atomic(f.json, nlohmann::json{{"config", cfg}, {"results", results}}.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

Command add_bench_layer(CLI::App& root) {
  auto* app = root.add_subcommand("bench-layer", "time the MoE layer under each schedule");
  auto f = std::make_shared<BenchLayerFlags>();
  f->layer.add_to(app);
  app->add_option("--iters", f->iters, "timed iterations");
  app->add_option("--warmup", f->warmup, "untimed iterations");
  app->add_flag("--breakdown", f->breakdown, "time of every step, rank 0 and max over ranks");
  app->add_option("--json", f->json, "also write the results to this JSON file");
  return {app, [f] { return run_bench_layer(*f); }};
}

}  // namespace parm::cli
