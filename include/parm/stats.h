// Small statistics over measurements.
#pragma once

#include <vector>

namespace parm {

// Median (mean of the middle two for an even count); NaN when empty.
double median(std::vector<double> values);

// How much more the busiest of n shares took than their mean: busiest * n / total, or
// `if_none` when total is 0 (nothing routed). Every imbalance ratio of the layer, the trainer's
// plan and the cost model is this one. Throws parm::Error for a negative busiest or total.
double max_over_mean(double busiest, double total, double n, double if_none);
// The same over `loads` split into n_groups contiguous blocks (EP rank j holds experts
// [j E / n_ep, (j + 1) E / n_ep)): the busiest block's sum over the mean block sum. Throws for
// a size not a multiple of n_groups (or empty) or a negative load.
double max_over_mean(const std::vector<double>& loads, int n_groups, double if_none);

}  // namespace parm
