// How many OpenMP threads oneDNN may use; see set_gemm_threads() in kernels.h. Private.
#pragma once

namespace parm::cpu::detail {

// Brings the calling thread's OpenMP thread count in line with the GEMM setting before a
// oneDNN call (cheap after the first call in a thread) and returns the count oneDNN will see.
int apply_gemm_threads();

}  // namespace parm::cpu::detail
