// How a row-major GEMM request (the semantics of parm::cpu::gemm) maps onto cuBLAS's
// column-major gemm. No CUDA headers: the CPU unit tests check the mapping against a naive
// column-major GEMM that reads exactly these arguments (tests/unit/test_cuda_gemm_args.cpp).
//
// A row-major (r, c) array with leading dimension c is, read column-major with the same
// leading dimension, the (c, r) matrix of its transpose. So the row-major C (m, n) is the
// column-major C^T (n, m), and C^T = op(B)^T op(A)^T: cuBLAS gets B as its first operand and
// A as its second, with each op flag as the request's, and m and n swapped.
#pragma once

#include <algorithm>
#include <cstdint>

namespace parm::cuda {

// The arguments of the cuBLAS call: C_cm (m, n) = op(first) op(second), column-major,
// where first = the request's B pointer, second = the request's A pointer, C_cm = the
// request's C pointer. Leading dimensions are at least 1 (cuBLAS refuses 0 even for empty
// matrices).
struct ColumnMajorGemm {
  bool trans_first = false;   // cuBLAS transa (applies to the request's B)
  bool trans_second = false;  // cuBLAS transb (applies to the request's A)
  int64_t m = 0, n = 0, k = 0;
  int64_t ld_first = 1, ld_second = 1, ldc = 1;
};

// Row-major request: C (m, n) (+)= op(A) (m, k) op(B) (k, n), A stored (m, k) or, when
// trans_a, (k, m); B stored (k, n) or, when trans_b, (n, k); all contiguous.
inline ColumnMajorGemm column_major_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                         int64_t k) {
  ColumnMajorGemm g;
  g.trans_first = trans_b;
  g.trans_second = trans_a;
  g.m = n;
  g.n = m;
  g.k = k;
  // The stored row length of each operand is its column-major leading dimension.
  g.ld_first = std::max<int64_t>(1, trans_b ? k : n);
  g.ld_second = std::max<int64_t>(1, trans_a ? m : k);
  g.ldc = std::max<int64_t>(1, n);
  return g;
}

}  // namespace parm::cuda
