#include "perfmodel/validate_sweep.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "parm/error.h"
#include "parm/stats.h"
#include "parm/timer.h"
#include "perfmodel/measured_steps.h"
#include "perfmodel/model.h"
#include "perfmodel/same_program.h"
#include "perfmodel/simulate.h"
#include "perfmodel/sweep_policies.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {
namespace {

// One candidate measured over the rounds: the median forward and backward time (ms, max over
// ranks per round), the spread of its round totals, and the filled expert rows of its
// busiest rank (the routing is the same in every round: fixed parameters and input).
struct Totals {
  double fwd = 0.0, bwd = 0.0;
  double min_total = 0.0;  // the fastest round's forward + backward
  double max_total = 0.0;  // the slowest round's
  double spread = 0.0;     // (slowest - fastest round) / median round, forward + backward
  double busiest_rank_rows = 0.0;
  // The median round total of the even and of the odd rounds: two half-measurements of the
  // same candidate, whose disagreement on the fastest program is the measurement's own noise.
  double half_total[2] = {0.0, 0.0};
  // The compute steps by the executor's own step timers (measured_steps.h), median over the
  // rounds of: the slowest rank's sum over its compute steps (as calibrate's layer reads them),
  // and the sum over the compute steps of each step's slowest rank (>= the first; the two
  // differ by how far the ranks' slow steps fall on different ranks).
  double compute = 0.0, compute_step_max = 0.0;
  // The pass's time outside every step timer (the executor's own work between and around the
  // steps), median over the rounds of the largest rank's.
  double outside_steps = 0.0;
  double total() const { return fwd + bwd; }
};

// The candidates run in rounds, each round every candidate once, in an order rotated by one
// every round (round r starts at candidate r mod n), so that a change in the machine's load
// hits all of them alike and none always runs right after the same neighbour.
std::vector<Totals> measure_rounds(Topology& topo, const MoeShape& shape,
                                   const std::vector<Candidate>& cands, int chunks,
                                   const SweepOptions& o) {
  Communicator& world = topo.host_comm(Group::kWorld);
  const int group = group_coord(topo.layout(), Group::kMp, topo.world_rank()).index;
  const auto params = ref::init_params<float>(shape, 1);
  auto x = check_input(shape, 1, group), dout = check_dout(shape, 1, group);
  const Tensor xt = Tensor::view(x.data(), {shape.tokens, shape.model_dim}).to(topo.device());
  const Tensor dt = Tensor::view(dout.data(), {shape.tokens, shape.model_dim}).to(topo.device());
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (const auto& c : cands) {
    layers.push_back(std::make_unique<MoeLayer>(topo, shape, c.kind, c.fuse, chunks, o.precision));
    layers.back()->set_step_timing(false);  // totals only
    layers.back()->load_whole(params);
  }
  const size_t n = layers.size();
  std::vector<std::vector<double>> fwd(n), bwd(n);
  // Per candidate, this rank's step times of every timed round, one round after the other.
  std::vector<std::vector<double>> steps(n);
  for (int round = 0; round < o.warmup + o.iters; ++round)
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + static_cast<size_t>(round)) % n;
      MoeLayer& layer = *layers[i];
      layer.zero_grad();
      world.barrier();
      const double t0 = now_us();
      layer.forward(xt);
      const double t1 = now_us();
      world.barrier();
      const double t2 = now_us();
      layer.backward(dt, 0.01f);
      const double t3 = now_us();
      if (round < o.warmup) continue;
      fwd[i].push_back((t1 - t0) / 1e3);
      bwd[i].push_back((t3 - t2) / 1e3);
      const std::vector<double> us = last_pass_step_us(layer);
      steps[i].insert(steps[i].end(), us.begin(), us.end());
    }
  std::vector<Totals> out;
  for (size_t i = 0; i < n; ++i) {
    double rows = 0.0;
    for (int64_t r : layers[i]->expert_rows()) rows += static_cast<double>(r);
    const auto f = max_over_ranks(world, fwd[i]), b = max_over_ranks(world, bwd[i]);
    std::vector<double> round_total(f.size());
    for (size_t r = 0; r < f.size(); ++r) round_total[r] = f[r] + b[r];
    const auto [lo, hi] = std::minmax_element(round_total.begin(), round_total.end());
    const double mid = median(round_total);
    out.push_back({median(f), median(b), *lo, *hi, mid > 0.0 ? (*hi - *lo) / mid : 0.0,
                   max_over_ranks(world, std::vector<double>{rows})[0]});
    std::vector<double> half[2];
    for (size_t r = 0; r < round_total.size(); ++r) half[r % 2].push_back(round_total[r]);
    for (int h = 0; h < 2; ++h) out.back().half_total[h] = half[h].empty() ? NAN : median(half[h]);
    const schedule::Schedule& sc = layers[i]->schedule();
    const size_t per_round = 2 * sc.steps.size();
    const std::vector<double> step_max = max_over_ranks(world, steps[i]);
    std::vector<double> mine, of_step_max, outside;
    for (size_t r = 0; r * per_round < steps[i].size(); ++r) {
      const auto at = [&](const std::vector<double>& v) {
        const auto first = v.begin() + static_cast<std::ptrdiff_t>(r * per_round);
        return std::vector<double>(first, first + static_cast<std::ptrdiff_t>(per_round));
      };
      mine.push_back(compute_us_of(sc, at(steps[i])) / 1e3);
      of_step_max.push_back(compute_us_of(sc, at(step_max)) / 1e3);
      double stepped = 0.0;
      for (double us : at(steps[i])) stepped += us;
      outside.push_back(fwd[i][r] + bwd[i][r] - stepped / 1e3);
    }
    out.back().compute = median(max_over_ranks(world, mine));
    out.back().compute_step_max = median(of_step_max);
    out.back().outside_steps = median(max_over_ranks(world, outside));
  }
  return out;
}

// The candidate with the least time (the first on ties).
size_t fastest_of(const std::vector<double>& t) {
  return static_cast<size_t>(std::min_element(t.begin(), t.end()) - t.begin());
}

double max_of(const std::vector<double>& v) {
  return v.empty() ? NAN : *std::max_element(v.begin(), v.end());
}

}  // namespace

nlohmann::json validate_sweep(const SweepOptions& o,
                              const std::function<void(const std::string&)>& log) {
  PARM_CONFIG_CHECK(o.iters >= 1, "--iters {} must be at least 1", o.iters);
  PARM_CONFIG_CHECK(o.warmup >= 0, "--warmup {} must be at least 0", o.warmup);
  const auto grid = read_grid(o.grid_path);
  const int rpn = o.topology.ranks_per_node;
  // The grid's order, unless the command line gave one (as in parm simulate).
  const std::string order = o.topology.order != kDefaultOrder ? o.topology.order : grid.order;
  log(fmt::format("# parm bench-layer --sweep {}: {} configurations in the grid, {} ranks{}; "
                  "profile {}; {} rounds + {} warmup, each schedule once a round in a rotated "
                  "order; ms = median over rounds of the max over ranks (forward + backward); "
                  "spread = (slowest - fastest round) / median; load = busiest rank's expert "
                  "rows / mean routed rows; order {}",
                  o.grid_path, grid.configs.size(), o.world,
                  rpn > 0 ? fmt::format(", {} per emulated node", rpn) : "", o.profile_path,
                  o.iters, o.warmup, order));
  nlohmann::json configs = nlohmann::json::array();
  std::vector<double> ratios, rel_errors;
  std::vector<PolicyConfig> policy_configs;  // the policy view's input
  std::map<std::string, std::vector<double>> by_schedule;  // relative errors per schedule
  std::vector<std::string> wrong;                          // configurations auto got wrong
  std::vector<double> speedups;  // measured baseline / auto, where there is a baseline
  std::vector<double> twins;  // |t_a / t_b - 1| of candidates that run the same program
  std::vector<double> spreads;  // each (configuration, schedule)'s spread over the rounds
  // Measured / predicted of each part of the layer's time (compute steps, the rest, the
  // total), per schedule: where the model's common error lives.
  std::map<std::string, std::map<std::string, std::vector<double>>> part_ratios;
  int64_t measured_configs = 0, correct = 0, correct_distinct = 0, within5 = 0, skipped = 0;
  int64_t wrong_within_rounds = 0;  // wrong choices whose rounds overlap the fastest's
  // Configurations with two or more rounds, and those whose even and odd rounds measured the
  // same fastest program (the measurement agreeing with itself).
  int64_t halves_compared = 0, halves_agree = 0;
  for (size_t ci = 0; ci < grid.configs.size(); ++ci) {
    const auto& c = grid.configs[ci];
    const MoeShape shape = c.shape();
    const std::string desc = fmt::format("{} mp={} esp={} ep={}", shape.str(), c.mp, c.esp, c.ep);
    // Configurations that do not fit this job are skipped (the same decision on every rank).
    std::vector<Candidate> cands;
    std::unique_ptr<Topology> topo;
    try {
      make_layout(o.world, c.mp, c.ep, c.esp, 1, order);
      TopologyOptions to = o.topology;
      to.order = order;
      to.mp = c.mp;
      to.ep = c.ep;
      to.esp = c.esp;
      topo = Topology::create(to);
      cands = predict_candidates(o.profile, shape, target_of(*topo), grid.chunks,
                                 {schedule::Kind::kBaseline, schedule::Kind::kS1,
                                  schedule::Kind::kS2},
                                 {false, true});
    } catch (const InvalidConfig& e) {
      ++skipped;
      log(fmt::format("[{}] {}: skipped ({})", ci, desc, e.what()));
      continue;
    }
    const auto totals = measure_rounds(*topo, shape, cands, grid.chunks, o);
    // The routing is now known: price each candidate with its busiest rank's measured rows
    // (the one imbalance input, model.h; the choice depends on the routing, not on any
    // measured time).
    std::vector<double> balanced_ms, loads;
    std::vector<schedule::Schedule> built;
    for (size_t i = 0; i < cands.size(); ++i) {
      Target target = target_of(*topo);
      built.push_back(schedule::build({shape, target.layout, 0, cands[i].fuse, grid.chunks},
                                      cands[i].kind));
      balanced_ms.push_back(cands[i].pred.total_us() / 1e3);
      target.load_max_over_mean =
          load_of_busiest_rows(built[i], shape, target.layout, totals[i].busiest_rank_rows);
      loads.push_back(target.load_max_over_mean);
      cands[i].pred = predict(o.profile, built[i], shape, target);
    }
    // twin[i]: the first candidate that runs the same program as i (i itself if none).
    std::vector<size_t> twin(cands.size());
    for (size_t i = 0; i < cands.size(); ++i) {
      twin[i] = i;
      for (size_t j = 0; j < i && twin[i] == i; ++j)
        if (same_program(built[i], built[j])) twin[i] = j;
    }
    const size_t chosen = choose(cands);
    std::vector<double> meas;
    std::vector<double> pred_compute_ms;  // each candidate's priced compute steps
    nlohmann::json cj = {{"id", ci}, {"B", c.B}, {"L", c.L}, {"T", c.tokens()}, {"M", c.M},
                         {"H", c.H}, {"E", c.E}, {"k", c.k}, {"f", c.f}, {"N_MP", c.mp},
                         {"N_ESP", c.esp}, {"N_EP", c.ep}};
    nlohmann::json cand_json = nlohmann::json::array();
    for (size_t i = 0; i < cands.size(); ++i) {
      const auto& cand = cands[i];
      const Totals& m = totals[i];
      meas.push_back(m.total());
      const double pred = cand.pred.total_us() / 1e3;
      const double pred_compute = compute_steps_us(cand.pred) / 1e3;
      pred_compute_ms.push_back(pred_compute);
      rel_errors.push_back(std::abs(pred - m.total()) / m.total());
      spreads.push_back(m.spread);
      nlohmann::json x = {{"schedule", cand.pred.name()},
                          {"predicted_ms", pred},
                          {"predicted_fwd_ms", cand.pred.fwd_us / 1e3},
                          {"predicted_bwd_ms", cand.pred.bwd_us / 1e3},
                          {"measured_ms", m.total()},
                          {"measured_fwd_ms", m.fwd},
                          {"measured_bwd_ms", m.bwd},
                          {"measured_min_ms", m.min_total},
                          {"measured_max_ms", m.max_total},
                          {"measured_spread", m.spread},
                          {"predicted_balanced_ms", balanced_ms[i]},
                          {"busiest_rank_expert_rows", m.busiest_rank_rows},
                          {"load_max_over_mean", loads[i]},
                          {"measured_compute_ms", m.compute},
                          {"measured_rest_ms", m.total() - m.compute},
                          {"measured_compute_step_max_ms", m.compute_step_max},
                          {"measured_outside_steps_ms", m.outside_steps},
                          {"measured_even_rounds_ms", m.half_total[0]},
                          {"measured_odd_rounds_ms", m.half_total[1]},
                          {"predicted_compute_ms", pred_compute},
                          {"predicted_rest_ms", pred - pred_compute}};
      auto& pr = part_ratios[cand.pred.name()];
      pr["compute"].push_back(m.compute / pred_compute);
      pr["rest"].push_back((m.total() - m.compute) / (pred - pred_compute));
      pr["total"].push_back(m.total() / pred);
      if (twin[i] != i) x["same_program_as"] = cands[twin[i]].pred.name();
      cand_json.push_back(x);
      by_schedule[cand.pred.name()].push_back(rel_errors.back());
    }
    const size_t oracle = fastest_of(meas);
    const double ratio = meas[chosen] / meas[oracle];
    ++measured_configs;
    // Candidates that run the same program are one: picking either is right by the distinct
    // measure, and their measured spread is the noise floor.
    const bool exact = chosen == oracle, same = twin[chosen] == twin[oracle];
    correct += exact ? 1 : 0;
    correct_distinct += same ? 1 : 0;
    for (size_t i = 0; i < cands.size(); ++i)
      if (twin[i] != i) twins.push_back(std::abs(meas[i] / meas[twin[i]] - 1.0));
    if (o.iters >= 2) {
      std::vector<double> even, odd;
      for (const Totals& t : totals) {
        even.push_back(t.half_total[0]);
        odd.push_back(t.half_total[1]);
      }
      const size_t fe = fastest_of(even), fo = fastest_of(odd);
      ++halves_compared;
      halves_agree += twin[fe] == twin[fo] ? 1 : 0;
      cj["fastest_even_rounds"] = cands[fe].pred.name();
      cj["fastest_odd_rounds"] = cands[fo].pred.name();
    }
    within5 += ratio <= 1.05 ? 1 : 0;
    ratios.push_back(ratio);
    cj["candidates"] = cand_json;
    cj["auto"] = cands[chosen].pred.name();
    cj["fastest"] = cands[oracle].pred.name();
    cj["auto_over_fastest"] = ratio;
    cj["regret"] = ratio;
    cj["auto_is_fastest"] = exact;
    cj["auto_is_fastest_program"] = same;
    if (cands[0].kind == schedule::Kind::kBaseline) {
      cj["auto_over_baseline"] = meas[0] / meas[chosen];
      speedups.push_back(meas[0] / meas[chosen]);
    }
    configs.push_back(cj);
    PolicyConfig pc;
    pc.auto_choice = cands[chosen].pred.name();
    for (size_t i = 0; i < cands.size(); ++i) {
      pc.measured_ms[cands[i].pred.name()] = meas[i];
      if (o.iters >= 2)
        for (int h = 0; h < 2; ++h) pc.half_ms[h][cands[i].pred.name()] = totals[i].half_total[h];
    }
    policy_configs.push_back(std::move(pc));
    // The rounds cannot order two schedules whose round ranges overlap (auto's fastest round
    // beat the fastest schedule's slowest one).
    const bool overlap = totals[chosen].min_total <= totals[oracle].max_total;
    if (!same) {
      wrong_within_rounds += overlap ? 1 : 0;
      wrong.push_back(fmt::format("[{}] {}: auto {}, fastest {}, regret {:.3f}{}", ci, desc,
                                  cands[chosen].pred.name(), cands[oracle].pred.name(), ratio,
                                  overlap ? " (their rounds overlap)" : ""));
    }
    std::string table =
        fmt::format("[{}] {}\n    {:<10} {:>10} {:>10} {:>7} {:>7} {:>6} {:>15} {:>15}", ci,
                    desc, "schedule", "pred ms", "meas ms", "error", "spread", "load",
                    "compute p / m", "rest p / m");
    for (size_t i = 0; i < cands.size(); ++i) {
      const double pc = pred_compute_ms[i], pt = cands[i].pred.total_us() / 1e3;
      const double mc = totals[i].compute;
      table += fmt::format("\n    {:<10} {:>10.2f} {:>10.2f} {:>+6.0f}% {:>6.0f}% {:>6.2f} {:>7.2f} {:>7.2f} "
                           "{:>7.2f} {:>7.2f}{}{}{}",
                           cands[i].pred.name(), pt, meas[i], 100.0 * (pt - meas[i]) / meas[i],
                           100.0 * totals[i].spread, loads[i], pc, mc, pt - pc, meas[i] - mc,
                           i == chosen ? "  <- auto" : "",
                           i == oracle ? "  <- fastest" : "",
                           twin[i] != i ? "  (same program as " + cands[twin[i]].pred.name() + ")"
                                        : std::string());
    }
    table += fmt::format("\n    auto {}, fastest {}, regret (auto / fastest) {:.3f}",
                         cands[chosen].pred.name(), cands[oracle].pred.name(), ratio);
    log(table);
  }
  auto share = [&](int64_t n) {
    return measured_configs ? static_cast<double>(n) / static_cast<double>(measured_configs) : 0.0;
  };
  const double accuracy = share(correct), distinct = share(correct_distinct);
  const double within = share(within5);
  nlohmann::json summary = {
      {"configs_in_grid", grid.configs.size()},
      {"configs_measured", measured_configs},
      {"configs_skipped", skipped},
      {"selection_accuracy", accuracy},
      {"selection_accuracy_distinct", distinct},
      {"auto_within_5pct_of_fastest", within},
      {"auto_over_fastest", {{"median", median(ratios)}, {"worst", max_of(ratios)}}},
      {"median_abs_relative_error", median(rel_errors)},
      {"abs_relative_error_max", max_of(rel_errors)},
      {"predictions_compared", rel_errors.size()},
      {"median_abs_relative_error_by_schedule", nlohmann::json::object()},
      {"wrong_choices", wrong},
      {"wrong_choices_rounds_overlap", wrong_within_rounds},
      {"measurement_self_agreement",
       {{"configs", halves_compared},
        {"share", halves_compared ? static_cast<double>(halves_agree) /
                                        static_cast<double>(halves_compared)
                                  : NAN}}},
      {"speedup_auto_over_baseline",
       {{"count", speedups.size()},
        {"min", speedups.empty() ? NAN : *std::min_element(speedups.begin(), speedups.end())},
        {"median", median(speedups)},
        {"max", max_of(speedups)},
        {"share_above_1_13", share_above(speedups, 1.13)}}},
      {"same_schedule_spread", {{"pairs", twins.size()},
                                {"median", median(twins)},
                                {"max", max_of(twins)}}},
      {"round_spread", {{"median", median(spreads)}, {"max", max_of(spreads)}}}};
  for (const auto& [name, errs] : by_schedule)
    summary["median_abs_relative_error_by_schedule"][name] = median(errs);
  const PolicyView policies = policy_view(policy_configs);
  nlohmann::json fixed = nlohmann::json::object();
  for (const FixedPolicy& f : policies.fixed)
    fixed[f.schedule] = {{"configs", f.configs},
                         {"total_ms", f.total_ms},
                         {"auto_total_ms", f.auto_total_ms},
                         {"over_auto", f.over_auto()}};
  summary["policies"] = {{"configs", policies.configs},
                         {"auto_total_ms", policies.auto_total_ms},
                         {"fastest_total_ms", policies.fastest_total_ms},
                         {"auto_over_fastest", policies.auto_over_fastest()},
                         {"fixed", fixed}};
  const PolicyHalves halves = policy_halves(policy_configs);
  if (halves.configs > 0) {
    nlohmann::json hj = {{"auto_over_cross_fastest", halves.auto_over_cross_fastest()},
                         {"auto_total_ms", halves.auto_total_ms},
                         {"cross_fastest_total_ms", halves.cross_fastest_total_ms}};
    for (const auto* v : {&halves.even, &halves.odd}) {
      nlohmann::json side = {{"auto_over_fastest", v->auto_over_fastest()}};
      for (const FixedPolicy& f : v->fixed) side["fixed"][f.schedule] = f.over_auto();
      hj[v == &halves.even ? "even" : "odd"] = side;
    }
    for (const auto& [name, verdict] : halves.verdicts) hj["verdicts"][name] = verdict_name(verdict);
    summary["policies"]["halves"] = hj;
  }
  summary["measured_over_predicted_by_schedule"] = nlohmann::json::object();
  std::string split;
  for (const auto& [name, parts] : part_ratios) {
    for (const auto& [part, r] : parts)
      summary["measured_over_predicted_by_schedule"][name][part] = median(r);
    split += fmt::format("\n  {:<10} compute {:.3f}  rest {:.3f}  total {:.3f}", name,
                         median(parts.at("compute")), median(parts.at("rest")),
                         median(parts.at("total")));
  }
  log(fmt::format("\n# sweep summary: {} configurations measured ({} skipped)", measured_configs,
                  skipped));
  log(fmt::format("selection accuracy (auto = measured fastest): {:.1f}% ({} of {}); counting "
                  "schedules that run the same program as one: {:.1f}% ({} of {}); auto within "
                  "5% of the fastest: {:.1f}%",
                  100.0 * accuracy, correct, measured_configs, 100.0 * distinct,
                  correct_distinct, measured_configs, 100.0 * within));
  log(fmt::format("auto / fastest (measured): median {:.3f}, worst {:.3f}", median(ratios),
                  max_of(ratios)));
  log(policy_table(policies));
  if (halves.configs > 0) log(halves_table(halves));
  if (halves_compared > 0)
    log(fmt::format("the measurement against itself: the even and the odd rounds measured the "
                    "same fastest program in {:.1f}% ({} of {}) of the configurations (where the "
                    "halves disagree, the measurement cannot confirm any choice)",
                    100.0 * halves_agree / static_cast<double>(halves_compared), halves_agree,
                    halves_compared));
  log(fmt::format("median |predicted - measured| / measured: {:.1f}% over {} (config, schedule) "
                  "pairs (max {:.1f}%)",
                  100.0 * median(rel_errors), rel_errors.size(), 100.0 * max_of(rel_errors)));
  std::string per;
  for (const auto& [name, errs] : by_schedule)
    per += fmt::format("  {} {:.1f}%", name, 100.0 * median(errs));
  log("median error by schedule:" + per);
  log("measured / predicted, median per schedule, of the compute steps (the slowest rank's, by "
      "the executor's step timers), the rest (total - compute: collectives, waits, the "
      "executor's own work) and the total:" + split);
  if (!speedups.empty())
    log(fmt::format("measured speedup of auto over the baseline: min {:.3f}, median {:.3f}, max "
                    "{:.3f}; above 1.13x in {:.1f}% of {} configurations",
                    *std::min_element(speedups.begin(), speedups.end()), median(speedups),
                    max_of(speedups), 100.0 * share_above(speedups, 1.13), speedups.size()));
  log(fmt::format("spread over the rounds, (slowest - fastest) / median of one schedule: median "
                  "{:.1f}%, max {:.1f}% over {} (config, schedule) pairs",
                  100.0 * median(spreads), 100.0 * max_of(spreads), spreads.size()));
  if (!twins.empty())
    log(fmt::format("noise floor: candidates that run the same program measured {:.1f}% apart "
                    "(median over {} pairs, max {:.1f}%)",
                    100.0 * median(twins), twins.size(), 100.0 * max_of(twins)));
  log(fmt::format("configurations where auto does not run the measured fastest program: {} ({} "
                  "of them where auto's rounds and the fastest's overlap: the measurement "
                  "cannot order the two)",
                  wrong.size(), wrong_within_rounds));
  for (const auto& w : wrong) log("  " + w);
  return {{"grid", o.grid_path},   {"profile", o.profile_path}, {"world", o.world},
          {"ranks_per_node", rpn}, {"iters", o.iters},          {"warmup", o.warmup},
          {"chunks", grid.chunks}, {"summary", summary},        {"configs", configs}};
}

}  // namespace parm::perfmodel
