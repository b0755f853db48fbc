// What the executor's own step timers measured in a layer's last forward and backward pass,
// split as the model prices it: the compute steps (model.h compute_steps_us) and the rest
// (collective steps with their local copies and waits for peers, and the executor's own work).
#pragma once

#include <vector>

#include "moe/moe_layer.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

// This rank's step times of `layer`'s last forward and backward pass (microseconds): the
// forward step i at [i], the backward step i at [steps + i].
std::vector<double> last_pass_step_us(const MoeLayer& layer);

// The sum of the compute steps' entries of such a vector for schedule sc (its steps that are
// not collectives). Throws when step_us is not 2 x sc.steps.size() long.
double compute_us_of(const schedule::Schedule& sc, const std::vector<double>& step_us);

}  // namespace parm::perfmodel
