#include "moe/expert_products.h"

#include <algorithm>

#include "kernels/cpu/kernels.h"
#include "parm/stats.h"
#include "parm/tensor.h"
#include "parm/timer.h"

namespace parm::moe {

void fc1_forward(int64_t rows, int64_t M, int64_t hl, const float* x, const float* w1,
                 float* pre) {
  cpu::gemm(false, false, rows, hl, M, x, w1, pre, false, kLayerGemm);
}

void fc2_forward(int64_t rows, int64_t M, int64_t hl, const float* act, const float* w2,
                 float* out) {
  cpu::gemm(false, false, rows, M, hl, act, w2, out, false, kLayerGemm);
}

void fc2_backward(int64_t rows, int64_t M, int64_t hl, const float* act, const float* dy,
                  const float* w2, float* dw2, float* dact) {
  cpu::gemm(true, false, hl, M, rows, act, dy, dw2, true, kLayerGemm);
  cpu::gemm(false, true, rows, hl, M, dy, w2, dact, false, kLayerGemm);
}

void fc1_backward(int64_t rows, int64_t M, int64_t hl, const float* x, const float* dpre,
                  const float* w1, float* dw1, float* dx) {
  cpu::gemm(true, false, M, hl, rows, x, dpre, dw1, true, kLayerGemm);
  cpu::gemm(false, true, rows, M, hl, dpre, w1, dx, false, kLayerGemm);
}

double expert_product_flops(int64_t rows, int64_t M, int64_t hl) {
  return 6.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(M) *
         static_cast<double>(hl);
}

double time_expert_products_us(const std::vector<int64_t>& rows, int64_t M, int64_t hl,
                               int reps) {
  const int64_t r = std::max<int64_t>(1, *std::max_element(rows.begin(), rows.end()));
  // Inputs with ordinary magnitudes (denormals or zeros could change the rate).
  auto filled = [](Shape shape) {
    Tensor t(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t[i] = 0.01f * static_cast<float>(i % 97) - 0.48f;
    return t;
  };
  // Inputs are never written, so magnitudes stay ordinary over the repetitions.
  const Tensor x = filled({r, M}), w1 = filled({M, hl}), w2 = filled({hl, M}),
               act = filled({r, hl}), dy = filled({r, M});
  Tensor pre({r, hl}), out({r, M}), dact({r, hl}), dx({r, M}), dw1({M, hl}), dw2({hl, M});
  std::vector<double> totals;
  for (int i = 0; i < reps + 1; ++i) {  // one untimed round first
    const double t0 = now_us();
    for (int64_t n : rows) {
      fc1_forward(n, M, hl, x.data(), w1.data(), pre.data());
      fc2_forward(n, M, hl, act.data(), w2.data(), out.data());
      fc2_backward(n, M, hl, act.data(), dy.data(), w2.data(), dw2.data(), dact.data());
      fc1_backward(n, M, hl, x.data(), act.data(), w1.data(), dw1.data(), dx.data());
    }
    if (i > 0) totals.push_back(now_us() - t0);
  }
  return median(totals);
}

}  // namespace parm::moe
