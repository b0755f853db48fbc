// fp32 <-> bf16 (the upper 16 bits of an fp32), one definition for the CPU kernels, the CUDA
// kernels and the CPU tests of the kernels' maths (PARM_HD). Includes no CUDA header.
#pragma once

#include <cstdint>

#include "kernels/math/float_bits.h"
#include "parm/host_device.h"

namespace parm {

// Rounded to nearest, ties to even. Values beyond the largest bf16 (plus half an ulp) become
// +-inf; NaN stays NaN (quiet, same sign); +-0, +-inf and denormals round like any other
// value. Branch-free, so CPU loops over it vectorise.
PARM_HD inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // ties to the even half
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

PARM_HD inline float bf16_to_f32(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

}  // namespace parm
