#include "shape/aux_scope.h"

#include "parm/error.h"

namespace parm {

const char* aux_scope_name(AuxScope s) {
  switch (s) {
    case AuxScope::kMicroBatch: return "micro-batch";
    case AuxScope::kSequence: return "sequence";
    case AuxScope::kGlobal: return "global";
  }
  return "?";
}

AuxScope parse_aux_scope(const std::string& text) {
  if (text == "micro-batch") return AuxScope::kMicroBatch;
  if (text == "sequence") return AuxScope::kSequence;
  if (text == "global") return AuxScope::kGlobal;
  throw InvalidConfig(fmt::format(
      "--aux-loss (model.aux_loss) '{}' is not valid; use micro-batch (l_aux of each gate "
      "call), sequence (the mean over the sequences of each one's l_aux) or global (the gate "
      "statistics summed over the data-parallel replicas first)",
      text));
}

}  // namespace parm
