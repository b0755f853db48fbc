// The CPU shared experts (moe/shared_experts.h, docs/spec.md §9) against the fp64 oracle's,
// one rank holding the whole of each FFN, gated and not, of either kind, at fp32 and with the
// bf16 products (within the bf16 tolerance, and visibly rounded); and a second backward pass
// after one forward gives the same gradients (the passes keep what they read).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/reference_moe.h"
#include "moe/shared_experts.h"

namespace parm::moe {
namespace {

// The whole shared FFNs of `p` as one rank's shards (N_s, M, H_s)...
ExpertShards shards_of(const MoeShape& sh, const ref::MoeParams<float>& p) {
  const int64_t n = sh.shared_experts, M = sh.model_dim, hs = sh.shared_hidden;
  const bool gated = is_gated(sh.expert_mlp);
  ExpertShards w{Tensor({n, M, hs}), Tensor({n, gated ? 0 : hs}), Tensor({n, hs, M}),
                 Tensor({n, gated ? 0 : M}), Tensor({n, gated ? M : 0, hs})};
  const std::pair<Tensor*, const std::vector<float>*> all[] = {
      {&w.w1, &p.sw1}, {&w.b1, &p.sb1}, {&w.w2, &p.sw2}, {&w.b2, &p.sb2}, {&w.w3, &p.sw3}};
  for (const auto& [t, v] : all) std::copy(v->begin(), v->end(), t->data());
  return w;
}

double max_rel(const float* a, const std::vector<double>& b) {
  double err = 0, big = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, std::fabs(a[i] - b[i]));
    big = std::max(big, std::fabs(b[i]));
  }
  return err / big;
}

TEST(SharedExperts, MatchTheOracleAndBackwardTwiceIsTheSame) {
  for (const Precision prec : {Precision::kFp32, Precision::kBf16})
  for (const ExpertMlp mlp : {ExpertMlp::kGelu, ExpertMlp::kSwiglu})
    for (const bool gate : {false, true}) {
      SCOPED_TRACE(std::string(precision_name(prec)) + " " + expert_mlp_name(mlp) +
                   (gate ? " gated" : ""));
      // fp32: sums of a few fp32 products; bf16: the layer's bf16 tolerance
      // (moe::default_tolerance), and above fp32's error (the operands really are rounded).
      const bool bf16 = prec == Precision::kBf16;
      const double tol = bf16 ? 2e-2 : 1e-5;
      // A layer whose routed output the oracle's dout path does not need: E 2, k 1.
      MoeShape sh = MoeShape::of(12, 8, 4, 2, 1, "4");
      sh.expert_mlp = mlp;
      sh.shared_experts = 2;
      sh.shared_hidden = 6;
      sh.shared_gate = gate;
      const auto p = ref::init_params<float>(sh, 7);
      const auto p64 = ref::init_params<double>(sh, 7);
      const auto x64 = ref::init_input<double>(sh, 8);
      const auto f64 = ref::moe_forward(sh, p64, x64);
      std::vector<double> dout(x64.size());
      for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(0.37 * static_cast<double>(i));
      const auto g64 = ref::moe_backward(p64, f64, dout, 0.0, 0.0);

      const int64_t T = sh.tokens, M = sh.model_dim;
      Tensor x({T, M}), out({T, M}), dq({T, M}), gate_w({gate ? M : 0});
      for (int64_t i = 0; i < T * M; ++i) {
        x[i] = static_cast<float>(x64[i]);
        dq[i] = static_cast<float>(dout[i]);
      }
      std::copy(p.swg.begin(), p.swg.end(), gate_w.data());
      const ExpertShards w = shards_of(sh, p);
      SharedWorkspace ws;
      ws.reserve(2, T, M, 6, mlp, gate, prec);
      shared_forward(x, w, gate_w, true, ws, out, nullptr);
      // The oracle's shared part: g P (its out minus the routed output, here out - combine).
      std::vector<double> want(static_cast<size_t>(T * M));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t m = 0; m < M; ++m)
          want[t * M + m] = f64.shared_gate[t] * f64.shared_sum[t * M + m];
      EXPECT_LT(max_rel(out.data(), want), tol);
      if (bf16) EXPECT_GT(max_rel(out.data(), want), 1e-5) << "no bf16 rounding in the output";

      std::vector<std::vector<float>> first;
      for (int pass = 0; pass < 2; ++pass) {
        ExpertShards dw{Tensor(w.w1.shape()), Tensor(w.b1.shape()), Tensor(w.w2.shape()),
                        Tensor(w.b2.shape()), Tensor(w.w3.shape())};
        Tensor dgate({gate ? M : 0}), dx({T, M});
        shared_backward(x, dq, w, gate_w, ws, dw, dgate.data(), dx, nullptr);
        std::vector<std::vector<float>> got;
        for (const Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2, &dw.w3, &dgate})
          got.emplace_back(t->data(), t->data() + t->numel());
        if (pass == 0) {
          first = got;
          const std::vector<const std::vector<double>*> oracle = {
              &g64.dparams.sw1, &g64.dparams.sb1, &g64.dparams.sw2, &g64.dparams.sb2,
              &g64.dparams.sw3, &g64.dparams.swg};
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i].size(), oracle[i]->size()) << i;
            EXPECT_LT(max_rel(got[i].data(), *oracle[i]), tol) << "tensor " << i;
          }
        } else {
          EXPECT_EQ(got, first) << "a second backward pass differs";
        }
      }
    }
}

}  // namespace
}  // namespace parm::moe
