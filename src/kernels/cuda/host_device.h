// What the per-element maths of the CUDA kernels shares with the CPU tests that run the same
// code: PARM_HD (parm/host_device.h: a function for both sides) and bit casts that work on
// either side. Includes no CUDA header.
#pragma once

#include <cstdint>
#include <cstring>

#include "parm/host_device.h"

namespace parm::cuda {

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

}  // namespace parm::cuda
