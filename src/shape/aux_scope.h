// What the auxiliary load-balancing loss l_aux is computed over (docs/spec.md §7, "Aux-loss
// scope"): each gate call's tokens (a micro-batch of an MP group; the default), or every
// token of the micro-step on all data-parallel replicas (Megatron-Core's global aux loss:
// the gate statistics summed over dp before the product).
#pragma once

#include <string>

namespace parm {

enum class AuxScope { kMicroBatch, kGlobal };

// "micro-batch", "global".
const char* aux_scope_name(AuxScope s);
// The inverse of aux_scope_name; throws parm::InvalidConfig naming the bad text and the valid
// ones (and, for "sequence", that it is not implemented yet).
AuxScope parse_aux_scope(const std::string& text);

}  // namespace parm
