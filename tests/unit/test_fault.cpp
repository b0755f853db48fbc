// PARM_FAULT, the one entry point of fault injection (core/fault.h): what it accepts and what
// it refuses. The faults themselves run in tests/cli/train.sh (a rank that dies, a save that
// crashes).
#include <gtest/gtest.h>

#include "core/fault.h"
#include "parm/error.h"

namespace parm::fault {
namespace {

TEST(Fault, ParsesTheDocumentedForms) {
  const Plan none = parse("");
  EXPECT_EQ(none.kill_rank, -1);
  EXPECT_EQ(none.crash_save_after_files, -1);
  const Plan kill = parse("kill_rank=1,kill_at_step=4");
  EXPECT_EQ(kill.kill_rank, 1);
  EXPECT_EQ(kill.kill_at_step, 4);
  EXPECT_EQ(kill.crash_save_after_files, -1);
  EXPECT_EQ(parse("crash_save_after_files=2").crash_save_after_files, 2);
}

TEST(Fault, RefusesWhatItDoesNotKnow) {
  for (const char* bad : {"kill_rank=1", "kill_at_step=3", "crash=1", "kill_rank=-1,kill_at_step=2",
                          "crash_save_after_files=", "crash_save_after_files=2x",
                          "crash_save_after_files=99999999999"}) {
    try {
      parse(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InvalidConfig& e) {
      EXPECT_NE(std::string(e.what()).find("PARM_FAULT"), std::string::npos) << e.what();
    }
  }
}

TEST(Fault, HooksDoNothingWithoutAPlan) {
  if (plan().kill_rank >= 0 || plan().crash_save_after_files >= 0)
    GTEST_SKIP() << "PARM_FAULT is set in this environment";
  at_training_step(0, 0);
  EXPECT_NO_THROW(before_checkpoint_file(1000, "step-00000001"));
}

}  // namespace
}  // namespace parm::fault
