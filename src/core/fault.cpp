#include "core/fault.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "parm/error.h"

namespace parm::fault {
namespace {

int64_t parse_number(const std::string& key, const std::string& value, int64_t max) {
  size_t used = 0;
  int64_t v = -1;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  PARM_CONFIG_CHECK(used == value.size() && !value.empty() && v >= 0 && v <= max,
                    "PARM_FAULT: {}={} is not valid: it takes a whole number in 0..{}", key,
                    value, max);
  return v;
}

}  // namespace

Plan parse(const std::string& spec) {
  Plan p;
  const int64_t max_int = std::numeric_limits<int>::max();
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "kill_rank")
      p.kill_rank = static_cast<int>(parse_number(key, value, max_int));
    else if (key == "kill_at_step")
      p.kill_at_step = parse_number(key, value, std::numeric_limits<int64_t>::max());
    else if (key == "crash_save_after_files")
      p.crash_save_after_files = static_cast<int>(parse_number(key, value, max_int));
    else
      throw InvalidConfig(fmt::format(
          "PARM_FAULT: unknown key '{}' in '{}'; valid keys: kill_rank, kill_at_step (both "
          "together), crash_save_after_files",
          key, spec));
  }
  PARM_CONFIG_CHECK((p.kill_rank < 0) == (p.kill_at_step < 0),
                    "PARM_FAULT '{}': kill_rank and kill_at_step go together", spec);
  return p;
}

const Plan& plan() {
  static const Plan p = [] {
    const char* spec = std::getenv("PARM_FAULT");
    return parse(spec == nullptr ? "" : spec);
  }();
  return p;
}

void at_training_step(int world_rank, int64_t step) {
  const Plan& p = plan();
  if (p.kill_rank != world_rank || p.kill_at_step != step) return;
  std::fprintf(stderr, "parm train: rank %d dies at step %lld (PARM_FAULT)\n", world_rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  ::raise(SIGKILL);
}

void before_checkpoint_file(int files_written, const std::string& checkpoint) {
  const Plan& p = plan();
  if (p.crash_save_after_files >= 0 && files_written >= p.crash_save_after_files)
    throw Error(fmt::format("simulated crash while saving {} after {} tensor files (PARM_FAULT)",
                            checkpoint, files_written));
}

}  // namespace parm::fault
