#include "kernels/cpu/kernels.h"
#include "model/blocks.h"

namespace parm::model {

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                    int64_t in, int64_t out) {
  cpu::gemm(false, false, rows, out, in, x, w, y, /*accumulate=*/false);  // (T, in)(in, out)
  if (b != nullptr) cpu::add_bias(y, b, rows, out);
}

void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  cpu::gemm(true, false, in, out, rows, x, dy, dw, /*accumulate=*/true);  // x^T (in, T) dy
  if (db != nullptr) cpu::bias_backward(dy, db, rows, out);
  if (dx != nullptr)
    cpu::gemm(false, true, rows, in, out, dy, w, dx, accumulate_dx);  // dy (T, out) w^T
}

}  // namespace parm::model
