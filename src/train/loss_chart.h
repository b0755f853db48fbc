// The loss curve of a training run as a self-contained SVG document.
#pragma once

#include <string>
#include <vector>

#include "train/step_metrics.h"

namespace parm::train {

std::string loss_chart_svg(const std::vector<StepMetrics>& history, const std::string& title);

}  // namespace parm::train
