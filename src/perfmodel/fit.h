// Least-squares fits for the cost model: a line y = a + b x, and a line through the origin.
#pragma once

#include <cstdint>
#include <vector>

namespace parm::perfmodel {

struct LineFit {
  double intercept = 0.0;  // a
  double slope = 0.0;      // b
  double r2 = 0.0;         // coefficient of determination (unweighted) of the final line
  int64_t samples = 0;
};

// Ordinary least squares of y on x. The intercept is kept >= 0 (when the free fit's is
// negative, the line is refitted through the origin) and, with nonneg_slope, so is the slope
// (a negative one becomes 0: a constant, the mean of y).
// Throws parm::Error for fewer than 2 samples, mismatched sizes or x without spread.
LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y,
                 bool nonneg_slope = true);

// y = b x (no intercept).
LineFit fit_through_origin(const std::vector<double>& x, const std::vector<double>& y);

// A latency-bandwidth line for samples spread over decades of sizes: the intercept is the
// time of the smallest sample (the latency: a free least-squares intercept is set by the
// largest sizes and is meaningless, often negative, for a cost that is not quite linear),
// the slope the least-squares slope (>= 0) of the line through that point, set by the large
// sizes that carry the bytes.
LineFit fit_anchored(const std::vector<double>& x, const std::vector<double>& y);

// Lines with one common slope: series i (samples x[i], y[i]) lies on y = a_i + b x. Each line
// is anchored at the faster-timed of its two smallest x (a delay on a loaded machine only
// adds time; a smaller sample left out then); b is the least-squares slope (>= 0) through
// the anchors pooled over every series. r2 over all samples. Throws as fit_anchored per series. fit_anchored is the case of
// one series.
struct PooledFit {
  std::vector<double> intercepts;  // a_i (>= 0)
  double slope = 0.0;              // b
  double r2 = 0.0;
  int64_t samples = 0;
};
PooledFit fit_anchored_pooled(const std::vector<std::vector<double>>& x,
                              const std::vector<std::vector<double>>& y);

// 1 - SS_res / SS_tot of `predicted` against `measured` (1 when SS_tot is 0 and the
// prediction is exact, 0 when it is not).
double r_squared(const std::vector<double>& measured, const std::vector<double>& predicted);

}  // namespace parm::perfmodel
