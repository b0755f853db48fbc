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
// selection_accuracy, auto_within_5pct_of_fastest, auto_over_fastest: {median, worst},
// median_abs_relative_error, abs_relative_error_max, predictions_compared,
// median_abs_relative_error_by_schedule, wrong_choices: [lines], same_schedule_spread:
// {pairs, median, max}}, configs: [one row per measured configuration: its shape and layout,
// candidates (schedule, predicted_ms, predicted_fwd_ms, predicted_bwd_ms, measured_ms,
// measured_fwd_ms, measured_bwd_ms, predicted_balanced_ms, busiest_rank_expert_rows), auto,
// fastest, auto_over_fastest (= regret), auto_is_fastest]}.
// The predictions price each candidate's expert rows from the busiest rank's filled rows in
// the measured forward passes (the routing: fixed parameters and input, so the same in every
// iteration); auto is chosen from those. Candidates priced exactly alike run the same step
// list: choosing either counts as choosing the fastest, and their measured spread is
// reported as the noise floor.
// `log` receives the progress lines and the summary (on every rank; print them on rank 0).
// Throws InvalidConfig for bad options or an unreadable grid before any measurement.
nlohmann::json validate_sweep(const SweepOptions& options,
                              const std::function<void(const std::string&)>& log);

}  // namespace parm::perfmodel
