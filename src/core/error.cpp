#include "parm/error.h"

namespace parm::detail {

void throw_check_failure(const char* file, int line, const char* cond,
                         const std::string& msg) {
  throw Error(fmt::format("check failed at {}:{}: {} ({})", file, line, cond, msg));
}

}  // namespace parm::detail
