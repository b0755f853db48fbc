#include "moe/expert_products.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"
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
    case ExpertProduct::kGate: return {false, false, false, r, hl, M};
    case ExpertProduct::kDW3: return {true, false, true, M, hl, r};
    case ExpertProduct::kDXGate: return {false, true, true, r, M, hl};
  }
  return {};
}

std::span<const ExpertProduct> expert_products(ExpertMlp mlp) {
  if (is_gated(mlp)) return kSwigluExpertProducts;
  return kExpertProducts;
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

// Rows per block of the fused steps: a multiple of 32 (packed A's row blocks, B's pairs and
// the k blocks of a transposed A); 32 rows of Hl = 2048 fp32 are 256 KiB, in L2 while they
// are packed.
constexpr int64_t kFuseRows = 32;

namespace {

void lap(PhaseClock* clock, const char* phase) {
  if (clock != nullptr) clock->lap(phase);
}

}  // namespace

void RowRuns::copy(int64_t r0, int64_t n, float* dst) const {
  const auto bytes = [this](int64_t rows) { return static_cast<size_t>(rows * cols) * sizeof(float); };
  if (counts == nullptr) {
    PARM_CHECK(r0 >= 0 && r0 + n <= runs, "rows {} .. {} of {} contiguous rows", r0, r0 + n, runs);
    std::memcpy(dst, base + r0 * cols, bytes(n));
    return;
  }
  int64_t first = 0;  // number of run s's first row
  for (int64_t s = 0; s < runs && n > 0; ++s) {
    const int64_t count = counts[s * count_stride];
    if (r0 < first + count) {
      const int64_t take = std::min(n, first + count - r0);
      const float* run = starts != nullptr ? base + starts[s * count_stride] * cols
                                           : base + s * run_stride;
      std::memcpy(dst, run + (r0 - first) * cols, bytes(take));
      dst += take * cols;
      r0 += take;
      n -= take;
    }
    first += count;
  }
  PARM_CHECK(n == 0, "rows up to {} asked of {} runs holding {} rows", r0 + n, runs, first);
}

void Bf16ExpertProducts::reserve(int64_t experts, int64_t max_rows, int64_t M, int64_t hl,
                                 bool gated) {
  experts_ = experts, max_rows_ = max_rows, model_dim_ = M, hidden_ = hl, gated_ = gated;
  const auto n = [](int64_t x) { return static_cast<size_t>(x); };
  a_.assign(n(std::max(cpu::bf16_packed_a_size(max_rows, M),
                       cpu::bf16_packed_a_size(max_rows, hl))),
            0);
  a2_.assign(n(cpu::bf16_packed_a_size(max_rows, hl)), 0);
  b_.assign(n(std::max(cpu::bf16_packed_b_size(max_rows, M),
                       cpu::bf16_packed_b_size(max_rows, hl))),
            0);
  block_.assign(n(cpu::gelu_pack_scratch_size(hl)), 0.0f);
  rows_.assign(n(kFuseRows * M), 0.0f);
  // The layouts of (M, Hl) and (Hl, M) differ in size when M or Hl is not a multiple of 32.
  w_stride_ = std::max(cpu::bf16_packed_b_size(M, hl), cpu::bf16_packed_b_size(hl, M));
  for (auto* w : {&w1_, &w2_, &w2t_, &w1t_}) w->assign(n(experts * w_stride_), 0);
  xt_stride_ = cpu::bf16_packed_a_size(M, max_rows);
  at_stride_ = cpu::bf16_packed_a_size(hl, max_rows);
  xt_.assign(n(experts * xt_stride_), 0);
  at_.assign(n(experts * at_stride_), 0);
  w3_.assign(n(gated ? experts * w_stride_ : 0), 0);
  w3t_.assign(n(gated ? experts * w_stride_ : 0), 0);
  act_rows_.assign(n(gated ? kFuseRows * hl : 0), 0.0f);
  copies_.forget();
}

bool Bf16ExpertProducts::pack_weights(const float* w1, const float* w2, const float* w3) {
  PARM_CHECK((w3 != nullptr) == gated_,
             "bf16 expert products reserved for {} experts, given weights {} W3",
             gated_ ? "swiglu" : "gelu", w3 != nullptr ? "with" : "without");
  if (!copies_.stale(w1, w2)) return false;
  const double t0 = now_us();
  const int64_t M = model_dim_, hl = hidden_, packed = w_stride_;
  for (int64_t e = 0; e < experts_; ++e) {
    // W1 (M, Hl) and W1^T (Hl, M); W2 (Hl, M) and W2^T (M, Hl); W3 as W1.
    cpu::bf16_pack_b_both(M, hl, w1 + e * M * hl, w1_.data() + e * packed, w1t_.data() + e * packed);
    cpu::bf16_pack_b_both(hl, M, w2 + e * hl * M, w2_.data() + e * packed, w2t_.data() + e * packed);
    if (gated_)
      cpu::bf16_pack_b_both(M, hl, w3 + e * M * hl, w3_.data() + e * packed,
                            w3t_.data() + e * packed);
  }
  copies_.made(w1, w2);
  last_pack_us_ = now_us() - t0;
  return true;
}

void Bf16ExpertProducts::fc1_forward(int64_t e, int64_t rows, const RowRuns& x, float* pre,
                                     PhaseClock* clock) {
  const int64_t M = model_dim_, hl = hidden_;
  float* block = rows_.data();
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    x.copy(r0, nr, block);
    // x as A (row block r0) and x^T for dW1 (its k block r0)
    cpu::bf16_pack_a(false, nr, M, block, M, a_.data() + cpu::bf16_packed_a_size(r0, M));
    cpu::bf16_pack_at_rows(r0, nr, M, rows, block, M, xt_.data() + e * xt_stride_);
  }
  lap(clock, "rows in/out");
  cpu::gemm_bf16_packed(rows, hl, M, a_.data(), w1_.data() + e * w_stride_, pre, hl, false);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::bias_gelu_fc2_forward(int64_t e, int64_t rows, float* pre,
                                               const float* b1, float* out, PhaseClock* clock,
                                               bool accumulate) {
  const int64_t M = model_dim_, hl = hidden_;
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    // act as row block r0 of packed A (after the packed A of r0 rows) and as act^T's k block
    // r0 from the registers that computed it; gelu' over pre for the backward pass.
    cpu::bias_gelu_pack_both_bf16(pre + r0 * hl, b1, r0, nr, rows, hl,
                                  a_.data() + cpu::bf16_packed_a_size(r0, hl),
                                  at_.data() + e * at_stride_, block_.data());
  }
  lap(clock, "bias + GeLU");
  cpu::gemm_bf16_packed(rows, M, hl, a_.data(), w2_.data() + e * w_stride_, out, M, accumulate);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::gate_forward(int64_t e, int64_t rows, float* gate, PhaseClock* clock) {
  PARM_CHECK(gated_, "bf16 expert products: gate_forward on gelu experts");
  const int64_t M = model_dim_, hl = hidden_;
  cpu::gemm_bf16_packed(rows, hl, M, a_.data(), w3_.data() + e * w_stride_, gate, hl, false);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::swiglu_fc2_forward(int64_t e, int64_t rows, const float* pre,
                                            const float* gate, float* out, PhaseClock* clock,
                                            bool accumulate) {
  PARM_CHECK(gated_, "bf16 expert products: swiglu_fc2_forward on gelu experts");
  const int64_t M = model_dim_, hl = hidden_;
  float* act = act_rows_.data();
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    // act of this block, as row block r0 of packed A and as act^T's k block r0 (for dW2)
    cpu::swiglu_forward(pre + r0 * hl, gate + r0 * hl, act, nr * hl);
    cpu::bf16_pack_a(false, nr, hl, act, hl, a_.data() + cpu::bf16_packed_a_size(r0, hl));
    cpu::bf16_pack_at_rows(r0, nr, hl, rows, act, hl, at_.data() + e * at_stride_);
  }
  lap(clock, "SwiGLU");
  cpu::gemm_bf16_packed(rows, M, hl, a_.data(), w2_.data() + e * w_stride_, out, M, accumulate);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::pack_rows_a_b(int64_t r0, int64_t nr, int64_t rows, const float* t,
                                       uint16_t* a) {
  const int64_t hl = hidden_;
  cpu::bf16_pack_a(false, nr, hl, t + r0 * hl, hl, a + cpu::bf16_packed_a_size(r0, hl));
  cpu::bf16_pack_b_rows(r0, nr, rows, hl, t + r0 * hl, hl, b_.data());
}

void Bf16ExpertProducts::swiglu_backward_fc1_backward(int64_t e, int64_t rows, const float* pre,
                                                      const float* gate, float* dact,
                                                      float* dgate, float* dw1, float* dw3,
                                                      float* dx, PhaseClock* clock) {
  PARM_CHECK(gated_, "bf16 expert products: swiglu_backward_fc1_backward on gelu experts");
  const int64_t M = model_dim_, hl = hidden_;
  // dpre (over dact) and dgate, each packed as A (for dx) and as B (for dW1, dW3) a block at
  // a time while the block is in cache; dpre's products run before dgate's packing reuses b_.
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    cpu::swiglu_backward(pre + r0 * hl, gate + r0 * hl, dact + r0 * hl, dact + r0 * hl,
                         dgate + r0 * hl, nr * hl);
    pack_rows_a_b(r0, nr, rows, dact, a2_.data());
  }
  lap(clock, "SwiGLU backward");
  // dW1 (M, Hl) += x^T dpre; dx (R, M) = dpre W1^T
  cpu::gemm_bf16_packed(M, hl, rows, xt_.data() + e * xt_stride_, b_.data(), dw1, hl, true);
  cpu::gemm_bf16_packed(rows, M, hl, a2_.data(), w1t_.data() + e * w_stride_, dx, M, false);
  lap(clock, "expert products");
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows)
    pack_rows_a_b(r0, std::min(kFuseRows, rows - r0), rows, dgate, a2_.data());
  lap(clock, "SwiGLU backward");
  // dW3 (M, Hl) += x^T dgate; dx (R, M) += dgate W3^T
  cpu::gemm_bf16_packed(M, hl, rows, xt_.data() + e * xt_stride_, b_.data(), dw3, hl, true);
  cpu::gemm_bf16_packed(rows, M, hl, a2_.data(), w3t_.data() + e * w_stride_, dx, M, true);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::fc2_backward(int64_t e, int64_t rows, const RowRuns& dy, float* db2,
                                      float* dw2, float* dact, PhaseClock* clock) {
  const int64_t M = model_dim_, hl = hidden_;
  float* block = rows_.data();
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    dy.copy(r0, nr, block);
    if (db2 != nullptr) cpu::bias_backward(block, db2, nr, M);  // rows in order: same sums
    // dy as rows r0.. of B (for dW2) and as A (for dact)
    cpu::bf16_pack_b_rows(r0, nr, rows, M, block, M, b_.data());
    cpu::bf16_pack_a(false, nr, M, block, M, a_.data() + cpu::bf16_packed_a_size(r0, M));
  }
  lap(clock, "rows in/out");
  // dW2 (Hl, M) += act^T dy; dact (R, Hl) = dy W2^T
  cpu::gemm_bf16_packed(hl, M, rows, at_.data() + e * at_stride_, b_.data(), dw2, M, true);
  cpu::gemm_bf16_packed(rows, hl, M, a_.data(), w2t_.data() + e * w_stride_, dact, hl, false);
  lap(clock, "expert products");
}

void Bf16ExpertProducts::gelu_backward_fc1_backward(int64_t e, int64_t rows, const float* grad,
                                                    const float* dact, float* db1, float* dw1,
                                                    float* dx, PhaseClock* clock) {
  const int64_t M = model_dim_, hl = hidden_;
  for (int64_t r0 = 0; r0 < rows; r0 += kFuseRows) {
    const int64_t nr = std::min(kFuseRows, rows - r0);
    // dpre = gelu' dact, as A (for dx) and as rows r0.. of B (for dW1), from registers
    cpu::gelu_grad_pack_both_bf16(grad + r0 * hl, dact + r0 * hl, db1, r0, nr, rows, hl,
                                  a2_.data() + cpu::bf16_packed_a_size(r0, hl), b_.data(),
                                  block_.data());
  }
  lap(clock, "GeLU + bias backward");
  // dW1 (M, Hl) += x^T dpre; dx (R, M) = dpre W1^T
  cpu::gemm_bf16_packed(M, hl, rows, xt_.data() + e * xt_stride_, b_.data(), dw1, hl, true);
  cpu::gemm_bf16_packed(rows, M, hl, a2_.data(), w1t_.data() + e * w_stride_, dx, M, false);
  lap(clock, "expert products");
}

int64_t Bf16ExpertProducts::held_bytes() const {
  size_t n = a_.size() + a2_.size() + b_.size() + w1_.size() + w2_.size() + w2t_.size() +
             w1t_.size() + xt_.size() + at_.size() + w3_.size() + w3t_.size();
  return static_cast<int64_t>(n * sizeof(uint16_t) +
                              (block_.size() + rows_.size() + act_rows_.size()) * sizeof(float));
}

double expert_product_flops(int64_t rows, int64_t M, int64_t hl, ExpertMlp mlp) {
  double flops = 0.0;
  for (ExpertProduct p : expert_products(mlp)) flops += expert_gemm(p, rows, M, hl).flops();
  return flops;
}

}  // namespace parm::moe
