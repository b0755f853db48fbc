// Bit casts between fp32 and its bit pattern for code that runs on both sides of a CUDA build
// (PARM_HD: the CPU kernels, the CUDA kernels and the CPU tests of the kernels' maths).
// Includes no CUDA header.
#pragma once

#include <cstdint>
#include <cstring>

#include "parm/host_device.h"

namespace parm {

PARM_HD inline uint32_t float_to_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

PARM_HD inline float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

}  // namespace parm
