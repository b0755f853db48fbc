// The fp32 SwiGLU kernels of swiglu.cpp, 16 lanes at a time with AVX-512, giving the bits of its
// scalar loops (kernels/math/silu_math.h's formulas with exp_f32; vec_math_avx512.h). Callers
// check detail::have_avx512f(); the arguments are checked by swiglu.cpp. Private to the CPU
// kernels.
#pragma once

#include <cstdint>

namespace parm::cpu::detail {

void swiglu_forward_avx512(const float* a, const float* g, float* act, int64_t n);
void swiglu_backward_avx512(const float* a, const float* g, const float* dact, float* da,
                            float* dg, int64_t n);

}  // namespace parm::cpu::detail
