// What the auxiliary load-balancing loss l_aux is computed over (docs/spec.md §7, "Aux-loss
// scope"): each gate call's tokens (a micro-batch of an MP group; the default), each sequence
// of them (DeepSeek-V3's sequence-wise balance loss: the mean over the sequences of each one's
// l_aux; MoeShape::aux_seq_len), or every token of the micro-step on all data-parallel
// replicas (Megatron-Core's global aux loss: the gate statistics summed over dp before the
// product).
#pragma once

#include <string>

namespace parm {

enum class AuxScope { kMicroBatch, kSequence, kGlobal };

// "micro-batch", "sequence", "global".
const char* aux_scope_name(AuxScope s);
// The inverse of aux_scope_name; throws parm::InvalidConfig naming the bad text and the valid
// ones.
AuxScope parse_aux_scope(const std::string& text);

}  // namespace parm
