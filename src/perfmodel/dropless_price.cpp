#include "perfmodel/dropless_price.h"

#include <algorithm>

namespace parm::perfmodel {

double dropless_share(const schedule::Schedule& sc, const schedule::Step& s,
                      const MoeShape& shape, double load_max_over_mean) {
  if (!schedule::moves_routed_rows(sc, s)) return 1.0;  // tokens, or worst-case buffers
  // Every segmented buffer holds segments of `slots` rows; a segment of the dispatch buffer
  // (dispatch_slots rows) routes k T_gate / E rows on average, a smaller segment (S2's
  // slice) its share of them: the same fraction of every segmented buffer's rows.
  const double routed = static_cast<double>(shape.topk) * static_cast<double>(sc.gate_tokens) /
                        static_cast<double>(shape.experts);
  const double share =
      routed / static_cast<double>(std::max<int64_t>(sc.dispatch_slots, 1)) * load_max_over_mean;
  return std::min(1.0, share);
}

}  // namespace parm::perfmodel
