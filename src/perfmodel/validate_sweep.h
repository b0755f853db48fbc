// The cost model checked against this machine (`parm bench-layer --sweep GRID --profile P`):
// every candidate schedule of every grid configuration that fits the job is predicted and
// measured, and the model's choice is scored against the measured fastest (selection
// accuracy, auto / fastest, prediction error).
// Collective over the world: every rank calls it with the same options.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "parm/device.h"
#include "parm/topology.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {

struct SweepOptions {
  std::string grid_path;      // grid file (configs/grids/*.json)
  Profile profile;            // the model's costs
  std::string profile_path;   // where they came from (for the report)
  int world = 1;              // ranks in the job: a configuration must fit it
  TopologyOptions topology;   // device, communicator, ranks per node; mp/ep/esp: the grid's
  Precision precision = Precision::kFp32;
  int iters = 10;             // timed iterations per candidate, the candidates' interleaved
  int warmup = 2;
};

// Measures the grid and returns the report: {grid, profile, world, ranks_per_node, iters,
// warmup, chunks, summary: {configs_in_grid, configs_measured, configs_skipped,
// selection_accuracy, selection_accuracy_distinct, auto_within_5pct_of_fastest,
// auto_over_fastest: {median, worst}, median_abs_relative_error, abs_relative_error_max,
// predictions_compared, median_abs_relative_error_by_schedule, wrong_choices: [lines],
// wrong_choices_rounds_overlap, measurement_self_agreement: {configs, share},
// policies: {configs, auto_total_ms, fastest_total_ms, auto_over_fastest, fixed: {schedule:
// {configs, total_ms, auto_total_ms, over_auto}}} (sweep_policies.h),
// speedup_auto_over_baseline, same_schedule_spread: {pairs,
// median, max}, round_spread: {median, max}, measured_over_predicted_by_schedule: {schedule:
// {compute, rest, total}}}, configs: [one row per measured configuration:
// its shape and layout, candidates (schedule, predicted_ms, predicted_fwd_ms,
// predicted_bwd_ms, measured_ms, measured_fwd_ms, measured_bwd_ms, measured_min_ms,
// measured_max_ms, measured_spread, predicted_balanced_ms, busiest_rank_expert_rows,
// load_max_over_mean, measured_compute_ms, measured_rest_ms, measured_compute_step_max_ms,
// measured_outside_steps_ms, predicted_compute_ms, predicted_rest_ms, same_program_as where it
// has a twin), auto, fastest, auto_over_fastest
// (= regret), auto_is_fastest, auto_is_fastest_program, auto_over_baseline where there is a
// baseline]}.
// The candidates of a configuration run in rounds (each once per round, the order rotated
// every round); each one's time is its median round, its spread (slowest - fastest round) /
// median. The predictions price each candidate with Target::load_max_over_mean from its
// busiest rank's filled rows in the measured forward passes (the routing: fixed parameters
// and input, so the same in every round); auto is chosen from those.
// selection_accuracy: auto is the measured fastest candidate. selection_accuracy_distinct:
// auto runs the same program as the measured fastest (same_program.h: the baseline and S2
// unfused where N_ESP = 1); those pairs' measured spread is the noise floor. A wrong choice
// whose rounds overlap the fastest's (auto's fastest round <= the fastest's slowest) is one
// the measurement cannot order: wrong_choices_rounds_overlap counts them.
// measurement_self_agreement: the share of configurations (with 2 or more rounds) whose even
// rounds and odd rounds, each taken as a measurement of its own (median per candidate),
// measured the same fastest program (fastest_even_rounds, fastest_odd_rounds per row): how
// often the measurement confirms its own choice.
// The split: measured_compute_ms is the compute steps by the executor's own step timers
// (measured_steps.h), median over the rounds of the slowest rank's sum;
// measured_compute_step_max_ms the median of the sum over compute steps of each step's slowest
// rank; measured_rest_ms = measured_ms - measured_compute_ms (collective steps with their
// local copies and waits for peers, the executor's own work); measured_outside_steps_ms the
// median over the rounds of the largest rank's pass time outside every step timer (the
// executor's own work: the part of the rest not in a collective step); predicted_compute_ms the same
// steps' price (model.h compute_steps_us), predicted_rest_ms = predicted_ms - it.
// measured_over_predicted_by_schedule: the median over configurations of each part's
// measured / predicted.
// `log` receives the progress lines and the summary (on every rank; print them on rank 0).
// Throws InvalidConfig for bad options or an unreadable grid before any measurement.
nlohmann::json validate_sweep(const SweepOptions& options,
                              const std::function<void(const std::string&)>& log);

}  // namespace parm::perfmodel
