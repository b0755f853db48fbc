// Whether two built schedules are one program: the executor (MoeLayer) runs the same steps
// on the same buffers with the same layer numbers, so they differ in name only (the baseline
// is S2 unfused where N_ESP = 1). Compares the step lists, not the schedules' kinds, labels
// or buffer names.
#pragma once

#include "schedule/schedule.h"

namespace parm::perfmodel {

bool same_program(const schedule::Schedule& a, const schedule::Schedule& b);

}  // namespace parm::perfmodel
