// Shared by the fp32 and bf16 GEMMs (gemm.cpp, gemm_bf16.cpp) after their shape checks. Private
// to the CPU kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "parm/error.h"

namespace parm::cpu::detail {

// Handles the products with nothing to multiply and checks the pointers of the rest: m or
// n = 0 writes nothing; k = 0 (an empty sum) zeroes C, or leaves it when accumulating.
// Returns true when the call is complete. `what` names the GEMM in errors.
inline bool gemm_done_without_products(const char* what, int64_t m, int64_t n, int64_t k,
                                       const void* a, const void* b, float* c, int64_t ldc,
                                       bool accumulate) {
  if (m == 0 || n == 0) return true;
  PARM_CHECK(c != nullptr, "{}: C is null (m = {}, n = {})", what, m, n);
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * n);
    return true;
  }
  PARM_CHECK(a != nullptr && b != nullptr, "{}: null operand (m = {}, n = {}, k = {})", what, m,
             n, k);
  return false;
}

}  // namespace parm::cpu::detail
