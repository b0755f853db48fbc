// The request state machine shared by every backend (src/comm/tracked_request.h), driven by
// a scripted request: completion runs the completion work exactly once; a failure is final
// and rethrown (the same error) by every later test() and wait(), and never runs the
// completion work.
#include <gtest/gtest.h>

#include <string>

#include "comm/tracked_request.h"
#include "parm/error.h"

namespace parm {
namespace {

class Scripted final : public TrackedRequest {
 public:
  int polls_until_done = 1 << 30;  // poll() reports completion on this poll
  int watchdogs_until_timeout = 1 << 30;
  int polls = 0, watchdogs = 0, completions = 0;

  ~Scripted() override { settle(); }

 private:
  bool poll() override { return ++polls >= polls_until_done; }
  void watchdog() override {
    if (++watchdogs >= watchdogs_until_timeout)
      throw Timeout("scripted timeout #" + std::to_string(watchdogs));
  }
  void on_done() override { ++completions; }
};

TEST(TrackedRequest, CompletionRunsOnceAndStaysDone) {
  Scripted r;
  r.polls_until_done = 3;
  EXPECT_FALSE(r.test());
  EXPECT_FALSE(r.test());
  EXPECT_TRUE(r.test());
  EXPECT_TRUE(r.done());
  r.wait();
  EXPECT_TRUE(r.test());
  EXPECT_EQ(r.completions, 1);
  EXPECT_EQ(r.polls, 3);
}

TEST(TrackedRequest, TimeoutIsFinalAndRethrownByEveryLaterCall) {
  Scripted r;
  r.watchdogs_until_timeout = 2;
  std::string first;
  try {
    r.wait();
    FAIL() << "the scripted request completed";
  } catch (const Timeout& e) {
    first = e.what();
  }
  EXPECT_EQ(first, "scripted timeout #2");
  EXPECT_TRUE(r.failed());
  EXPECT_FALSE(r.recyclable());
  r.polls_until_done = 0;  // the library now reports completion: too late
  for (int i = 0; i < 3; ++i) {
    try {
      r.wait();
      ADD_FAILURE() << "wait() returned after the timeout";
    } catch (const Timeout& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
    try {
      (void)r.test();
      ADD_FAILURE() << "test() returned after the timeout";
    } catch (const Timeout& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
  }
  EXPECT_EQ(r.completions, 0);
  EXPECT_EQ(r.watchdogs, 2);  // no waiting after the failure
}

// PARM_WAIT_SLEEP_US: empty or unset is 0 (yield); integers 0..10000; anything else is
// refused with the variable's name and the valid range.
TEST(WaitPolicy, ParsesTheSleepVariable) {
  EXPECT_EQ(parse_wait_sleep_us(nullptr), 0);
  EXPECT_EQ(parse_wait_sleep_us(""), 0);
  EXPECT_EQ(parse_wait_sleep_us("0"), 0);
  EXPECT_EQ(parse_wait_sleep_us("20"), 20);
  EXPECT_EQ(parse_wait_sleep_us("10000"), 10000);
  for (const char* bad : {"-1", "10001", "20us", "x", " 5"}) {
    try {
      parse_wait_sleep_us(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidConfig& e) {
      EXPECT_NE(std::string(e.what()).find("PARM_WAIT_SLEEP_US"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("10000"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(set_wait_sleep_us(-1), InvalidConfig);
}

// Sleeping between polls still ends at the poll that completes, with the watchdog between.
TEST(WaitPolicy, SleepingWaitEndsAtCompletion) {
  const int before = wait_sleep_us();
  set_wait_sleep_us(1);
  EXPECT_EQ(wait_sleep_us(), 1);
  {
    Scripted r;
    r.polls_until_done = 300;
    r.wait();
    EXPECT_TRUE(r.done());
    EXPECT_EQ(r.polls, 300);
    EXPECT_EQ(r.completions, 1);
    EXPECT_EQ(r.watchdogs, 2);  // before polls 1 and 257
  }
  set_wait_sleep_us(before);
}

}  // namespace
}  // namespace parm
