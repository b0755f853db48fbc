// The names of --recompute's modes (model/model.h).
#include <algorithm>

#include "model/model.h"
#include "parm/error.h"

namespace parm::model {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kMoeAct: return "moe-act";
    case Recompute::kMoe: return "moe";
    case Recompute::kBlock: return "block";
  }
  return "?";
}

int recompute_lanes(Recompute r, int lanes, int slots) {
  const bool shared = r == Recompute::kBlock || r == Recompute::kMoe;
  return shared ? std::max(1, std::min(lanes, slots)) : 1;
}

Recompute parse_recompute(const std::string& name) {
  for (Recompute r : {Recompute::kNone, Recompute::kMoeAct, Recompute::kMoe, Recompute::kBlock})
    if (name == recompute_name(r)) return r;
  throw InvalidConfig(fmt::format(
      "--recompute (train.recompute) '{}' is not valid; use none, moe-act, moe or block", name));
}

}  // namespace parm::model
