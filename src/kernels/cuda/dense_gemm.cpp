// The dense layers' products on cuBLAS (model::dense_gemm and model::linear_* on the device):
// row-major with leading dimensions, mapped as dense_math.h column_major_gemm_ld; at kBf16
// both operands are first rounded to bf16 into the workspace.
#include <limits>

#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_math.h"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"

namespace parm::cuda {
namespace {

int to_int(int64_t v, const char* what) {
  PARM_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
             "cuda::dense_gemm: {} = {} does not fit cuBLAS's int arguments", what, v);
  return static_cast<int>(v);
}

// Elements from the first to the last one a (rows, cols) operand with leading dimension ld
// covers.
int64_t stored_span(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

// The operand as cuBLAS reads it: x itself at fp32, its bf16 rounding (same layout, in the
// workspace slot) at bf16.
const void* operand(Precision p, const float* x, int64_t span, dense::Slot slot) {
  if (p != Precision::kBf16) return x;
  uint16_t* h = dense::scratch_as<uint16_t>(slot, span);
  to_bf16(x, h, span);
  return h;
}

}  // namespace

void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                bool accumulate) {
  PARM_CHECK(m >= 0 && n >= 0 && k >= 0, "cuda::dense_gemm: negative size m={} n={} k={}", m, n,
             k);
  PARM_CHECK(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n,
             "cuda::dense_gemm: leading dimensions lda={} ldb={} ldc={} are shorter than the rows "
             "of A ({}), B ({}) or C ({})",
             lda, ldb, ldc, trans_a ? m : k, trans_b ? k : n, n);
  if (m == 0 || n == 0) return;
  cudaStream_t s = stream();
  if (k == 0) {  // C = 0, or C unchanged when accumulating
    if (!accumulate)
      PARM_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * sizeof(float), 0,
                                        static_cast<size_t>(n) * sizeof(float),
                                        static_cast<size_t>(m), s));
    return;
  }
  const void* pa = operand(p, a, stored_span(trans_a ? k : m, trans_a ? m : k, lda),
                           dense::Slot::kGemmA);
  const void* pb = operand(p, b, stored_span(trans_b ? n : k, trans_b ? k : n, ldb),
                           dense::Slot::kGemmB);
  const cudaDataType_t t = p == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  const ColumnMajorGemm g = dense_math::column_major_gemm_ld(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  const float alpha = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;  // beta = 0: C is not read
  PARM_CUBLAS_CHECK(cublasGemmEx(
      context().cublas, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
      g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(g.m, "n"), to_int(g.n, "m"),
      to_int(g.k, "k"), &alpha, pb, t, to_int(g.ld_first, "ldb"), pa, t,
      to_int(g.ld_second, "lda"), &beta, c, CUDA_R_32F, to_int(g.ldc, "ldc"), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, const float* b, float* c, bool accumulate) {
  dense_gemm(p, trans_a, trans_b, m, n, k, a, trans_a ? m : k, b, trans_b ? k : n, c, n,
             accumulate);
}

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                    int64_t in, int64_t out, Precision p) {
  dense_gemm(p, false, false, rows, out, in, x, w, y, /*accumulate=*/false);  // (T, in)(in, out)
  if (b != nullptr) add_bias(y, b, rows, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx,
                     Precision p) {
  dense_gemm(p, true, false, in, out, rows, x, dy, dw, /*accumulate=*/true);  // x^T (in, T) dy
  if (db != nullptr) bias_backward(dy, db, rows, out);
  if (dx != nullptr)
    dense_gemm(p, false, true, rows, in, out, dy, w, dx, accumulate_dx);  // dy (T, out) w^T
}

}  // namespace parm::cuda
