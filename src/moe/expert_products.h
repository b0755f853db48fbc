// The matrix products of one expert shard over R filled rows (model dim M, hidden Hl), as
// the layer calls them. They are the layer's floor: `bench-layer` times these same calls
// alone, at the shapes of the last forward pass, to get the GEMM rate they reach.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace parm::moe {

// The GEMM path of every product in the layer (gate and experts): dnnl_sgemm allocates
// nothing per call and takes any row count without a new primitive; on the experts' shapes
// with an uneven row count it matched or beat the matmul primitive here (the gate's tiny
// (T, E) products are up to 1.5x slower on it: under 0.1 ms per layer at T = 1024).
constexpr cpu::GemmPath kLayerGemm = cpu::GemmPath::kSgemm;

// The six products, and the GEMM call of each for one expert over `rows` rows. The layer's
// functions below, the floor and the kernel benchmarks all take them from here.
enum class ExpertProduct {
  kPre,   // pre (R, Hl) = x (R, M) W1 (M, Hl)
  kOut,   // out (R, M) = act (R, Hl) W2 (Hl, M)
  kDW2,   // dW2 (Hl, M) += act^T (Hl, R) dy (R, M)
  kDAct,  // dact (R, Hl) = dy (R, M) W2^T (M, Hl)
  kDW1,   // dW1 (M, Hl) += x^T (M, R) dpre (R, Hl)
  kDX,    // dx (R, M) = dpre (R, Hl) W1^T (Hl, M)
};
constexpr ExpertProduct kExpertProducts[] = {ExpertProduct::kPre, ExpertProduct::kOut,
                                             ExpertProduct::kDW2, ExpertProduct::kDAct,
                                             ExpertProduct::kDW1, ExpertProduct::kDX};
struct GemmCall {
  bool trans_a = false, trans_b = false, accumulate = false;
  int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * n * k; }
};
GemmCall expert_gemm(ExpertProduct p, int64_t rows, int64_t model_dim, int64_t hidden);
// Runs product p on contiguous operands (a and b in the order of the comments above; c the
// output) through the layer's GEMM path.
void run_expert_gemm(ExpertProduct p, int64_t rows, int64_t model_dim, int64_t hidden,
                     const float* a, const float* b, float* c);

// pre (R, Hl) = x (R, M) W1 (M, Hl). Overwrites pre.
void fc1_forward(int64_t rows, int64_t model_dim, int64_t hidden, const float* x, const float* w1,
                 float* pre);
// out (R, M) = act (R, Hl) W2 (Hl, M). Overwrites out.
void fc2_forward(int64_t rows, int64_t model_dim, int64_t hidden, const float* act,
                 const float* w2, float* out);
// dW2 (Hl, M) += act^T dy; dact (R, Hl) = dy (R, M) W2^T. Accumulates dw2, overwrites dact.
void fc2_backward(int64_t rows, int64_t model_dim, int64_t hidden, const float* act,
                  const float* dy, const float* w2, float* dw2, float* dact);
// dW1 (M, Hl) += x^T dpre; dx (R, M) = dpre (R, Hl) W1^T. Accumulates dw1, overwrites dx.
void fc1_backward(int64_t rows, int64_t model_dim, int64_t hidden, const float* x,
                  const float* dpre, const float* w1, float* dw1, float* dx);

// FLOPs of the six products (forward and backward) of one expert over `rows` rows.
double expert_product_flops(int64_t rows, int64_t model_dim, int64_t hidden);

// The floor of a forward + backward pass: the six products of every expert (rows[e] rows
// each) run alone on scratch memory, `reps` times; returns the median total (us).
double time_expert_products_us(const std::vector<int64_t>& rows, int64_t model_dim,
                               int64_t hidden, int reps);

}  // namespace parm::moe
