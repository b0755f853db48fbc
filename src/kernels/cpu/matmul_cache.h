// GEMM through oneDNN's matmul primitive, with the primitives cached per thread. Private to
// the CPU kernels; gemm() in kernels.h is the public entry and has checked the arguments.
#pragma once

#include <cstdint>

namespace parm::cpu::detail {

// Same contract as gemm() for m, n, k >= 1. num_threads is part of the cache key because a
// oneDNN primitive fixes its thread count when it is created.
void matmul_cached(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                   int num_threads);

}  // namespace parm::cpu::detail
