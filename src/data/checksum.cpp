#include "data/checksum.h"

#include <fmt/format.h>

namespace parm::data {

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace parm::data
