#include "comm/tracked_request.h"

#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

#include "parm/error.h"

namespace parm {
namespace {

constexpr int kMaxWaitSleepUs = 10000;
constexpr int kUnset = -1;
std::atomic<int> g_wait_sleep_us{kUnset};

}  // namespace

int parse_wait_sleep_us(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || *end != '\0' || v > kMaxWaitSleepUs)
    throw InvalidConfig("PARM_WAIT_SLEEP_US='" + std::string(text) +
                        "': valid values are integers from 0 (yield, the default) to " +
                        std::to_string(kMaxWaitSleepUs) + " (microseconds slept between polls)");
  return static_cast<int>(v);
}

int wait_sleep_us() {
  int us = g_wait_sleep_us.load(std::memory_order_relaxed);
  if (us == kUnset) {
    us = parse_wait_sleep_us(std::getenv("PARM_WAIT_SLEEP_US"));
    g_wait_sleep_us.store(us, std::memory_order_relaxed);
  }
  return us;
}

void set_wait_sleep_us(int us) {
  if (us < 0 || us > kMaxWaitSleepUs)
    throw InvalidConfig("set_wait_sleep_us(" + std::to_string(us) + "): valid 0 to " +
                        std::to_string(kMaxWaitSleepUs) + " microseconds");
  g_wait_sleep_us.store(us, std::memory_order_relaxed);
}

bool TrackedRequest::test() {
  if (state_ == State::kDone) return true;
  if (state_ == State::kFailed) rethrow();
  try {
    if (!poll()) return false;
    complete();
  } catch (...) {
    fail(std::current_exception());
    throw;
  }
  return true;
}

void TrackedRequest::wait() {
  if (state_ == State::kDone) return;
  if (state_ == State::kFailed) rethrow();
  check_waitable();
  try {
    block();
    complete();
  } catch (...) {
    fail(std::current_exception());
    throw;
  }
}

void TrackedRequest::block() {
  const int sleep_us = wait_sleep_us();
  const timespec pause{0, static_cast<long>(sleep_us) * 1000};
  for (int spins = 0; !poll(); ++spins) {
    if (spins > 64) {
      if (sleep_us > 0)
        nanosleep(&pause, nullptr);
      else
        sched_yield();
    }
    if ((spins & 255) == 0) watchdog();
  }
}

void TrackedRequest::settle() noexcept {
  if (state_ != State::kPending) return;
  try {
    wait();
  } catch (...) {
  }
}

void TrackedRequest::complete() {
  if (state_ != State::kPending) return;
  on_done();
  state_ = State::kDone;
}

void TrackedRequest::fail(std::exception_ptr error) {
  if (state_ != State::kPending) return;
  state_ = State::kFailed;
  error_ = std::move(error);
}

void TrackedRequest::rethrow() const { std::rethrow_exception(error_); }

}  // namespace parm
