#include "perfmodel/fit.h"

#include <algorithm>
#include <cmath>

#include "parm/error.h"
#include "parm/stats.h"

namespace parm::perfmodel {
namespace {

void finish(LineFit& f, const std::vector<double>& x, const std::vector<double>& y) {
  f.samples = static_cast<int64_t>(x.size());
  std::vector<double> pred(x.size());
  for (size_t i = 0; i < x.size(); ++i) pred[i] = f.intercept + f.slope * x[i];
  f.r2 = r_squared(y, pred);
}

}  // namespace

double r_squared(const std::vector<double>& measured, const std::vector<double>& predicted) {
  PARM_CHECK_EQ(measured.size(), predicted.size());
  if (measured.empty()) return 0.0;
  double mean = 0.0;
  for (double v : measured) mean += v;
  mean /= static_cast<double>(measured.size());
  double ss_res = 0.0, ss_tot = 0.0;
  for (size_t i = 0; i < measured.size(); ++i) {
    ss_res += (measured[i] - predicted[i]) * (measured[i] - predicted[i]);
    ss_tot += (measured[i] - mean) * (measured[i] - mean);
  }
  if (ss_tot == 0.0) return ss_res == 0.0 ? 1.0 : 0.0;
  return 1.0 - ss_res / ss_tot;
}

LineFit fit_through_origin(const std::vector<double>& x, const std::vector<double>& y) {
  PARM_CHECK_EQ(x.size(), y.size());
  PARM_CHECK(!x.empty(), "a fit needs at least one sample");
  double sxy = 0.0, sxx = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += x[i] * y[i];
    sxx += x[i] * x[i];
  }
  PARM_CHECK(sxx > 0.0, "a fit through the origin needs some x != 0");
  LineFit f;
  f.slope = sxy / sxx;
  finish(f, x, y);
  return f;
}

LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y, bool nonneg_slope) {
  PARM_CHECK_EQ(x.size(), y.size());
  PARM_CHECK(x.size() >= 2, "a line fit needs at least 2 samples, got {}", x.size());
  const double n = static_cast<double>(x.size());
  double mx = 0.0, my = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    mx += x[i];
    my += y[i];
  }
  mx /= n;
  my /= n;
  double sxy = 0.0, sxx = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  PARM_CHECK(sxx > 0.0, "a line fit needs samples at more than one x");
  LineFit f;
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  if (nonneg_slope && f.slope < 0.0) {
    f.slope = 0.0;
    f.intercept = std::max(0.0, my);
  } else if (f.intercept < 0.0) {
    f = fit_through_origin(x, y);
    if (nonneg_slope && f.slope < 0.0) f.slope = 0.0;
    f.intercept = 0.0;
  }
  finish(f, x, y);
  return f;
}

LineFit fit_line_relative(const std::vector<double>& x, const std::vector<double>& y) {
  PARM_CHECK_EQ(x.size(), y.size());
  PARM_CHECK(x.size() >= 2, "a line fit needs at least 2 samples, got {}", x.size());
  std::vector<double> w(x.size());  // 1 / y^2: squared errors relative to y
  double sw = 0.0, mx = 0.0, my = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    PARM_CHECK(y[i] > 0.0, "a relative fit needs times > 0, sample {} is {}", i, y[i]);
    w[i] = 1.0 / (y[i] * y[i]);
    sw += w[i];
    mx += w[i] * x[i];
    my += w[i] * y[i];
  }
  mx /= sw;
  my /= sw;
  double sxy = 0.0, sxx = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += w[i] * (x[i] - mx) * (y[i] - my);
    sxx += w[i] * (x[i] - mx) * (x[i] - mx);
  }
  PARM_CHECK(sxx > 0.0, "a line fit needs samples at more than one x");
  LineFit f;
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  if (f.slope < 0.0) {
    f.slope = 0.0;
    f.intercept = my;
  } else if (f.intercept < 0.0) {
    double wxy = 0.0, wxx = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      wxy += w[i] * x[i] * y[i];
      wxx += w[i] * x[i] * x[i];
    }
    PARM_CHECK(wxx > 0.0, "a fit through the origin needs some x != 0");
    f.slope = wxy / wxx;
    f.intercept = 0.0;
  }
  finish(f, x, y);
  return f;
}

OverlapFit fit_overlap(const std::vector<double>& measured, const std::vector<double>& unfused,
                       const std::vector<double>& pipelined, int chunks) {
  PARM_CHECK_EQ(measured.size(), unfused.size());
  PARM_CHECK_EQ(measured.size(), pipelined.size());
  PARM_CHECK(chunks >= 1, "fused overlap fit with {} chunks", chunks);
  OverlapFit f;
  std::vector<double> shares;
  for (size_t i = 0; i < measured.size(); ++i) {
    const double gain = unfused[i] - pipelined[i];
    if (gain > 0.02 * unfused[i]) shares.push_back((unfused[i] - measured[i]) / gain);
  }
  f.sizes_used = static_cast<int64_t>(shares.size());
  f.raw = shares.empty() ? 1.0 : median(shares);
  f.overlap = std::clamp(f.raw, 0.0, 1.0);
  f.per_piece_us = overlap_per_piece_us(measured, unfused, pipelined, chunks, f.overlap);
  return f;
}

double overlap_r2(const std::vector<double>& measured, const std::vector<double>& unfused,
                  const std::vector<double>& pipelined, int chunks, double overlap,
                  double per_piece_us) {
  PARM_CHECK_EQ(measured.size(), unfused.size());
  PARM_CHECK_EQ(measured.size(), pipelined.size());
  std::vector<double> pred(measured.size());
  for (size_t i = 0; i < pred.size(); ++i)
    pred[i] = unfused[i] - overlap * (unfused[i] - pipelined[i]) + (chunks - 1) * per_piece_us;
  return r_squared(measured, pred);
}

double overlap_per_piece_us(const std::vector<double>& measured,
                            const std::vector<double>& unfused,
                            const std::vector<double>& pipelined, int chunks, double overlap) {
  PARM_CHECK_EQ(measured.size(), unfused.size());
  PARM_CHECK_EQ(measured.size(), pipelined.size());
  if (measured.empty() || chunks <= 1) return 0.0;
  std::vector<double> rest(measured.size());
  for (size_t i = 0; i < measured.size(); ++i)
    rest[i] = measured[i] - (unfused[i] - overlap * (unfused[i] - pipelined[i]));
  return std::max(0.0, median(rest)) / (chunks - 1);
}

double pair_latency(const std::vector<double>& alpha_us) {
  PARM_CHECK(!alpha_us.empty(), "a pooled pair latency needs at least one op's latency");
  return median(alpha_us);
}

PooledFit fit_anchored_pooled(const std::vector<std::vector<double>>& x,
                              const std::vector<std::vector<double>>& y,
                              const std::vector<std::vector<bool>>& above) {
  PARM_CHECK_EQ(x.size(), y.size());
  PARM_CHECK(!x.empty(), "a pooled fit needs at least one series");
  PARM_CHECK(above.empty() || above.size() == x.size(), "step flags for {} of {} series",
             above.size(), x.size());
  auto flagged = [&](size_t s, size_t i) { return !above.empty() && above[s][i]; };
  std::vector<size_t> first(x.size());
  // Sums over the samples beyond the anchors, relative to them: dx, dy and the step flag I.
  double sxy = 0.0, sxx = 0.0, sxi = 0.0, sii = 0.0, siy = 0.0;
  bool anchors_unflagged = true, some_unflagged = false, two_flagged_sizes = false;
  for (size_t s = 0; s < x.size(); ++s) {
    PARM_CHECK_EQ(x[s].size(), y[s].size());
    PARM_CHECK(above.empty() || above[s].size() == x[s].size(),
               "step flags for {} of {} samples", above.empty() ? 0 : above[s].size(),
               x[s].size());
    PARM_CHECK(x[s].size() >= 2, "a line fit needs at least 2 samples, got {}", x[s].size());
    // The anchor: of the two smallest sizes, the one timed faster (a loaded machine only
    // ever adds time, so one delayed smallest sample must not become the latency).
    std::vector<size_t> order(x[s].size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[s][a] < x[s][b]; });
    first[s] = y[s][order[1]] < y[s][order[0]] ? order[1] : order[0];
    anchors_unflagged = anchors_unflagged && !flagged(s, first[s]);
    // Through (x_first, y_first): y = y_first + b (x - x_first) + h I.
    double flagged_lo = INFINITY, flagged_hi = -INFINITY;
    for (size_t i = 0; i < x[s].size(); ++i) {
      if (x[s][i] < x[s][first[s]] || i == first[s]) continue;  // the delayed smallest sample
      const double dx = x[s][i] - x[s][first[s]];
      const double dy = y[s][i] - y[s][first[s]];
      const double flag = flagged(s, i) ? 1.0 : 0.0;
      sxy += dx * dy;
      sxx += dx * dx;
      sxi += dx * flag;
      sii += flag;
      siy += dy * flag;
      some_unflagged = some_unflagged || flag == 0.0;
      if (flag != 0.0) {
        flagged_lo = std::min(flagged_lo, dx);
        flagged_hi = std::max(flagged_hi, dx);
      }
    }
    two_flagged_sizes = two_flagged_sizes || flagged_hi > flagged_lo;
  }
  PARM_CHECK(sxx > 0.0, "a line fit needs samples at more than one x");
  PooledFit f;
  f.slope = std::max(0.0, sxy / sxx);
  const double det = sxx * sii - sxi * sxi;
  if (anchors_unflagged && two_flagged_sizes && some_unflagged && det > 1e-12 * sxx * sii) {
    f.step_fitted = true;
    f.slope = (sxy * sii - sxi * siy) / det;
    f.step = (sxx * siy - sxi * sxy) / det;
    if (f.step < 0.0) {
      f.step = 0.0;
      f.slope = std::max(0.0, sxy / sxx);
    } else if (f.slope < 0.0) {
      f.slope = 0.0;
      f.step = std::max(0.0, siy / sii);
    }
  }
  std::vector<double> all_y, all_pred;
  for (size_t s = 0; s < x.size(); ++s) {
    const double a = std::max(0.0, y[s][first[s]] - f.slope * x[s][first[s]]);
    f.intercepts.push_back(a);
    for (size_t i = 0; i < x[s].size(); ++i) {
      all_y.push_back(y[s][i]);
      all_pred.push_back(a + f.slope * x[s][i] + (flagged(s, i) ? f.step : 0.0));
    }
  }
  f.samples = static_cast<int64_t>(all_y.size());
  f.r2 = r_squared(all_y, all_pred);
  return f;
}

LineFit fit_anchored(const std::vector<double>& x, const std::vector<double>& y) {
  const PooledFit p = fit_anchored_pooled({x}, {y});
  LineFit f;
  f.intercept = p.intercepts[0];
  f.slope = p.slope;
  f.r2 = p.r2;
  f.samples = p.samples;
  return f;
}

}  // namespace parm::perfmodel
