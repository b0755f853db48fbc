// Least-squares fits for the cost model: a line y = a + b x, and a line through the origin.
#pragma once

#include <cstdint>
#include <vector>

namespace parm::perfmodel {

struct LineFit {
  double intercept = 0.0;  // a
  double slope = 0.0;      // b
  double r2 = 0.0;         // coefficient of determination of the fit on its samples
  int64_t samples = 0;
};

// Ordinary least squares of y on x. When the free intercept comes out negative (a cost
// cannot be below zero), refits through the origin and reports that fit's r^2.
// Throws parm::Error for fewer than 2 samples, mismatched sizes or x without spread.
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y);

// y = b x (no intercept).
LineFit fit_through_origin(const std::vector<double>& x, const std::vector<double>& y);

// 1 - SS_res / SS_tot of `predicted` against `measured` (1 when SS_tot is 0 and the
// prediction is exact, 0 when it is not).
double r_squared(const std::vector<double>& measured, const std::vector<double>& predicted);

}  // namespace parm::perfmodel
