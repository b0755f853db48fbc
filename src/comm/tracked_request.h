// The one state machine of every backend's requests (MPI, staged, NCCL):
//
//   pending --(the library reports completion; the completion work ran)--> done
//   pending --(a Timeout, a library error, a failed completion step)-----> failed
//
// Done and failed are final. A done request answers test() true and wait() at once. A
// failed one rethrows the very error that failed it on every later test() and wait(), so a
// timed-out operation can never later report success. The backend's own rule for a failed
// request: the library may still write into its buffers (an abandoned receive can complete
// at any later time), so they are never handed out again (leaked, not given back to a
// pool), and its storage is never recycled (recycled.h asks recyclable()).
//
// A backend supplies poll() (ask the library once), watchdog() (the deadline check between
// polls) and on_done() (the completion work: sums, copies back, buffers returned, counters
// recorded); block() waits through them, or is replaced (a staged request waits through its
// host request, whose own watchdog bounds it).
#pragma once

#include <exception>

#include "parm/comm.h"

namespace parm {

// How a waiting rank spends the time between polls once the first few have failed: 0 yields
// the core (sched_yield; the default), n > 0 sleeps n microseconds. Where ranks outnumber the
// cores, Linux's CFS hands a yielding rank the core straight back while its virtual runtime
// is the lowest, so it can spin through much of a time slice that the rank it waits for
// needed; a sleeping rank leaves the run queue (and wakes up to n us, plus the timer slack,
// late). Process-wide; set from PARM_WAIT_SLEEP_US at the first wait unless set before.
int wait_sleep_us();
void set_wait_sleep_us(int us);
// PARM_WAIT_SLEEP_US's value: null or empty is 0; else an integer in [0, 10000], or throws
// InvalidConfig naming the variable and the valid range.
int parse_wait_sleep_us(const char* text);

class TrackedRequest : public Request {
 public:
  bool test() final;
  void wait() final;

  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }
  // For recycled.h: a failed request's storage is freed, never reused.
  bool recyclable() const { return !failed(); }

 protected:
  TrackedRequest() = default;
  ~TrackedRequest() override = default;

  // Asks the library once: true when it reports the operation complete. Throws on a library
  // error (the request then fails with that error).
  virtual bool poll() = 0;
  // Between polls while waiting: throws parm::Timeout past the deadline (or the library's
  // asynchronous error); the request then fails with it.
  virtual void watchdog() = 0;
  // Runs once, when poll() first reports completion. A throw fails the request.
  virtual void on_done() = 0;
  // Returns once poll() reported completion; throws on failure. Default: poll, yielding the
  // core (or sleeping: wait_sleep_us()) after a few tries (ranks may outnumber cores), with
  // watchdog() every 256 polls.
  virtual void block();
  // Throws, without failing the request, when waiting now could never return (an NCCL
  // request whose group has not been issued yet).
  virtual void check_waitable() {}

  // For the destructors of derived classes (a destructor cannot call the virtual hooks once
  // the derived part is gone): waits for a pending request, swallowing its error (the
  // failure was, or will be, reported by whoever waited), so the request ends done or failed.
  void settle() noexcept;
  // pending -> failed with `error`, for a failure seen outside test() and wait() (an NCCL
  // group that could not be issued).
  void fail(std::exception_ptr error);

 private:
  enum class State { kPending, kDone, kFailed };
  void complete();  // pending -> done (runs on_done)
  [[noreturn]] void rethrow() const;

  State state_ = State::kPending;
  std::exception_ptr error_;
};

}  // namespace parm
