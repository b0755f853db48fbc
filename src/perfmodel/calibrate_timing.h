// calibrate's measurement harness: timings taken on every rank at once (the slowest rank's
// median), the buffers and sizes they run on, and the progress log. Collective over `world`:
// every rank calls each timing with the same arguments.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "parm/comm.h"
#include "parm/stats.h"
#include "parm/timer.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate.h"

namespace parm::perfmodel {

// Times `fn` on every rank at once (after a world barrier), warmup + iters times; returns
// the median over iterations of the slowest rank's time.
template <typename Fn>
double time_all_ranks(Communicator& world, int warmup, int iters, Fn&& fn) {
  std::vector<double> t;
  for (int it = 0; it < warmup + iters; ++it) {
    world.barrier();
    const double t0 = now_us();
    fn();
    const double dt = now_us() - t0;
    if (it >= warmup) t.push_back(dt);
  }
  return median(max_over_ranks(world, t));
}

// Three variants run(0), run(1), run(2) timed as time_all_ranks does, their iterations
// interleaved (so that load changes hit them alike); the three medians of the slowest rank.
template <typename Fn>
std::array<double, 3> time_three_interleaved(Communicator& world, int warmup, int iters,
                                             Fn&& run) {
  std::array<std::vector<double>, 3> t;
  for (int it = 0; it < warmup + iters; ++it)
    for (int v = 0; v < 3; ++v) {
      world.barrier();
      const double t0 = now_us();
      run(v);
      const double dt = now_us() - t0;
      if (it >= warmup) t[static_cast<size_t>(v)].push_back(dt);
    }
  std::array<double, 3> out;
  for (size_t v = 0; v < 3; ++v) out[v] = median(max_over_ranks(world, std::move(t[v])));
  return out;
}

// Times `fn` as time_all_ranks does, each sample repeating it back to back for about
// `window_us` (CalibrateOptions::compute_window_us) and returning the time of one call: the
// repeat count comes from one timed warm-up call, the slowest rank's, so every rank runs as
// many (at most 1000). window_us 0: one call per sample, after one warm-up call.
template <typename Fn>
double time_all_ranks_windowed(Communicator& world, int iters, double window_us, Fn&& fn) {
  if (window_us <= 0.0) return time_all_ranks(world, 1, iters, fn);
  fn();  // first call: oneDNN creates its kernels, caches warm up
  world.barrier();
  const double t0 = now_us();
  fn();
  const double once = max_over_ranks(world, std::vector<double>{now_us() - t0}).at(0);
  const int reps = static_cast<int>(std::clamp(std::ceil(window_us / std::max(once, 1.0)), 1.0,
                                               1000.0));
  return time_all_ranks(world, 0, iters, [&] {
           for (int r = 0; r < reps; ++r) fn();
         }) /
         reps;
}

// The collective buffer sizes measured: min_bytes .. max_bytes per rank in x4 steps.
std::vector<int64_t> collective_sizes(const CalibrateOptions& o);

// A buffer of n floats on `dev`, every value `v`.
std::unique_ptr<BenchBuffer> filled(BenchDevice& dev, size_t n, float v);

// calibrate's progress log: formats a line and hands it to the caller's log function.
struct Logger {
  const std::function<void(const std::string&)>& log;
  template <typename... Args>
  void operator()(fmt::format_string<Args...> f, Args&&... args) const {
    log(fmt::format(f, std::forward<Args>(args)...));
  }
};

}  // namespace parm::perfmodel
