#include "comm/tracked_request.h"

#include <sched.h>

#include <utility>

namespace parm {

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
  for (int spins = 0; !poll(); ++spins) {
    if (spins > 64) sched_yield();
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
