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

// y = a + b x minimizing the relative errors sum ((y_i - a - b x_i) / y_i)^2 (weighted least
// squares, weights 1 / y_i^2), for times spread over decades: in absolute least squares the
// largest samples set the intercept, so a 1% misfit at 50 ms became a 0.6 ms latency on
// every 30 us product. The intercept is kept >= 0 (else the weighted fit through the origin)
// and so is the slope (else the constant, weighted mean of y). r2 unweighted, as fit_line.
// Throws parm::Error for fewer than 2 samples, mismatched sizes, a y <= 0 or x without spread.
LineFit fit_line_relative(const std::vector<double>& x, const std::vector<double>& y);

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
// With `above` (a flag per sample, same shape as x): the lines also step up by h at the
// flagged samples, y = a_i + b x + h [above] (model.h: the handshake of a message above the
// eager limit); b and h by least squares through the anchors, each >= 0 (the other refitted
// where one is bounded). The step is fitted only where every anchor is unflagged, some sample
// beyond the anchors is not flagged, and some series has flagged samples at two sizes, so the
// slope above the step is seen directly (step_fitted; else h = 0): with one flagged size per
// series, noise in the small unflagged samples decides whether the bytes go into b or h.
struct PooledFit {
  std::vector<double> intercepts;  // a_i (>= 0)
  double slope = 0.0;              // b
  double step = 0.0;               // h
  bool step_fitted = false;
  double r2 = 0.0;
  int64_t samples = 0;
};
PooledFit fit_anchored_pooled(const std::vector<std::vector<double>>& x,
                              const std::vector<std::vector<double>>& y,
                              const std::vector<std::vector<bool>>& above = {});

// The fused collective's overlap and per-piece cost (model.h) from, per size i, its measured
// time t_i, the model's unfused parts in sequence u_i and pipelined total p_i:
//   overlap = median over the sizes with a gain u_i - p_i > 2% of u_i of (u_i - t_i) /
//             (u_i - p_i), bounded to [0, 1] (1 where no size gains: both parts on one link
//             class, where only latencies meet);
//   per_piece_us = max(0, median of t_i - (u_i - overlap (u_i - p_i))) / (W - 1).
// Medians of ratios, not a line: the gain is small against the noise at every size, and a
// free slope over (gain, extra) once came out at -1.92 (fusion priced above its parts) while
// the fused collectives ran 0.96x their parts. Throws for mismatched sizes or chunks < 1.
struct OverlapFit {
  double overlap = 1.0;
  double per_piece_us = 0.0;
  double raw = 1.0;        // the median before bounding
  int64_t sizes_used = 0;  // sizes with a gain
};
OverlapFit fit_overlap(const std::vector<double>& measured, const std::vector<double>& unfused,
                       const std::vector<double>& pipelined, int chunks);
// r^2 of the fused collectives' measured times against u_i - overlap (u_i - p_i) + (W - 1)
// per_piece_us, the price fit_overlap's terms give them (as r_squared: 0 for no sizes).
double overlap_r2(const std::vector<double>& measured, const std::vector<double>& unfused,
                  const std::vector<double>& pipelined, int chunks, double overlap,
                  double per_piece_us);
// The per_piece_us of fit_overlap at a given overlap (0 with chunks 1 or no sizes).
double overlap_per_piece_us(const std::vector<double>& measured,
                            const std::vector<double>& unfused,
                            const std::vector<double>& pipelined, int chunks, double overlap);

// The latency of a group of 2 ranks on one link class, one for every op: the median of the
// ops' own fitted latencies. At n = 2 each op is one exchange with the peer (Open MPI:
// allreduce by recursive doubling, allgather, reduce_scatter and alltoall by one sendrecv),
// so they pay one latency; the per-op fits differ by noise (one quiet calibration: allreduce
// 312 us beside 84-106 us for the other three on the same link). Throws for an empty list.
double pair_latency(const std::vector<double>& alpha_us);

// 1 - SS_res / SS_tot of `predicted` against `measured` (1 when SS_tot is 0 and the
// prediction is exact, 0 when it is not).
double r_squared(const std::vector<double>& measured, const std::vector<double>& predicted);

}  // namespace parm::perfmodel
