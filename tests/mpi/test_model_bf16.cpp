// The model at --precision bf16 on the CPU (dense weights packed once per pass, the dense MLP's
// GeLU at bf16): its gradients track fp32's within the bf16 rounding and differ from them
// (bf16 really ran); a pass after the weights change reads the new weights (the packs are
// made again), bit for bit as a fresh model holding those weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "model/model.h"
#include "model_test_util.h"

namespace parm::model {
namespace {

using test_util::count_targets;
using test_util::kMicroBatch;
using test_util::make_batch;
using test_util::self_topology;
using test_util::tiny_config;

double rel_l2(const Tensor& got, const Tensor& want) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A dense model (moe_every 0): the dense products and GeLU are what this test is about, and a
// top-k choice that bf16 rounding flips would move every upstream gradient by far more than
// the rounding (the MoE layer's bf16 path is checked against its oracle in Equivalence.Bf16*).
ModelConfig dense_config(Arch arch) {
  ModelConfig c = tiny_config(arch);
  c.moe_every = 0;
  return c;
}

// An update of every parameter, the same in both models (used's and fresh's params, in
// order); used's gradients back to zero.
void update_both(const std::vector<Param*>& pu, const std::vector<Param*>& pf) {
  for (size_t i = 0; i < pu.size(); ++i) {
    for (int64_t j = 0; j < pu[i]->value.numel(); ++j) {
      const float v = pu[i]->value[j] * 0.75f + 0.01f;
      pu[i]->value[j] = v;
      pf[i]->value[j] = v;
    }
    pu[i]->grad.zero();
  }
}

// Every gradient of the two models' params (in order) bit for bit the same.
void expect_same_grads(const std::vector<Param*>& pu, const std::vector<Param*>& pf) {
  for (size_t i = 0; i < pu.size(); ++i)
    for (int64_t j = 0; j < pu[i]->grad.numel(); ++j)
      ASSERT_EQ(pu[i]->grad[j], pf[i]->grad[j]) << pu[i]->name << " [" << j << "]";
}

TEST(ModelBf16, GradientsTrackFp32WithinTheRounding) {
  for (Arch arch : {Arch::kGpt2, Arch::kBert}) {
    auto f32 = make_model(self_topology(), dense_config(arch), {}, kMicroBatch);
    auto b16 = make_model(self_topology(), dense_config(arch), {}, kMicroBatch, Precision::kBf16);
    const Batch b = make_batch(arch, 0);
    const double denom = static_cast<double>(count_targets(b));
    const LossParts l32 = f32->forward_backward(b, {denom, 1.0}, 1.0f);
    const LossParts l16 = b16->forward_backward(b, {denom, 1.0}, 1.0f);
    EXPECT_NEAR(l16.lm_loss_sum / denom, l32.lm_loss_sum / denom, 2e-2);
    const auto p32 = f32->params(), p16 = b16->params();
    ASSERT_EQ(p32.size(), p16.size());
    double worst = 0.0;
    for (size_t i = 0; i < p32.size(); ++i) {
      const double e = rel_l2(p16[i]->grad, p32[i]->grad);
      EXPECT_LE(e, 5e-2) << p32[i]->name;  // every gradient term present, bf16-close
      worst = std::max(worst, e);
    }
    EXPECT_GT(worst, 1e-4);  // the products did round to bf16
  }
}

TEST(ModelBf16, APassAfterTheWeightsChangeReadsTheNewWeights) {
  const Arch arch = Arch::kGpt2;
  auto used = make_model(self_topology(), tiny_config(arch), {}, kMicroBatch, Precision::kBf16);
  auto fresh = make_model(self_topology(), tiny_config(arch), {}, kMicroBatch, Precision::kBf16);
  const Batch b = make_batch(arch, 0);
  const double denom = static_cast<double>(count_targets(b));
  used->forward_backward(b, {denom, 1.0}, 1.0f);  // packs the initial weights
  const auto pu = used->params(), pf = fresh->params();
  update_both(pu, pf);
  const LossParts lu = used->forward_backward(b, {denom, 1.0}, 1.0f);
  const LossParts lf = fresh->forward_backward(b, {denom, 1.0}, 1.0f);
  EXPECT_EQ(lu.lm_loss_sum, lf.lm_loss_sum);
  expect_same_grads(pu, pf);
}

// With a weights version given, the packs are made once per version: passes at the same
// version read the packs made at its first pass (a weight written behind the version's back
// is not seen), a new version reads the new weights, bit for bit as a fresh model.
TEST(ModelBf16, PacksOncePerWeightsVersion) {
  const Arch arch = Arch::kGpt2;
  auto used = make_model(self_topology(), tiny_config(arch), {}, kMicroBatch, Precision::kBf16);
  auto fresh = make_model(self_topology(), tiny_config(arch), {}, kMicroBatch, Precision::kBf16);
  const Batch b = make_batch(arch, 0);
  const double denom = static_cast<double>(count_targets(b));
  used->set_weights_version(1);
  const LossParts l1 = used->forward_backward(b, {denom, 1.0}, 1.0f);
  const auto pu = used->params(), pf = fresh->params();
  update_both(pu, pf);  // not announced: version 1's packs stay
  const LossParts l_stale = used->forward_backward(b, {denom, 1.0}, 1.0f);
  const LossParts l_fresh = fresh->forward_backward(b, {denom, 1.0}, 1.0f);
  EXPECT_NE(l_stale.lm_loss_sum, l_fresh.lm_loss_sum);  // the dense products read old packs
  EXPECT_NE(l_stale.lm_loss_sum, l1.lm_loss_sum);       // the rest read the new weights
  for (size_t i = 0; i < pu.size(); ++i) pu[i]->grad.zero();
  used->set_weights_version(2);
  const LossParts l2 = used->forward_backward(b, {denom, 1.0}, 1.0f);
  EXPECT_EQ(l2.lm_loss_sum, l_fresh.lm_loss_sum);
  expect_same_grads(pu, pf);
}

}  // namespace
}  // namespace parm::model
