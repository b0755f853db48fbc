// Small statistics over measurements.
#pragma once

#include <vector>

namespace parm {

// Median (mean of the middle two for an even count); NaN when empty.
double median(std::vector<double> values);

}  // namespace parm
