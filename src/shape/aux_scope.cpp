#include "shape/aux_scope.h"

#include "parm/error.h"

namespace parm {

const char* aux_scope_name(AuxScope s) {
  return s == AuxScope::kGlobal ? "global" : "micro-batch";
}

AuxScope parse_aux_scope(const std::string& text) {
  if (text == "micro-batch") return AuxScope::kMicroBatch;
  if (text == "global") return AuxScope::kGlobal;
  PARM_CONFIG_CHECK(text != "sequence",
                    "--aux-loss (model.aux_loss) 'sequence' (DeepSeek-V3's sequence-wise "
                    "balance loss) is not implemented yet; use micro-batch or global");
  throw InvalidConfig(fmt::format(
      "--aux-loss (model.aux_loss) '{}' is not valid; use micro-batch (l_aux of each gate "
      "call) or global (the gate statistics summed over the data-parallel replicas first)",
      text));
}

}  // namespace parm
