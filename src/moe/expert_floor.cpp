#include "moe/expert_floor.h"

#include <algorithm>
#include <utility>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "parm/stats.h"
#include "parm/timer.h"

namespace parm::moe {

float ExpertProductsFloor::input(int64_t expert, Input which, int64_t i) {
  return 0.01f * static_cast<float>((i + 7 * static_cast<int64_t>(which) + 13 * expert) % 97) -
         0.48f;
}

namespace {

size_t size(int64_t n) { return static_cast<size_t>(std::max<int64_t>(n, 1)); }

// Input `which` of expert e, (rows, cols).
std::vector<float> filled(int64_t e, ExpertProductsFloor::Input which, int64_t rows, int64_t cols) {
  std::vector<float> v(size(rows * cols));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = ExpertProductsFloor::input(e, which, static_cast<int64_t>(i));
  return v;
}

cpu::Bf16Buffer packed_a(bool trans, int64_t m, int64_t k, const std::vector<float>& t,
                         int64_t ld) {
  cpu::Bf16Buffer p(size(cpu::bf16_packed_a_size(m, k)));
  cpu::bf16_pack_a(trans, m, k, t.data(), ld, p.data());
  return p;
}

cpu::Bf16Buffer packed_b(int64_t k, int64_t n, const std::vector<float>& t) {
  cpu::Bf16Buffer p(size(cpu::bf16_packed_b_size(k, n)));
  cpu::bf16_pack_b(false, k, n, t.data(), n, p.data());
  return p;
}

}  // namespace

ExpertProductsFloor::ExpertProductsFloor(std::vector<int64_t> rows, int64_t M, int64_t hl,
                                         Precision p, ExpertMlp mlp)
    : rows_(std::move(rows)), model_dim_(M), hidden_(hl), precision_(p), mlp_(mlp) {
  PARM_CHECK(!rows_.empty() && M >= 1 && hl >= 1,
             "expert products floor: {} experts, M={}, Hl={} (need at least one expert, M and "
             "Hl >= 1)", rows_.size(), M, hl);
  experts_.resize(rows_.size());
  for (size_t e = 0; e < rows_.size(); ++e) {
    const int64_t n = rows_[e];
    PARM_CHECK(n >= 0, "expert products floor: expert {} has {} rows", e, n);
    Expert& x = experts_[e];
    for (ExpertProduct q : expert_products(mlp)) {
      const GemmCall g = expert_gemm(q, n, M, hl);
      x.out[static_cast<int>(q)].assign(size(g.m * g.n), 0.0f);
    }
    if (p == Precision::kBf16) {
      pack(static_cast<int64_t>(e), x);
      continue;
    }
    const auto ei = static_cast<int64_t>(e);
    x.in[kX] = filled(ei, kX, n, M);
    x.in[kW1] = filled(ei, kW1, M, hl);
    x.in[kAct] = filled(ei, kAct, n, hl);
    x.in[kW2] = filled(ei, kW2, hl, M);
    x.in[kDy] = filled(ei, kDy, n, M);
    x.in[kDPre] = filled(ei, kDPre, n, hl);
    if (is_gated(mlp)) {
      x.in[kW3] = filled(ei, kW3, M, hl);
      x.in[kDGate] = filled(ei, kDGate, n, hl);
    }
  }
}

// Packs expert e's inputs in the layouts the pass reads; its fp32 inputs are not kept.
void ExpertProductsFloor::pack(int64_t e, Expert& x) {
  const int64_t n = rows_[static_cast<size_t>(e)], M = model_dim_, hl = hidden_;
  {
    const auto w1 = filled(e, kW1, M, hl);
    x.w1b.resize(size(cpu::bf16_packed_b_size(M, hl)));
    x.w1tb.resize(size(cpu::bf16_packed_b_size(hl, M)));
    cpu::bf16_pack_b_both(M, hl, w1.data(), x.w1b.data(), x.w1tb.data());
    const auto w2 = filled(e, kW2, hl, M);
    x.w2b.resize(size(cpu::bf16_packed_b_size(hl, M)));
    x.w2tb.resize(size(cpu::bf16_packed_b_size(M, hl)));
    cpu::bf16_pack_b_both(hl, M, w2.data(), x.w2b.data(), x.w2tb.data());
  }
  if (is_gated(mlp_)) {
    const auto w3 = filled(e, kW3, M, hl);
    x.w3b.resize(size(cpu::bf16_packed_b_size(M, hl)));
    x.w3tb.resize(size(cpu::bf16_packed_b_size(hl, M)));
    cpu::bf16_pack_b_both(M, hl, w3.data(), x.w3b.data(), x.w3tb.data());
    const auto dgate = filled(e, kDGate, n, hl);
    x.dgatea = packed_a(false, n, hl, dgate, hl);
    x.dgateb = packed_b(n, hl, dgate);
  }
  const auto xi = filled(e, kX, n, M), act = filled(e, kAct, n, hl);
  const auto dy = filled(e, kDy, n, M), dpre = filled(e, kDPre, n, hl);
  x.xa = packed_a(false, n, M, xi, M);
  x.xt = packed_a(true, M, n, xi, M);
  x.acta = packed_a(false, n, hl, act, hl);
  x.actt = packed_a(true, hl, n, act, hl);
  x.dya = packed_a(false, n, M, dy, M);
  x.dyb = packed_b(n, M, dy);
  x.dprea = packed_a(false, n, hl, dpre, hl);
  x.dpreb = packed_b(n, hl, dpre);
}

void ExpertProductsFloor::run() {
  const int64_t M = model_dim_, hl = hidden_;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const int64_t n = rows_[e];
    Expert& x = experts_[e];
    auto c = [&x](ExpertProduct q) { return x.out[static_cast<int>(q)].data(); };
    if (precision_ == Precision::kBf16) {
      // By ExpertProduct: the packed operands (A, B) the layer's pass multiplies.
      const std::pair<const cpu::Bf16Buffer*, const cpu::Bf16Buffer*> operands[] = {
          {&x.xa, &x.w1b},    {&x.acta, &x.w2b},  {&x.actt, &x.dyb},
          {&x.dya, &x.w2tb},  {&x.xt, &x.dpreb},  {&x.dprea, &x.w1tb},
          {&x.xa, &x.w3b},    {&x.xt, &x.dgateb}, {&x.dgatea, &x.w3tb}};
      for (ExpertProduct q : expert_products(mlp_)) {
        const GemmCall g = expert_gemm(q, n, M, hl);
        const auto& [a, b] = operands[static_cast<int>(q)];
        cpu::gemm_bf16_packed(g.m, g.n, g.k, a->data(), b->data(), c(q), g.n, g.accumulate);
      }
      continue;
    }
    const auto in = [&x](Input i) { return x.in[i].data(); };
    // By ExpertProduct.
    const std::pair<Input, Input> operands[] = {{kX, kW1},  {kAct, kW2},   {kAct, kDy},
                                                {kDy, kW2}, {kX, kDPre},   {kDPre, kW1},
                                                {kX, kW3},  {kX, kDGate}, {kDGate, kW3}};
    for (ExpertProduct q : expert_products(mlp_)) {
      const auto& [a, b] = operands[static_cast<int>(q)];
      run_expert_gemm(q, n, M, hl, in(a), in(b), c(q));
    }
  }
}

double ExpertProductsFloor::time_us(int reps) {
  PARM_CHECK(reps >= 1, "expert products floor: reps={} (need >= 1)", reps);
  std::vector<double> totals;
  for (int i = 0; i < reps + 1; ++i) {  // one untimed round first
    const double t0 = now_us();
    run();
    if (i > 0) totals.push_back(now_us() - t0);
  }
  return median(totals);
}

const float* ExpertProductsFloor::output(int64_t e, ExpertProduct q) const {
  PARM_CHECK(e >= 0 && e < static_cast<int64_t>(experts_.size()),
             "expert products floor: expert {} of {}", e, experts_.size());
  return experts_[static_cast<size_t>(e)].out[static_cast<int>(q)].data();
}

double time_expert_products_us(const std::vector<int64_t>& rows, int64_t M, int64_t hl,
                               int reps, Precision p, ExpertMlp mlp) {
  return ExpertProductsFloor(rows, M, hl, p, mlp).time_us(reps);
}

}  // namespace parm::moe
