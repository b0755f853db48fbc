// The fp32 GeLU kernels of gelu.cpp, 16 lanes at a time with AVX-512, giving the bits of its
// scalar loops (kernels/math/gelu_math.h's formulas with exp_f32): every product is rounded on
// its own (no FMA), in the same order, and a NaN input gives the NaN the scalar clamp-and-patch
// gives. GCC's own vectorisation of those loops (target_clones) spends about a third of its
// instructions on the clamps and NaN checks on integer bits; this runs them 8-15% faster
// (docs/fine-grained.md). Callers check detail::have_avx512f(); the arguments are checked by
// gelu.cpp. Private to the CPU kernels.
#pragma once

#include <cstdint>

namespace parm::cpu::detail {

void gelu_forward_avx512(const float* x, float* y, int64_t n);
void gelu_backward_avx512(const float* x, const float* dy, float* dx, int64_t n);
void bias_gelu_forward_avx512(float* pre, const float* bias, float* act, int64_t rows,
                              int64_t cols);
void bias_gelu_avx512(const float* x, const float* bias, float* act, int64_t rows, int64_t cols);
void bias_gelu_backward_avx512(const float* x, const float* bias, const float* dact, float* dx,
                               float* dbias, int64_t rows, int64_t cols);
void bias_gelu_grad_avx512(const float* x, const float* bias, float* g, int64_t rows,
                           int64_t cols);

}  // namespace parm::cpu::detail
