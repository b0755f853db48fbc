// Fault injection for the tests, in one place: the environment variable PARM_FAULT, read
// once per process. Unset or empty: no fault, and every hook below does nothing.
//
//   PARM_FAULT=kill_rank=R,kill_at_step=S   world rank R kills itself (SIGKILL) as training
//                                           step S (0-based) starts: a rank lost mid-job
//   PARM_FAULT=crash_save_after_files=N     a checkpoint save throws parm::Error before its
//                                           tensor file N+1 (N files written): a crash mid-save
//
// Keys combine with ','. An unknown key or a malformed value is refused (InvalidConfig)
// listing the valid keys. README.md (Fuzz tests and fault injection) lists the tests that
// use it.
#pragma once

#include <cstdint>
#include <string>

namespace parm::fault {

struct Plan {
  int kill_rank = -1;             // -1: no rank dies
  int64_t kill_at_step = -1;
  int crash_save_after_files = -1;  // -1: saves complete
};

// Parses a PARM_FAULT value ("" is no fault).
Plan parse(const std::string& spec);
// The process's plan: PARM_FAULT, parsed on first use.
const Plan& plan();

// The training loop's hook, at the start of each step.
void at_training_step(int world_rank, int64_t step);
// The checkpoint saver's hook, before writing a tensor file when `files_written` are done.
void before_checkpoint_file(int files_written, const std::string& checkpoint);

}  // namespace parm::fault
