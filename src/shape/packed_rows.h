// The packed layout of dropless routing (docs/dropless.md, "Worst case per buffer"): a
// buffer's segments (one per expert, or per block and local expert) hold their routed rows
// back to back, segment i starting right after the routed rows of the segments before it.
// The buffer is sized by the bound on the rows routed, not by E x T slots. The gate's row
// numbers, the experts and the row exchanges' segment views all take their segment starts
// from packed_starts, so the layout has one definition.
#pragma once

#include <cstdint>

#include "parm/host_device.h"

namespace parm {

// first[i] = fill[0] + ... + fill[i - 1] for i in [0, count) (rows); returns the total. Host
// and device (the CUDA gate's pack kernel forms the starts where the fill counts live).
template <typename Fill, typename First>
PARM_HD int64_t packed_starts(const Fill* fill, int64_t count, First* first) {
  int64_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    first[i] = static_cast<First>(at);
    at += static_cast<int64_t>(fill[i]);
  }
  return at;
}

}  // namespace parm
