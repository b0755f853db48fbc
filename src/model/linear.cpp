#include "kernels/cpu/kernels.h"
#include "model/blocks.h"

namespace parm::model {

void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                bool accumulate) {
  if (p == Precision::kBf16)
    cpu::gemm_bf16(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  else
    cpu::gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, const float* b, float* c, bool accumulate) {
  if (p == Precision::kBf16)
    cpu::gemm_bf16(trans_a, trans_b, m, n, k, a, b, c, accumulate);
  else
    cpu::gemm(trans_a, trans_b, m, n, k, a, b, c, accumulate);
}

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                    int64_t in, int64_t out, Precision p) {
  dense_gemm(p, false, false, rows, out, in, x, w, y, /*accumulate=*/false);  // (T, in)(in, out)
  if (b != nullptr) cpu::add_bias(y, b, rows, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx,
                     Precision p) {
  dense_gemm(p, true, false, in, out, rows, x, dy, dw, /*accumulate=*/true);  // x^T (in, T) dy
  if (db != nullptr) cpu::bias_backward(dy, db, rows, out);
  if (dx != nullptr)
    dense_gemm(p, false, true, rows, in, out, dy, w, dx, accumulate_dx);  // dy (T, out) w^T
}

}  // namespace parm::model
