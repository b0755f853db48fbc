// Pricing of dropless schedules (docs/dropless.md): their exchanges carry the routed rows,
// not the worst-case buffers the step list names. Each rank routes about k x T_gate choices
// (the mean); an exchange waits for its busiest rank, so the routed rows are scaled by
// Target::load_max_over_mean, the same input that sets the experts step's rows (model.h).
#pragma once

#include "shape/shape.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

// The share of step s's listed bytes (and local copies) that a dropless schedule moves:
// 1 unless s moves the routed rows only (schedule::moves_routed_rows, the executor's rule);
// else the routed rows of the busiest rank over the buffer's rows, at most 1.
double dropless_share(const schedule::Schedule& sc, const schedule::Step& s,
                      const MoeShape& shape, double load_max_over_mean);

}  // namespace parm::perfmodel
