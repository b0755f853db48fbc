// What the GPU tests share: moving tensors between the host and the GPU, and comparing a
// GPU result with its CPU function's (the tolerance relative to the largest CPU value).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "parm/device.h"
#include "parm/tensor.h"

namespace parm::gpu_test {

inline Tensor gpu(const Tensor& t) { return t.to(Device::kCuda); }
inline Tensor host(const Tensor& t) { return t.to(Device::kCpu); }

inline double max_abs(const float* x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// max |got - want| <= tol * max |want| (and no NaN in got where want has none).
inline void expect_close(const float* got, const float* want, int64_t n, double tol,
                         const std::string& what) {
  double err = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= err)) {  // also catches NaN
      err = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  const double scale = max_abs(want, n);
  EXPECT_LE(err, tol * scale) << what << ": max |gpu - cpu| = " << err << " at element " << worst
                              << " (gpu " << (worst >= 0 ? got[worst] : 0.0f) << ", cpu "
                              << (worst >= 0 ? want[worst] : 0.0f) << "), max |cpu| = " << scale
                              << ", tolerance " << tol << " x max |cpu|";
}

// got_device (on the GPU) against want (on the host).
inline void expect_close(const Tensor& got_device, const Tensor& want, double tol,
                         const std::string& what) {
  const Tensor got = host(got_device);
  ASSERT_EQ(got.numel(), want.numel()) << what;
  expect_close(got.data(), want.data(), want.numel(), tol, what);
}

}  // namespace parm::gpu_test
