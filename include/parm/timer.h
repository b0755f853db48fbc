// Wall-clock timing in microseconds (steady clock).
#pragma once

#include <chrono>

namespace parm {

inline double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer() : start_us_(now_us()) {}
  void reset() { start_us_ = now_us(); }
  double elapsed_us() const { return now_us() - start_us_; }
  double elapsed_ms() const { return elapsed_us() / 1000.0; }

 private:
  double start_us_;
};

}  // namespace parm
