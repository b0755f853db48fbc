// `parm bench-layer`: forward and backward time of the MoE layer under each schedule, and
// the bus bytes each (group, op) moved, as counted by the communicator.
//   --schedule auto / --fuse auto: the cost model (--profile) picks; every candidate's
//     predicted time is printed, then only the chosen one runs.
//   --sweep G.json --profile P: every schedule over a grid of layers on this machine, against
//     the model's predictions (selection accuracy, auto / fastest, prediction error; run by
//     perfmodel/validate_sweep.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "kernels/cpu/kernels.h"
#include "layer_flags.h"
#include "moe/expert_products.h"
#include "moe/layer_check.h"
#include "moe/load_balance.h"
#include "moe/node_traffic.h"
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/memory.h"
#include "parm/timer.h"
#include "perfmodel/model.h"
#include "perfmodel/validate_sweep.h"

namespace parm::cli {
namespace {

struct BenchLayerFlags {
  LayerFlags layer;
  int iters = 10;
  int warmup = 2;
  bool breakdown = false;
  std::string json;
  std::string sweep;
};

using ByteMap = std::map<std::string, double>;

ByteMap counted_bytes(Topology& topo) {
  ByteMap b;
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    for (int op = 0; op < kNumCommOps; ++op) {
      const OpStats& s = topo.host_comm(g).stats().op(static_cast<CommOp>(op));
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

// The model's view of this job: its layout and the node of every rank.
perfmodel::Profile load_profile_for_auto(const LayerFlags& f, const char* what) {
  PARM_CONFIG_CHECK(!f.profile.empty(),
                    "{} needs a cost profile: run `scripts/parmrun -n 4 -- calibrate --out "
                    "profile.json` once on this machine, then pass --profile profile.json",
                    what);
  perfmodel::Profile p = perfmodel::read_profile(f.profile);
  // Rates measured on another device kind would choose for the wrong machine.
  perfmodel::check_profile_device(p, parse_device(f.device), f.profile);
  return p;
}

// One row of the breakdown: a step, or a named phase inside a compute step.
struct BreakdownRow {
  std::string step, kind, phase;  // phase empty: the whole step
  double fwd = 0, bwd = 0, fwd_max = 0, bwd_max = 0;  // ms, mean over iterations
};

// The floor of one forward + backward pass: the expert products over the filled rows alone.
struct Floor {
  double ms = 0;         // median over iterations of the slowest rank's products timed alone
  double ms_rank0 = 0;   // median of rank 0's
  double gflops = 0;     // the GEMM rate reached on those shapes (rank of the max)
  // Filled expert rows: the most on one rank, and over all ranks; both depend on the routing
  // alone. Not the rows of the slowest rank: which rank is slowest is timing noise when the
  // loads are close (at mp = 1, ep = 2, T = 1024, k = 2 the two ranks hold 2044 and 2052
  // rows), so those would differ between schedules that route every token alike.
  int64_t rows_max = 0;
  int64_t rows_total = 0;
};

// Peak resident memory of the process (MiB): rank 0 and the max over ranks; and the bytes the
// layer itself holds (max over ranks).
struct Memory {
  double peak_rss_mib_rank0 = 0, peak_rss_mib_max = 0, layer_mib_max = 0;
};

// One schedule measured: medians (max over ranks), per-step and per-phase times, the floor.
struct Measured {
  std::string name;
  Timing fwd, bwd;
  std::vector<BreakdownRow> breakdown;
  Floor floor;
  Memory memory;
  ByteMap bytes_fwd, bytes_bwd;
  // The bf16 copies of the expert weights made over all passes (rank 0; the weights keep one
  // version throughout, so once, in the first pass) and the last one's time (ms, max over
  // ranks): outside the timed iterations when there is a warm-up pass.
  int64_t weight_copies = 0;
  double weight_copy_ms = 0;
  double total() const { return fwd.median + bwd.median; }
};

// Per step, the step's time then its kMax phase slots (zero where unused): the same length
// on every rank, so they can be maxed over ranks element-wise.
constexpr size_t kSlotsPerStep = 1 + moe::PhaseTimes::kMax;

void add_step_times(const std::vector<double>& step_us, const std::vector<moe::PhaseTimes>& ph,
                    double scale, std::vector<double>& acc) {
  for (size_t i = 0; i < step_us.size(); ++i) {
    acc[i * kSlotsPerStep] += step_us[i] * scale;
    for (int j = 0; j < ph[i].num; ++j)
      acc[i * kSlotsPerStep + 1 + static_cast<size_t>(j)] += ph[i].us[j] * scale;
  }
}

std::vector<BreakdownRow> breakdown_rows(Communicator& world, const MoeLayer& layer,
                                         const std::vector<double>& fwd,
                                         const std::vector<double>& bwd) {
  const auto fwd_max = max_over_ranks(world, fwd), bwd_max = max_over_ranks(world, bwd);
  std::vector<BreakdownRow> rows;
  const auto& steps = layer.schedule().steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t k = i * kSlotsPerStep;
    const char* kind = schedule::step_kind_name(steps[i].kind);
    rows.push_back({steps[i].label, kind, "", fwd[k], bwd[k], fwd_max[k], bwd_max[k]});
    // Forward and backward phases of a step are listed by name (their sets differ): a
    // phase's row is made by the first pass that names it.
    auto add_phases = [&](const moe::PhaseTimes& ph, const std::vector<double>& mean,
                          const std::vector<double>& max, double BreakdownRow::*at,
                          double BreakdownRow::*at_max) {
      for (int j = 0; j < ph.num; ++j) {
        const size_t kj = k + 1 + static_cast<size_t>(j);
        auto it = std::find_if(rows.begin(), rows.end(), [&](const BreakdownRow& o) {
          return o.step == steps[i].label && o.phase == ph.names[j];
        });
        BreakdownRow& row =
            it != rows.end() ? *it : rows.emplace_back(BreakdownRow{steps[i].label, kind, ph.names[j]});
        row.*at = mean[kj];
        row.*at_max = max[kj];
      }
    };
    add_phases(layer.forward_phases()[i], fwd, fwd_max, &BreakdownRow::fwd,
               &BreakdownRow::fwd_max);
    add_phases(layer.backward_phases()[i], bwd, bwd_max, &BreakdownRow::bwd,
               &BreakdownRow::bwd_max);
  }
  return rows;
}

// Every rank times its own expert products (the shapes of the forward pass) alone, at the
// same time as the others, once after each timed iteration (measure_floor_us), so that the
// floor and the layer see the same load: on a shared machine a floor timed apart moved time /
// floor either way. measure_floor then takes the statistic of the layer's times: per
// iteration the slowest rank, then the median over iterations, so that time / floor compares
// like with like.
// The shared experts' products (docs/spec.md §9): N_s FFNs of H_s / N_MP columns over the MP
// group's T rows on every rank; empty without shared experts.
std::vector<int64_t> shared_rows(const MoeLayer& layer) {
  return std::vector<int64_t>(static_cast<size_t>(layer.shape().shared_experts),
                              layer.shape().tokens);
}
int64_t shared_shard_hidden(const MoeLayer& layer) {
  return layer.shape().shared_hidden / layer.mp_size();
}

double measure_floor_us(Communicator& world, MoeLayer& layer) {
  world.barrier();
  const int64_t M = layer.shape().model_dim;
  double us = layer.backend().time_expert_products_us(layer.expert_rows(), M,
                                                      layer.shard_hidden(), 1);
  if (layer.shape().has_shared())
    us += layer.backend().time_expert_products_us(shared_rows(layer), M,
                                                  shared_shard_hidden(layer), 1);
  return us;
}

Floor measure_floor(Communicator& world, const MoeLayer& layer,
                    const std::vector<double>& floor_us) {
  const auto& rows = layer.expert_rows();
  const int64_t M = layer.shape().model_dim, hl = layer.shard_hidden();
  double flops = 0;
  int64_t total_rows = 0;
  for (int64_t r : rows) {
    flops += moe::expert_product_flops(r, M, hl, layer.shape().expert_mlp);
    total_rows += r;
  }
  for (int64_t r : shared_rows(layer))
    flops += moe::expert_product_flops(r, M, shared_shard_hidden(layer), layer.shape().expert_mlp);
  const double ms = median(max_over_ranks(world, floor_us)) / 1e3;
  const double own_ms = median(floor_us) / 1e3;
  const bool root = world_rank() == 0;
  const auto slowest = max_over_ranks(world, {own_ms, root ? own_ms : 0.0});
  // The GEMM rate of the rank slowest over the iterations (ties: the larger value). The rows
  // are properties of the routing alone, the same whichever rank is slowest.
  const bool is_max = own_ms == slowest[0];
  const auto at_max = max_over_ranks(
      world, {is_max ? flops / own_ms * 1e-6 : 0.0, static_cast<double>(total_rows)});
  int64_t sum_rows = total_rows;
  world.allreduce(&sum_rows, 1);
  return {ms, slowest[1], at_max[0], static_cast<int64_t>(at_max[1]), sum_rows};
}

Memory measure_memory(Communicator& world, const MoeLayer& layer) {
  const double mib = 1024.0 * 1024.0;
  const double rss = static_cast<double>(peak_rss_bytes()) / mib;
  const auto v = max_over_ranks(
      world,
      {rss, world_rank() == 0 ? rss : 0.0, static_cast<double>(layer.held_bytes()) / mib});
  return {v[1], v[0], v[2]};
}

struct LayerInputs {
  ref::MoeParams<float> params;
  std::vector<float> x, dout;
  float dl_z = 0.0f;  // --router-z-loss
};

LayerInputs make_inputs(const Topology& topo, const MoeShape& shape, uint64_t seed) {
  const int group = group_coord(topo.layout(), Group::kMp, topo.world_rank()).index;
  return {ref::init_params<float>(shape, seed), check_input(shape, seed, group),
          check_dout(shape, seed, group)};
}

Measured measure(Topology& topo, const MoeShape& shape, schedule::Kind kind, bool fuse,
                 int chunks, Precision precision, bool step_timing, LayerInputs& in, int iters,
                 int warmup,
                 const schedule::Schedule** schedule_out = nullptr,
                 std::unique_ptr<MoeLayer>* keep = nullptr) {
  Communicator& world = topo.host_comm(Group::kWorld);
  auto layer = std::make_unique<MoeLayer>(topo, shape, kind, fuse, chunks, precision,
                                          in.dl_z != 0.0f);
  layer->set_step_timing(step_timing);
  // Inputs on the layer's device, so that the timed passes move no host data.
  const Tensor xt = Tensor::view(in.x.data(), {shape.tokens, shape.model_dim}).to(topo.device());
  const Tensor dt =
      Tensor::view(in.dout.data(), {shape.tokens, shape.model_dim}).to(topo.device());
  Measured m;
  m.name = std::string(schedule::kind_name(kind)) + (layer->schedule().fused ? "+fused" : "");
  layer->load_whole(in.params);
  // The weights do not change between the passes: a bf16 backend packs them in the first.
  layer->backend().set_weights_version(1);
  std::vector<double> fwd_ms, bwd_ms, floor_us;
  const size_t num_steps = layer->schedule().steps.size();
  std::vector<double> step_fwd(num_steps * kSlotsPerStep, 0.0), step_bwd = step_fwd;
  for (int it = 0; it < warmup + iters; ++it) {
    layer->zero_grad();
    world.barrier();
    topo.reset_stats();
    const double t0 = now_us();
    layer->forward(xt);
    const double t1 = now_us();
    m.bytes_fwd = counted_bytes(topo);
    world.barrier();
    topo.reset_stats();
    const double t2 = now_us();
    layer->backward(dt, 0.01f, in.dl_z);
    const double t3 = now_us();
    m.bytes_bwd = counted_bytes(topo);
    if (it < warmup) continue;
    fwd_ms.push_back((t1 - t0) / 1e3);
    bwd_ms.push_back((t3 - t2) / 1e3);
    add_step_times(layer->forward_step_us(), layer->forward_phases(), 1e-3 / iters, step_fwd);
    add_step_times(layer->backward_step_us(), layer->backward_phases(), 1e-3 / iters, step_bwd);
    floor_us.push_back(measure_floor_us(world, *layer));
  }
  m.fwd = summarize(max_over_ranks(world, fwd_ms));
  m.bwd = summarize(max_over_ranks(world, bwd_ms));
  m.breakdown = breakdown_rows(world, *layer, step_fwd, step_bwd);
  m.floor = measure_floor(world, *layer, floor_us);
  m.memory = measure_memory(world, *layer);
  const auto copies = layer->backend().weight_copies();
  m.weight_copies = copies.made;
  m.weight_copy_ms = max_over_ranks(world, {copies.last_us / 1e3})[0];
  if (schedule_out != nullptr && keep != nullptr) {
    *schedule_out = &layer->schedule();
    *keep = std::move(layer);
  }
  return m;
}

// The cost model's price of the schedule just measured, fed the measured routing (the busiest
// rank's filled rows: Target::load_max_over_mean), beside the balanced-router price; with
// the breakdown, every step's predicted forward and backward ms beside the measured max.
nlohmann::json print_prediction(const perfmodel::Profile& profile, const std::string& path,
                                const schedule::Schedule& sc, const MoeShape& shape,
                                const Topology& topo, const Measured& m, bool breakdown) {
  perfmodel::Target target = perfmodel::target_of(topo);
  const perfmodel::Prediction balanced = perfmodel::predict(profile, sc, shape, target);
  target.load_max_over_mean = perfmodel::load_of_busiest_rows(
      sc, shape, target.layout, static_cast<double>(m.floor.rows_max));
  const perfmodel::Prediction p = perfmodel::predict(profile, sc, shape, target);
  std::printf("  predicted by %s with the measured routing (load_max_over_mean %.3f: the "
              "busiest rank's %lld expert rows over the mean routed %.1f): forward %.3f ms, "
              "backward %.3f ms, total %.3f ms (balanced router %.3f ms); measured / "
              "predicted %.3f\n",
              path.c_str(), target.load_max_over_mean, static_cast<long long>(m.floor.rows_max),
              perfmodel::mean_routed_rows(sc, shape, target.layout), p.fwd_us / 1e3,
              p.bwd_us / 1e3, p.total_us() / 1e3, balanced.total_us() / 1e3,
              m.total() / (p.total_us() / 1e3));
  nlohmann::json j = {{"load_max_over_mean", target.load_max_over_mean},
                      {"forward_ms", p.fwd_us / 1e3},
                      {"backward_ms", p.bwd_us / 1e3},
                      {"total_ms", p.total_us() / 1e3},
                      {"balanced_total_ms", balanced.total_us() / 1e3}};
  if (!breakdown) return j;
  std::printf("  %-40s %10s %10s %10s %10s\n", "step (predicted vs measured max)", "fwd pred",
              "fwd meas", "bwd pred", "bwd meas");
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& c : p.steps) {
    // The measured row of this step (its phase-less total); the executor's own work has none.
    auto it = std::find_if(m.breakdown.begin(), m.breakdown.end(), [&](const BreakdownRow& r) {
      return r.step == c.label && r.phase.empty();
    });
    const bool known = it != m.breakdown.end();
    std::printf("  %-40s %10.3f %10s %10.3f %10s\n", c.label.c_str(), c.fwd_us / 1e3,
                known ? fmt::format("{:.3f}", it->fwd_max).c_str() : "-", c.bwd_us / 1e3,
                known ? fmt::format("{:.3f}", it->bwd_max).c_str() : "-");
    nlohmann::json sj = {{"step", c.label}, {"forward_ms", c.fwd_us / 1e3},
                         {"backward_ms", c.bwd_us / 1e3}};
    if (known) {
      sj["measured_forward_ms_max"] = it->fwd_max;
      sj["measured_backward_ms_max"] = it->bwd_max;
    }
    steps.push_back(sj);
  }
  j["steps"] = steps;
  return j;
}

// Prints every candidate's predicted time and returns the chosen one.
perfmodel::Candidate choose_auto(const BenchLayerFlags& f, const Topology& topo,
                                 const MoeShape& shape, bool root) {
  const auto profile = load_profile_for_auto(f.layer, "--schedule auto / --fuse auto");
  const auto kinds = f.layer.schedules(topo.layout());
  const auto fuse_modes = f.layer.fuse_modes(true);
  const auto target = perfmodel::target_of(topo);
  const auto cands = perfmodel::predict_candidates(profile, shape, target, f.layer.chunks, kinds,
                                                   fuse_modes);
  const size_t best = perfmodel::choose(cands);
  if (root) {
    std::printf("# auto: predicted by the cost model in %s (schedule %s, fuse %s)\n",
                f.layer.profile.c_str(), f.layer.schedule.c_str(), f.layer.fuse.c_str());
    std::printf("  %-14s %10s %10s %10s\n", "candidate", "fwd_ms", "bwd_ms", "total_ms");
    for (size_t i = 0; i < cands.size(); ++i) {
      const auto& p = cands[i].pred;
      std::printf("  %-14s %10.3f %10.3f %10.3f%s\n", p.name().c_str(), p.fwd_us / 1e3,
                  p.bwd_us / 1e3, p.total_us() / 1e3, i == best ? "  <- chosen" : "");
    }
    std::printf("# auto chose %s\n", cands[best].pred.name().c_str());
  }
  return cands[best];
}

int run_bench_layer(const BenchLayerFlags& f) {
  const MoeShape shape = f.layer.shape();
  f.layer.layout.refuse_pp("bench-layer");
  auto kinds = f.layer.schedules(f.layer.layout.layout(world_size()));
  auto fuse_modes = f.layer.fuse_modes(true);
  PARM_CONFIG_CHECK(f.iters >= 1, "--iters {} must be at least 1", f.iters);
  PARM_CONFIG_CHECK(f.warmup >= 0, "--warmup {} must be at least 0", f.warmup);
  if (f.layer.wants_auto())  // refuse before any work
    load_profile_for_auto(f.layer, "--schedule auto / --fuse auto");
  // With a profile, every measured schedule is also priced with its measured routing.
  std::optional<perfmodel::Profile> profile;
  if (!f.layer.profile.empty()) profile = perfmodel::read_profile(f.layer.profile);
  auto topo = Topology::create(f.layer.topology());
  for (auto kind : kinds) schedule::validate({shape, topo->layout(), 0}, kind);
  const Precision precision = f.layer.precision_kind();
  const Layout& l = topo->layout();
  const bool root = topo->world_rank() == 0;

  if (root) {
    std::printf("# parm bench-layer: %s on %d ranks (mp=%d ep=%d esp=%d dp=%d edp=%d, %d "
                "node(s)); device %s, %s, communicator %s; %d iters + %d warmup; ms = median "
                "(max) over iterations of the max over ranks\n",
                shape.str().c_str(), l.world, l.mp, l.ep, l.esp, l.dp, l.edp, topo->num_nodes(),
                device_name(topo->device()), precision_name(precision), topo->comm_backend(),
                f.iters, f.warmup);
    // Which groups cross nodes: what --order changes.
    const auto target = perfmodel::target_of(*topo);
    std::printf("# order %s: mp %s, ep %s, esp %s\n", l.order_name().c_str(),
                perfmodel::link_name(perfmodel::group_link(target, Group::kMp)),
                perfmodel::link_name(perfmodel::group_link(target, Group::kEp)),
                perfmodel::link_name(perfmodel::group_link(target, Group::kEsp)));
  }
  if (root && precision == Precision::kBf16 && topo->device() == Device::kCpu)
    std::printf("# bf16 products: %s (cpu: %s)\n", cpu::bf16_kernel_name(),
                cpu::cpu_bf16_capability());
  nlohmann::json auto_json;
  if (f.layer.wants_auto()) {
    const auto chosen = choose_auto(f, *topo, shape, root);
    kinds = {chosen.kind};
    fuse_modes = {chosen.fuse};
    auto_json = {{"choice", chosen.pred.name()},
                 {"predicted_total_ms", chosen.pred.total_us() / 1e3}};
  }
  LayerInputs in = make_inputs(*topo, shape, f.layer.seed);
  in.dl_z = f.layer.router_z_loss;
  nlohmann::json results = nlohmann::json::array();
  double baseline_total = 0.0;
  for (auto kind : kinds)
  for (bool fuse : fuse_modes) {
    if (f.layer.fused_run_repeats(kind, fuse, fuse_modes, l)) continue;
    const schedule::Schedule* scp = nullptr;
    std::unique_ptr<MoeLayer> layer;
    const Measured m =
        measure(*topo, shape, kind, fuse, f.layer.chunks, precision, f.breakdown, in, f.iters,
                f.warmup, &scp, &layer);
    const auto& sc = *scp;
    const LoadImbalance imbalance = load_imbalance(*topo, *layer);  // collective
    const NodeTraffic traffic = node_traffic(*topo, *layer);        // collective
    const double total = m.total();
    if (kind == schedule::Kind::kBaseline) baseline_total = total;
    if (!root) continue;
    std::printf("\n%-9s forward %8.3f ms (%8.3f)  backward %8.3f ms (%8.3f)  total %8.3f ms",
                m.name.c_str(), m.fwd.median, m.fwd.max, m.bwd.median, m.bwd.max, total);
    if (baseline_total > 0 && kind != schedule::Kind::kBaseline)
      std::printf("  baseline/%s = %.3f", m.name.c_str(), baseline_total / total);
    std::printf("\n  gate on %lld tokens, C=%lld, slots per expert: %lld dispatched, %lld "
                "exchanged\n",
                static_cast<long long>(sc.gate_tokens), static_cast<long long>(sc.capacity),
                static_cast<long long>(sc.dispatch_slots),
                static_cast<long long>(sc.exchange_slots));
    std::printf("  load imbalance: %s\n", imbalance.str().c_str());
    if (topo->num_nodes() > 1)
      std::printf("  across nodes: %s (routed rows of the gated tokens)\n",
                  traffic.str().c_str());
    std::printf("  bytes forward (rank 0): %s\n", bytes_line(m.bytes_fwd).c_str());
    std::printf("  bytes backward (rank 0):%s\n", bytes_line(m.bytes_bwd).c_str());
    nlohmann::json row = {
        {"schedule", schedule::kind_name(kind)},
        {"fuse", sc.fused},
        {"chunks", sc.chunks},
        {"forward_ms", {{"median", m.fwd.median}, {"max", m.fwd.max}}},
        {"backward_ms", {{"median", m.bwd.median}, {"max", m.bwd.max}}},
        {"bytes_forward", m.bytes_fwd},
        {"bytes_backward", m.bytes_bwd},
        {"capacity", sc.capacity},
        {"gate_tokens", sc.gate_tokens},
        {"dropless", sc.dropless},
        {"packed", sc.packed},
        {"load_imbalance", {{"expert_max_over_mean", imbalance.expert_max_over_mean},
                            {"rank_max_over_mean", imbalance.rank_max_over_mean}}},
        {"cross_node_choices_per_token", traffic.cross_choices_per_token},
        {"cross_node_nodes_per_token", traffic.cross_nodes_per_token}};
    const double ratio = total / m.floor.ms;
    std::printf("  floor %.3f ms (expert products over the filled rows alone%s: %lld rows on "
                "the busiest rank, %lld on all; %.1f GFLOP/s on the slowest rank; rank 0 "
                "%.3f ms)  time / floor = %.3f\n",
                m.floor.ms, shape.has_shared() ? ", and the shared experts' over every token" : "",
                static_cast<long long>(m.floor.rows_max),
                static_cast<long long>(m.floor.rows_total), m.floor.gflops, m.floor.ms_rank0,
                ratio);
    row["floor_ms"] = m.floor.ms;
    row["floor_ms_rank0"] = m.floor.ms_rank0;
    row["floor_gflops"] = m.floor.gflops;
    row["floor_rows"] = m.floor.rows_max;
    row["floor_rows_total"] = m.floor.rows_total;
    row["time_over_floor"] = ratio;
    if (m.weight_copies > 0) {
      std::printf("  bf16 expert weights packed %lld time(s) over all %d passes (one weight "
                  "version): %.3f ms, in the first pass%s\n",
                  static_cast<long long>(m.weight_copies), f.warmup + f.iters, m.weight_copy_ms,
                  f.warmup > 0 ? " (warm-up), not in the times above" : " (timed)");
      row["bf16_weight_packs"] = m.weight_copies;
      row["bf16_weight_pack_ms"] = m.weight_copy_ms;
    }
    std::printf("  memory: peak resident %.1f MiB (rank 0 %.1f MiB); the layer holds %.1f MiB "
                "per rank\n",
                m.memory.peak_rss_mib_max, m.memory.peak_rss_mib_rank0, m.memory.layer_mib_max);
    row["peak_rss_mib"] = {{"rank0", m.memory.peak_rss_mib_rank0},
                           {"max", m.memory.peak_rss_mib_max}};
    row["layer_mib"] = m.memory.layer_mib_max;
    if (profile)
      row["prediction"] =
          print_prediction(*profile, f.layer.profile, sc, shape, *topo, m, f.breakdown);
    if (f.breakdown) {
      auto name_of = [](const BreakdownRow& r) {
        return r.phase.empty() ? r.step : "  " + r.step + ": " + r.phase;
      };
      int width = 4;
      for (const auto& r : m.breakdown)
        width = std::max(width, static_cast<int>(name_of(r).size()));
      std::printf("  %-*s %10s %10s %10s %10s\n", width, "step", "fwd rank0", "fwd max",
                  "bwd rank0", "bwd max");
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& r : m.breakdown) {
        std::printf("  %-*s %10.3f %10.3f %10.3f %10.3f\n", width, name_of(r).c_str(), r.fwd,
                    r.fwd_max, r.bwd, r.bwd_max);
        nlohmann::json j = {{"step", r.step},
                            {"kind", r.kind},
                            {"forward_ms_rank0", r.fwd},
                            {"forward_ms_max", r.fwd_max},
                            {"backward_ms_rank0", r.bwd},
                            {"backward_ms_max", r.bwd_max}};
        if (!r.phase.empty()) j["phase"] = r.phase;
        steps.push_back(j);
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
    cfg["comm_backend"] = topo->comm_backend();
    if (precision == Precision::kBf16 && topo->device() == Device::kCpu)
      cfg["bf16_gemm"] = cpu::bf16_kernel_name();
    nlohmann::json doc = {{"config", cfg}, {"results", results}};
    if (!auto_json.is_null()) doc["auto"] = auto_json;
    write_file_atomic(f.json, doc.dump(2) + "\n");
  }
  return 0;
}

int run_sweep(const BenchLayerFlags& f) {
  f.layer.layout.refuse_pp("bench-layer --sweep");
  perfmodel::SweepOptions o;
  o.grid_path = f.sweep;
  o.profile = load_profile_for_auto(f.layer, "--sweep");
  o.profile_path = f.layer.profile;
  o.world = world_size();
  o.topology = f.layer.topology();
  o.precision = f.layer.precision_kind();
  o.iters = f.iters;
  o.warmup = f.warmup;
  const bool root = world_rank() == 0;
  const auto report = perfmodel::validate_sweep(o, [root](const std::string& line) {
    if (!root) return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (root && !f.json.empty()) write_file_atomic(f.json, report.dump(2) + "\n");
  return 0;
}

}  // namespace

Command add_bench_layer(CLI::App& root) {
  auto* app = root.add_subcommand("bench-layer", "time the MoE layer under each schedule");
  auto f = std::make_shared<BenchLayerFlags>();
  f->layer.add_to(app);
  f->layer.add_profile_to(app);
  app->add_option("--iters", f->iters, "timed iterations");
  app->add_option("--warmup", f->warmup, "untimed iterations");
  app->add_flag("--breakdown", f->breakdown, "time of every step, rank 0 and max over ranks");
  app->add_option("--json", f->json, "also write the results to this JSON file");
  app->add_option("--sweep", f->sweep,
                  "grid file (configs/grids/*.json): measure every schedule of every "
                  "configuration that fits this job and compare with the model (--profile); "
                  "the grid replaces the layer and layout flags except --ranks-per-node (and "
                  "--order, which overrides the grid's \"order\")");
  return {app, [f] { return f->sweep.empty() ? run_bench_layer(*f) : run_sweep(*f); }};
}

}  // namespace parm::cli
