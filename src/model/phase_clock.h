// Model::time_phases: the wall time between phase boundaries of the passes, added to the
// phase that ends at each (the device's queued work waited for at every boundary).
#pragma once

#include "moe/phase_times.h"
#include "parm/device.h"
#include "parm/timer.h"

namespace parm::model {

class PhaseClock {
 public:
  explicit PhaseClock(Device device) : device_(device) {}
  // Where the times go (+=); null (the default): not timed, every call does nothing.
  void set_output(moe::PhaseTimes* out) { out_ = out; }

  // A boundary that ends no phase: the time from here goes to the next end_phase.
  void start_phase() { boundary(nullptr); }
  // The time since the last boundary goes to `name` (a string literal); a new phase starts.
  void end_phase(const char* name) { boundary(name); }

 private:
  void boundary(const char* name) {
    if (out_ == nullptr) return;
    if (device_ != Device::kCpu) device_sync();
    const double t = now_us();
    if (name != nullptr) out_->add(name, t - last_us_);
    last_us_ = t;
  }

  Device device_;
  moe::PhaseTimes* out_ = nullptr;
  double last_us_ = 0.0;  // the last boundary
};

}  // namespace parm::model
