// Wall time of the named phases inside one compute step (the gate's products, softmax,
// top-k, ...; the experts' products, activation, row copies), for `bench-layer --breakdown`.
// Phase names are string literals; a step reports at most PhaseTimes::kMax of them, always
// in the same order. Nothing here allocates.
#pragma once

#include <cstring>

#include "parm/timer.h"

namespace parm::moe {

struct PhaseTimes {
  static constexpr int kMax = 8;
  const char* names[kMax] = {};
  double us[kMax] = {};
  int num = 0;

  // Zeroes the times; keeps the names (and their order).
  void clear() {
    for (double& u : us) u = 0.0;
  }
  void add(const char* name, double dt_us) {
    for (int i = 0; i < num; ++i)
      if (names[i] == name || std::strcmp(names[i], name) == 0) {
        us[i] += dt_us;
        return;
      }
    if (num == kMax) return;  // a programming error, but timing must never throw
    names[num] = name;
    us[num++] = dt_us;
  }
};

// Attributes the time since the previous lap (or construction) to a phase; does nothing
// (not even read the clock) when `out` is null.
class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes* out) : out_(out), t_(out != nullptr ? now_us() : 0.0) {}
  void lap(const char* name) {
    if (out_ == nullptr) return;
    const double t = now_us();
    out_->add(name, t - t_);
    t_ = t;
  }

 private:
  PhaseTimes* out_;
  double t_;
};

}  // namespace parm::moe
