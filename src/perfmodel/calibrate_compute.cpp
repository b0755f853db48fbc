#include "perfmodel/calibrate_compute.h"

#include <algorithm>
#include <array>
#include <set>

#include <fmt/ranges.h>

#include "parm/error.h"
#include "parm/rng.h"
#include "perfmodel/fit.h"

namespace parm::perfmodel {

void calibrate_gemm(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                    Calibration& cal, const Logger& log) {
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  };
  std::array<std::vector<Shape>, kNumGemmClasses> shapes;
  for (int64_t R : o.gemm_rows)
    for (int64_t M : o.gemm_model_dims)
      for (int64_t hl : o.gemm_hidden) {
        // The expert products of moe/experts.cpp.
        shapes[0].push_back({false, false, R, hl, M});
        shapes[0].push_back({false, false, R, M, hl});
        shapes[1].push_back({true, false, hl, M, R});
        shapes[1].push_back({true, false, M, hl, R});
        shapes[2].push_back({false, true, R, hl, M});
        shapes[2].push_back({false, true, R, M, hl});
      }
  for (int64_t R : o.gemm_rows)
    for (int64_t M : o.gemm_model_dims)
      for (int64_t E : o.gate_experts) {
        // The gate's products of moe/gate.cpp (R = 4x the expert rows: a gate sees T rows).
        const int64_t T = 4 * R;
        shapes[3].push_back({false, false, T, E, M});
        shapes[3].push_back({true, false, M, E, T});
        shapes[3].push_back({false, true, T, M, E});
      }
  Rng rng(7, 0);
  for (int c = 0; c < kNumGemmClasses; ++c) {
    std::vector<double> xs, ys;
    for (const Shape& s : shapes[static_cast<size_t>(c)]) {
      std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n));
      for (auto& v : a) v = static_cast<float>(rng.normal());
      for (auto& v : b) v = static_cast<float>(rng.normal());
      // Operands at the precision measured (bf16: half the bytes), C fp32.
      const size_t operand_bytes = o.precision == Precision::kBf16 ? 2 : sizeof(float);
      BenchBuffer da(dev, a.size() * operand_bytes), db(dev, b.size() * operand_bytes);
      dev.upload(da.get(), a.data(), a.size(), o.precision);
      dev.upload(db.get(), b.data(), b.size(), o.precision);
      const auto out = filled(dev, static_cast<size_t>(s.m * s.n), 0.0f);
      const bool acc = s.ta;  // the weight gradients accumulate, as in the executor
      const double us = time_all_ranks_windowed(world, o.gemm_iters, o.compute_window_us, [&] {
        dev.gemm(s.ta, s.tb, s.m, s.n, s.k, da.get(), db.get(), out->f(), acc, o.precision);
        dev.sync();
      });
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
      xs.push_back(flops);
      ys.push_back(us);
      cal.samples.push_back({fmt::format("gemm.{}", gemm_class_name(static_cast<GemmClass>(c))),
                             flops, us});
    }
    // Relative errors: the shapes span decades of flops, and in absolute least squares the
    // largest set the latency that every small product then pays (fit.h).
    LineFit f = fit_line_relative(xs, ys);
    if (f.slope <= 0.0) {
      // Times that do not grow with the flops (noise over too small shapes): a rate through
      // the origin is still a rate.
      log("  warning: the {} GEMM times do not grow with their flops; fitting a rate through "
          "the origin (pass larger --gemm-rows for a better fit)",
          gemm_class_name(static_cast<GemmClass>(c)));
      f = fit_through_origin(xs, ys);
    }
    GemmFit& g = cal.profile.gemm_fit(static_cast<GemmClass>(c));
    g.alpha_us = f.intercept;
    g.gflops = 1e-3 / f.slope;
    g.r2 = f.r2;
    g.samples = f.samples;
    g.source = "measured";
    log("  gemm {:<10} alpha {:8.2f} us  rate {:7.2f} GFLOP/s per rank  r2 {:.4f}  [{} shapes]",
        gemm_class_name(static_cast<GemmClass>(c)), g.alpha_us, g.gflops, g.r2, g.samples);
  }
}

constexpr int64_t kMemMaxRows = 2048;  // x 256 floats: 2 MiB

void calibrate_memory(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                      Calibration& cal, const Logger& log) {
  const int64_t cols = 256;
  for (MemClass mc : {MemClass::kCopy, MemClass::kGelu}) {
    std::vector<double> xs, ys;
    // Buffers of 64 KiB .. 2 MiB: the sizes of one layer's copies and GeLU calls. Larger
    // buffers leave the cache and, being the largest x, would set the slope of every copy
    // (docs/perfmodel.md, `parm calibrate`).
    for (int64_t rows = 64; rows <= kMemMaxRows; rows *= 2) {
      const size_t n = static_cast<size_t>(rows * cols);
      const auto src = filled(dev, n, 0.5f), dst = filled(dev, n, 0.0f),
                 bias = filled(dev, static_cast<size_t>(cols), 0.1f);
      // Both read n floats and write n: a gather of rows (dispatch, layout gathers), and the
      // experts' bias + GeLU (x W1 read, act written).
      const double bytes = 2.0 * static_cast<double>(n) * sizeof(float);
      double us = 0.0;
      if (mc == MemClass::kCopy) {
        us = time_all_ranks_windowed(world, o.iters, o.compute_window_us, [&] {
          dev.copy_rows(src->f(), dst->f(), rows, cols);
          dev.sync();
        });
      } else {
        us = time_all_ranks_windowed(world, o.iters, o.compute_window_us, [&] {
          dev.bias_gelu(src->f(), bias->f(), dst->f(), rows, cols);
          dev.sync();
        });
      }
      xs.push_back(bytes);
      ys.push_back(us);
      cal.samples.push_back({fmt::format("memory.{}", mem_class_name(mc)), bytes, us});
    }
    LineFit f = fit_line(xs, ys);
    if (f.slope <= 0.0) f = fit_through_origin(xs, ys);  // as for the GEMMs
    MemFit& m = cal.profile.mem_fit(mc);
    m.alpha_us = f.intercept;
    m.gbps = 1e-3 / f.slope;
    m.r2 = f.r2;
    m.samples = f.samples;
    m.source = "measured";
    log("  memory {:<6} alpha {:8.2f} us  {:7.2f} GB/s per rank  r2 {:.4f}  [{} sizes]",
        mem_class_name(mc), m.alpha_us, m.gbps, m.r2, m.samples);
  }
}

void check_gemm_shapes(const CalibrateOptions& o) {
  const auto positive = [](const std::vector<int64_t>& v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 1; });
  };
  PARM_CONFIG_CHECK(positive(o.gemm_rows) && positive(o.gemm_model_dims) &&
                        positive(o.gemm_hidden) && positive(o.gate_experts),
                    "calibrate: --gemm-rows {}, --gemm-model-dims {} and --gemm-hidden {} must "
                    "be lists of sizes >= 1",
                    fmt::join(o.gemm_rows, ","), fmt::join(o.gemm_model_dims, ","),
                    fmt::join(o.gemm_hidden, ","));
  const std::set<int64_t> rows(o.gemm_rows.begin(), o.gemm_rows.end());
  PARM_CONFIG_CHECK(rows.size() >= 2,
                    "calibrate: --gemm-rows {} needs at least two different row counts (the GEMM "
                    "rate is a line fitted over sizes), e.g. --gemm-rows 64,256,1024",
                    fmt::join(o.gemm_rows, ","));
}

}  // namespace parm::perfmodel
