// Process memory, for reports.
#pragma once

#include <cstdint>

namespace parm {

// Peak resident set size of this process so far (bytes; getrusage's ru_maxrss).
int64_t peak_rss_bytes();
// Resident set size now (bytes; /proc/self/statm), or -1 where it cannot be read.
int64_t current_rss_bytes();

}  // namespace parm
