#include "parm/error.h"

namespace parm {

std::string divisors_of(int64_t n) {
  std::string s;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

}  // namespace parm

namespace parm::detail {

void throw_check_failure(const char* file, int line, const char* cond,
                         const std::string& msg) {
  throw Error(fmt::format("check failed at {}:{}: {} ({})", file, line, cond, msg));
}

}  // namespace parm::detail
