#include "moe/expert_products.h"

#include <algorithm>

#include "kernels/cpu/kernels.h"
#include "parm/stats.h"
#include "parm/tensor.h"
#include "parm/timer.h"

namespace parm::moe {

GemmCall expert_gemm(ExpertProduct p, int64_t r, int64_t M, int64_t hl) {
  switch (p) {
    case ExpertProduct::kPre: return {false, false, false, r, hl, M};
    case ExpertProduct::kOut: return {false, false, false, r, M, hl};
    case ExpertProduct::kDW2: return {true, false, true, hl, M, r};
    case ExpertProduct::kDAct: return {false, true, false, r, hl, M};
    case ExpertProduct::kDW1: return {true, false, true, M, hl, r};
    case ExpertProduct::kDX: return {false, true, false, r, M, hl};
  }
  return {};
}

void run_expert_gemm(ExpertProduct p, int64_t r, int64_t M, int64_t hl, const float* a,
                     const float* b, float* c) {
  const GemmCall g = expert_gemm(p, r, M, hl);
  cpu::gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, a, b, c, g.accumulate, kLayerGemm);
}

void fc1_forward(int64_t rows, int64_t M, int64_t hl, const float* x, const float* w1,
                 float* pre) {
  run_expert_gemm(ExpertProduct::kPre, rows, M, hl, x, w1, pre);
}

void fc2_forward(int64_t rows, int64_t M, int64_t hl, const float* act, const float* w2,
                 float* out) {
  run_expert_gemm(ExpertProduct::kOut, rows, M, hl, act, w2, out);
}

void fc2_backward(int64_t rows, int64_t M, int64_t hl, const float* act, const float* dy,
                  const float* w2, float* dw2, float* dact) {
  run_expert_gemm(ExpertProduct::kDW2, rows, M, hl, act, dy, dw2);
  run_expert_gemm(ExpertProduct::kDAct, rows, M, hl, dy, w2, dact);
}

void fc1_backward(int64_t rows, int64_t M, int64_t hl, const float* x, const float* dpre,
                  const float* w1, float* dw1, float* dx) {
  run_expert_gemm(ExpertProduct::kDW1, rows, M, hl, x, dpre, dw1);
  run_expert_gemm(ExpertProduct::kDX, rows, M, hl, dpre, w1, dx);
}

double expert_product_flops(int64_t rows, int64_t M, int64_t hl) {
  double flops = 0.0;
  for (ExpertProduct p : kExpertProducts) flops += expert_gemm(p, rows, M, hl).flops();
  return flops;
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
