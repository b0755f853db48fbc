// The models under hybrid parallelism: for every layout of a sweep and every schedule, one
// forward_backward of a tiny GPT-2-MoE and a tiny BERT-MoE gives the loss, l_aux and every
// gradient shard of the single-process model (built on a one-rank topology over
// MPI_COMM_SELF, processing the N_DP replicas' micro-batches one after another with gradient
// accumulation). Capacity factor E: no token is ever dropped, so S1's per-slice gating equals
// the full gate. Plus a finite-difference check of the single-process model's gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>

#include "model/model.h"
#include "model_test_util.h"
#include "mpi_test_util.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::model {
namespace {

using namespace test_util;
using schedule::Kind;

struct Lay {
  int mp, ep, esp;
};

std::vector<Lay> sweep_layouts() {
  switch (test::world_size()) {
    case 1: return {{1, 1, 1}};
    case 2: return {{2, 1, 2}, {1, 2, 1}, {2, 2, 1}, {1, 1, 2}};
    case 3: return {{3, 1, 3}, {1, 3, 1}};
    case 4: return {{2, 2, 2}, {1, 4, 1}, {2, 2, 1}, {4, 1, 4}, {2, 1, 2}, {1, 2, 2}};
    case 8: return {{2, 4, 2}, {4, 2, 4}, {1, 8, 1}, {2, 2, 2}};
    default: return {};
  }
}

struct SchedCase {
  std::string name;
  std::vector<LayerSchedule> scheds;
};

std::vector<SchedCase> schedule_cases(const Lay& l) {
  std::vector<SchedCase> out;
  if (schedule::supports(Kind::kBaseline, {.mp = l.mp, .ep = l.ep, .esp = l.esp}))
    out.push_back({"baseline", {{Kind::kBaseline, false, 1}}});
  out.push_back({"s1", {{Kind::kS1, false, 1}}});
  out.push_back({"s2", {{Kind::kS2, false, 1}}});
  out.push_back({"s1 fused", {{Kind::kS1, true, 3}}});
  out.push_back({"s2 fused", {{Kind::kS2, true, 2}}});
  out.push_back({"s1 fused + s2 (per layer)", {{Kind::kS1, true, 2}, {Kind::kS2, false, 1}}});
  return out;
}

// Every gradient shard of `model`, summed over its reduce group, against the whole tensors
// `grad` (by name) of the single-process model.
void expect_reduced_grads(Topology& topo, Model& model, const std::map<std::string, Tensor>& grad,
                          const std::string& what) {
  for (Param* p : model.params()) {
    Tensor g = p->grad.clone();
    topo.comm(p->grad_reduce).allreduce(g.data(), static_cast<size_t>(g.numel()));
    Tensor w(p->grad.shape());
    copy_shard_from_whole(grad.at(p->name), p->splits, w);
    double err = 0.0;
    for (int64_t i = 0; i < g.numel(); ++i)
      err = std::max(err, std::fabs(static_cast<double>(g[i]) - w[i]));
    EXPECT_LE(err, kGradTol * std::max(max_abs(grad.at(p->name)), 1e-6))
        << what << ": gradient of " << p->name;
  }
}

TEST(ModelEquivalence, EveryLayoutEveryScheduleMatchesSingleProcess) {
  int64_t num_checked = 0;
  double worst = 0.0;  // largest relative gradient error seen (printed: the margin)
  for (const Lay& lay : sweep_layouts()) {
    auto topo = test::make_topology(lay.mp, lay.ep, lay.esp);
    const int n_dp = topo->layout().dp;
    const int d = topo->comm(Group::kDp).rank();
    // GPT-2 and BERT with gelu experts, GPT-2 with swiglu experts (W3, no biases), and with
    // them two gated shared experts (split over mp like the dense FFN).
    for (const auto& [arch, mlp, shared] : {std::tuple{Arch::kGpt2, ExpertMlp::kGelu, 0},
                                            std::tuple{Arch::kBert, ExpertMlp::kGelu, 0},
                                            std::tuple{Arch::kGpt2, ExpertMlp::kSwiglu, 0},
                                            std::tuple{Arch::kGpt2, ExpertMlp::kSwiglu, 2}}) {
      const Reference& ref = reference(arch, n_dp, mlp, shared);
      int64_t denom = 0;
      for (int i = 0; i < n_dp; ++i) denom += count_targets(make_batch(arch, i));
      const Batch batch = make_batch(arch, d);
      for (const SchedCase& sc : schedule_cases(lay)) {
        const std::string what = fmt::format("{} {} shared {} mp={} ep={} esp={} {} rank {}",
                                             arch == Arch::kGpt2 ? "gpt2" : "bert",
                                             expert_mlp_name(mlp), shared, lay.mp, lay.ep,
                                             lay.esp, sc.name, test::world_rank());
        auto model = make_model(*topo, tiny_config(arch, mlp, shared), sc.scheds, kMicroBatch);
        const LossParts lp = model->forward_backward(
            batch, {static_cast<double>(denom), static_cast<double>(n_dp)}, 1.0f);
        // Loss: summed over the DP replicas.
        double sums[2] = {lp.lm_loss_sum, lp.aux_loss};
        topo->comm(Group::kDp).allreduce(sums, 2);
        EXPECT_NEAR(sums[0], ref.lm_loss_sum, kLossTol * std::fabs(ref.lm_loss_sum)) << what;
        EXPECT_NEAR(sums[1], ref.aux_sum, kLossTol * std::fabs(ref.aux_sum) + 1e-7) << what;
        EXPECT_EQ(lp.num_targets, count_targets(batch)) << what;
        EXPECT_GE(model->last_comm_us(), 0.0);
        EXPECT_GT(model->last_compute_us(), 0.0);
        EXPECT_GT(model->flops_per_step(kMicroBatch * 8), 0.0);
        ASSERT_EQ(static_cast<int64_t>(model->schedules().size()), 2) << what;

        for (Param* p : model->params()) {
          auto vit = ref.value.find(p->name);
          ASSERT_NE(vit, ref.value.end()) << "no parameter " << p->name << " in the reference";
          ASSERT_EQ(p->whole_shape, vit->second.shape()) << p->name;
          // Initial values: this rank's shard of the single-process tensor, bit for bit.
          Tensor expect(p->value.shape());
          copy_shard_from_whole(vit->second, p->splits, expect);
          int64_t bad = 0;
          for (int64_t i = 0; i < expect.numel(); ++i) bad += p->value[i] != expect[i];
          EXPECT_EQ(bad, 0) << what << ": initial value of " << p->name;
          // Gradient: reduce over the group that sees different data, then compare every
          // rank's shard (so every replica, not just the owner, is checked).
          Tensor g = p->grad.clone();
          topo->comm(p->grad_reduce).allreduce(g.data(), static_cast<size_t>(g.numel()));
          const Tensor& gref_whole = ref.grad.at(p->name);
          Tensor gref(p->grad.shape());
          copy_shard_from_whole(gref_whole, p->splits, gref);
          double err = 0.0;
          for (int64_t i = 0; i < g.numel(); ++i)
            err = std::max(err, std::fabs(static_cast<double>(g[i]) - gref[i]));
          const double scale = std::max(max_abs(gref_whole), 1e-6);
          worst = std::max(worst, err / scale);
          EXPECT_LE(err / scale, kGradTol)
              << what << ": gradient of " << p->name << " max error " << err
              << " vs largest entry " << scale;
          ++num_checked;
        }
        // The owner logic: the owners' shards assemble every whole tensor exactly once.
        for (Param* p : model->params()) {
          Tensor whole(p->whole_shape);
          if (owns_copy(*p, *topo)) copy_shard_to_whole(p->value, p->splits, whole);
          topo->comm(Group::kWorld).allreduce(whole.data(), static_cast<size_t>(whole.numel()));
          const Tensor& vref = ref.value.at(p->name);
          int64_t bad = 0;
          for (int64_t i = 0; i < whole.numel(); ++i) bad += whole[i] != vref[i];
          EXPECT_EQ(bad, 0) << what << ": owners' shards of " << p->name;
        }
      }
    }
  }
  EXPECT_GT(num_checked, 0);
  double w = worst;
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (test::world_rank() == 0)
    std::printf("model equivalence: %ld gradient shards checked per rank, largest relative "
                "error %.2e (tolerance %.0e)\n",
                static_cast<long>(num_checked), w, kGradTol);
}

// aux_loss_coeff and router_z_loss weigh the mean over the step's gate calls
// (docs/spec.md §6): a step of N micro-batches that are all the same batch b, gated by N
// gate calls (grad accumulation on one rank, or one each on N_DP replicas), has the
// gradient of one pass over b. Before the fix the l_aux and z-loss terms entered once per
// gate call, so their part of the gradient grew N-fold; large coefficients make it count.
TEST(ModelLoss, AuxAndZLossGradientsAreMeansOverGateCalls) {
  ModelConfig cfg = tiny_config(Arch::kGpt2);
  cfg.aux_loss_coeff = 1.0f;
  cfg.router_z_loss = 0.1f;
  const Batch b = make_batch(Arch::kGpt2, 0);
  const double n = static_cast<double>(count_targets(b));
  // The gradient of one pass; and its l_aux part alone (coefficients 10x: the difference).
  std::map<std::string, Tensor> one, aux_part;
  {
    auto model = make_model(self_topology(), cfg, {}, kMicroBatch);
    model->forward_backward(b, {n, 1.0}, 1.0f);
    for (Param* p : model->params()) one[p->name] = p->grad.clone();
    ModelConfig heavy = cfg;
    heavy.aux_loss_coeff *= 10.0f;
    heavy.router_z_loss *= 10.0f;
    auto h = make_model(self_topology(), heavy, {}, kMicroBatch);
    h->forward_backward(b, {n, 1.0}, 1.0f);
    for (Param* p : h->params()) {
      Tensor d = p->grad.clone();
      for (int64_t i = 0; i < d.numel(); ++i) d[i] = (d[i] - one[p->name][i]) / 9.0f;
      aux_part[p->name] = std::move(d);
    }
  }
  // The router's gradient has an l_aux part well above the tolerance (or the test could
  // not see a doubled term).
  bool aux_counts = false;
  for (const auto& [name, g] : one)
    aux_counts |= name.find("moe.gate") != std::string::npos &&
                  max_abs(aux_part.at(name)) > 100 * kGradTol * std::max(max_abs(g), 1e-6);
  EXPECT_TRUE(aux_counts) << "no router weight whose gradient l_aux changes";
  auto expect_one = [&](const Tensor& g, const Param& p, const std::string& what) {
    Tensor want(p.grad.shape());
    copy_shard_from_whole(one.at(p.name), p.splits, want);
    double err = 0.0;
    for (int64_t i = 0; i < g.numel(); ++i)
      err = std::max(err, std::fabs(static_cast<double>(g[i]) - want[i]));
    EXPECT_LE(err, kGradTol * std::max(max_abs(one.at(p.name)), 1e-6))
        << what << ": gradient of " << p.name;
  };
  {  // Gradient accumulation on one rank: 3 micro-batches, 3 gate calls.
    auto model = make_model(self_topology(), cfg, {}, kMicroBatch);
    for (int a = 0; a < 3; ++a) model->forward_backward(b, {3.0 * n, 3.0}, 1.0f);
    for (Param* p : model->params()) expect_one(p->grad, *p, "grad_accum 3");
  }
  for (const Lay& lay : sweep_layouts()) {  // N_DP replicas, each with b
    auto topo = test::make_topology(lay.mp, lay.ep, lay.esp);
    const double n_dp = topo->layout().dp;
    auto model = make_model(*topo, cfg, {}, kMicroBatch);
    model->forward_backward(b, {n_dp * n, n_dp}, 1.0f);
    for (Param* p : model->params()) {
      Tensor g = p->grad.clone();
      topo->comm(p->grad_reduce).allreduce(g.data(), static_cast<size_t>(g.numel()));
      expect_one(g, *p, fmt::format("mp={} ep={} esp={} dp={}", lay.mp, lay.ep, lay.esp, n_dp));
    }
  }
}

// --aux-loss global (docs/spec.md §7): l_aux and the z-loss of a micro-step are over the
// tokens of every data-parallel replica, so N_DP replicas with micro-batches b_0..b_{N-1}
// have the loss and the (dp-summed) gradients of one process whose one micro-batch is their
// concatenation; under the default micro-batch scope the router's gradient differs from it.
TEST(ModelLoss, GlobalAuxLossIsTheConcatenatedMicroBatchs) {
  ModelConfig cfg = tiny_config(Arch::kGpt2);
  cfg.aux_loss_coeff = 1.0f;
  cfg.router_z_loss = 0.1f;
  cfg.aux_scope = AuxScope::kGlobal;
  auto concat = [](int n) {
    Batch all = make_batch(Arch::kGpt2, 0);
    for (int d = 1; d < n; ++d) {
      const Batch b = make_batch(Arch::kGpt2, d);
      all.batch += b.batch;
      all.tokens.insert(all.tokens.end(), b.tokens.begin(), b.tokens.end());
      all.targets.insert(all.targets.end(), b.targets.begin(), b.targets.end());
    }
    return all;
  };
  for (const Lay& lay : sweep_layouts()) {
    auto topo = test::make_topology(lay.mp, lay.ep, lay.esp);
    const int n_dp = topo->layout().dp;
    const Batch all = concat(n_dp);
    const double n = static_cast<double>(count_targets(all));
    auto ref = make_model(self_topology(), cfg, {}, kMicroBatch * n_dp);
    const LossParts want = ref->forward_backward(all, {n, 1.0}, 1.0f);
    std::map<std::string, Tensor> grad;
    for (Param* p : ref->params()) grad[p->name] = p->grad.clone();
    if (n_dp > 1) {  // the micro-batch scope's gradient is another one
      ModelConfig per = cfg;
      per.aux_scope = AuxScope::kMicroBatch;
      auto m = make_model(self_topology(), per, {}, kMicroBatch);
      for (int d = 0; d < n_dp; ++d)
        m->forward_backward(make_batch(Arch::kGpt2, d), {n, static_cast<double>(n_dp)}, 1.0f);
      double diff = 0.0;
      for (Param* p : m->params())
        if (p->name.find("moe.gate") != std::string::npos)
          for (int64_t i = 0; i < p->grad.numel(); ++i)
            diff = std::max(diff, std::fabs(static_cast<double>(p->grad[i]) -
                                            grad.at(p->name)[i]) /
                                      std::max(max_abs(grad.at(p->name)), 1e-6));
      EXPECT_GT(diff, 100 * kGradTol) << "the two scopes give the same router gradient";
    }
    for (const SchedCase& sc : schedule_cases(lay)) {
      const std::string what = fmt::format("mp={} ep={} esp={} dp={} {}", lay.mp, lay.ep,
                                           lay.esp, n_dp, sc.name);
      auto model = make_model(*topo, cfg, sc.scheds, kMicroBatch);
      const Batch mine = make_batch(Arch::kGpt2, topo->comm(Group::kDp).rank());
      const LossParts lp = model->forward_backward(mine, {n, static_cast<double>(n_dp)}, 1.0f);
      double lm = lp.lm_loss_sum;
      topo->comm(Group::kDp).allreduce(&lm, 1);
      EXPECT_NEAR(lm, want.lm_loss_sum, kLossTol * std::fabs(want.lm_loss_sum)) << what;
      // Every replica holds the one l_aux and z-loss of the micro-step.
      EXPECT_NEAR(lp.aux_loss, want.aux_loss, kLossTol * std::fabs(want.aux_loss) + 1e-7)
          << what;
      EXPECT_NEAR(lp.z_loss, want.z_loss, kLossTol * std::fabs(want.z_loss) + 1e-7) << what;
      expect_reduced_grads(*topo, *model, grad, what);
    }
  }
}

// --aux-loss sequence (docs/spec.md §7): l_aux is the mean over the sequences of each one's,
// so one micro-batch of B sequences has the loss and gradients of B one-sequence micro-batches
// accumulated under the micro-batch scope (the mean over B gate calls); the micro-batch scope
// on the B sequences at once gives another router gradient. Under every layout and schedule
// the N_DP replicas then match the single process accumulating their micro-batches.
TEST(ModelLoss, SequenceAuxLossIsTheMeanOverTheSequences) {
  ModelConfig cfg = tiny_config(Arch::kGpt2);
  cfg.aux_loss_coeff = 1.0f;
  cfg.router_z_loss = 0.1f;
  cfg.aux_scope = AuxScope::kSequence;
  ModelConfig per = cfg;
  per.aux_scope = AuxScope::kMicroBatch;
  auto grads_of = [](Model& m) {
    std::map<std::string, Tensor> g;
    for (Param* p : m.params()) g[p->name] = p->grad.clone();
    return g;
  };
  auto max_rel_diff = [](const std::map<std::string, Tensor>& a,
                         const std::map<std::string, Tensor>& b, const char* only) {
    double diff = 0.0;
    for (const auto& [name, g] : a) {
      if (only != nullptr && name.find(only) == std::string::npos) continue;
      const Tensor& w = b.at(name);
      for (int64_t i = 0; i < g.numel(); ++i)
        diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - w[i]) /
                                  std::max(max_abs(w), 1e-6));
    }
    return diff;
  };
  const Batch b = make_batch(Arch::kGpt2, 0);
  const double n = static_cast<double>(count_targets(b));
  auto seq = make_model(self_topology(), cfg, {}, kMicroBatch);
  const LossParts ls = seq->forward_backward(b, {n, 1.0}, 1.0f);
  const auto want = grads_of(*seq);
  {  // B one-sequence micro-batches under the micro-batch scope
    auto split = make_model(self_topology(), per, {}, 1);
    double aux = 0.0, lm = 0.0;
    for (int64_t s = 0; s < b.batch; ++s) {
      Batch one;
      one.batch = 1;
      one.seq_len = b.seq_len;
      const auto from = static_cast<std::ptrdiff_t>(s * b.seq_len);
      one.tokens.assign(b.tokens.begin() + from, b.tokens.begin() + from + b.seq_len);
      one.targets.assign(b.targets.begin() + from, b.targets.begin() + from + b.seq_len);
      const LossParts lp =
          split->forward_backward(one, {n, static_cast<double>(b.batch)}, 1.0f);
      aux += lp.aux_loss;
      lm += lp.lm_loss_sum;
    }
    EXPECT_NEAR(ls.aux_loss, aux / static_cast<double>(b.batch), kLossTol * std::fabs(aux));
    EXPECT_NEAR(ls.lm_loss_sum, lm, kLossTol * std::fabs(lm));
    EXPECT_LE(max_rel_diff(grads_of(*split), want, nullptr), kGradTol);
  }
  {  // the micro-batch scope on all B sequences: another l_aux and router gradient
    auto whole = make_model(self_topology(), per, {}, kMicroBatch);
    const LossParts lw = whole->forward_backward(b, {n, 1.0}, 1.0f);
    EXPECT_GT(std::fabs(lw.aux_loss - ls.aux_loss), 100 * kLossTol * std::fabs(ls.aux_loss));
    EXPECT_GT(max_rel_diff(grads_of(*whole), want, "moe.gate"), 100 * kGradTol)
        << "the two scopes give the same router gradient";
  }
  for (const Lay& lay : sweep_layouts()) {
    auto topo = test::make_topology(lay.mp, lay.ep, lay.esp);
    const int n_dp = topo->layout().dp;
    double n_all = 0.0;
    for (int d = 0; d < n_dp; ++d)
      n_all += static_cast<double>(count_targets(make_batch(Arch::kGpt2, d)));
    auto ref = make_model(self_topology(), cfg, {}, kMicroBatch);
    double lm_want = 0.0, aux_want = 0.0;
    for (int d = 0; d < n_dp; ++d) {
      const LossParts lp = ref->forward_backward(make_batch(Arch::kGpt2, d),
                                                 {n_all, static_cast<double>(n_dp)}, 1.0f);
      lm_want += lp.lm_loss_sum;
      aux_want += lp.aux_loss;
    }
    const auto grad = grads_of(*ref);
    for (const SchedCase& sc : schedule_cases(lay)) {
      const std::string what = fmt::format("mp={} ep={} esp={} dp={} {}", lay.mp, lay.ep,
                                           lay.esp, n_dp, sc.name);
      auto model = make_model(*topo, cfg, sc.scheds, kMicroBatch);
      const Batch mine = make_batch(Arch::kGpt2, topo->comm(Group::kDp).rank());
      const LossParts lp =
          model->forward_backward(mine, {n_all, static_cast<double>(n_dp)}, 1.0f);
      double sums[2] = {lp.lm_loss_sum, lp.aux_loss};
      topo->comm(Group::kDp).allreduce(sums, 2);
      EXPECT_NEAR(sums[0], lm_want, kLossTol * std::fabs(lm_want)) << what;
      EXPECT_NEAR(sums[1], aux_want, kLossTol * std::fabs(aux_want) + 1e-7) << what;
      expect_reduced_grads(*topo, *model, grad, what);
    }
  }
}

// The loss of forward() is the loss forward_backward() reports; a second forward_backward
// accumulates (doubles) the gradients.
TEST(ModelSingle, ForwardMatchesForwardBackwardAndGradsAccumulate) {
  for (Arch arch : {Arch::kGpt2, Arch::kBert}) {
    auto model = make_model(self_topology(), tiny_config(arch), {}, kMicroBatch);
    const Batch b = make_batch(arch, 0);
    const double denom = static_cast<double>(count_targets(b));
    const LossParts f = model->forward(b);
    const LossParts fb = model->forward_backward(b, {denom, 1.0}, 1.0f);
    EXPECT_EQ(f.lm_loss_sum, fb.lm_loss_sum);
    EXPECT_EQ(f.aux_loss, fb.aux_loss);
    EXPECT_EQ(f.num_targets, fb.num_targets);
    // Byte-level model near initialisation: the mean loss is near log(V).
    EXPECT_NEAR(fb.lm_loss_sum / denom, std::log(static_cast<double>(tiny_config(arch).vocab)),
                2.0);
    std::map<std::string, Tensor> once;
    for (Param* p : model->params()) once[p->name] = p->grad.clone();
    model->forward_backward(b, {denom, 1.0}, 1.0f);
    for (Param* p : model->params()) {
      const Tensor& g1 = once[p->name];
      double err = 0.0;
      for (int64_t i = 0; i < g1.numel(); ++i)
        err = std::max(err, std::fabs(static_cast<double>(p->grad[i]) - 2.0 * g1[i]));
      EXPECT_LE(err, 1e-5 * std::max(max_abs(g1), 1e-6)) << p->name;
    }
  }
}

// Directional finite differences of the single-process model, per parameter, in fp32 (the
// loss sums in double): central differences along a random N(0, 1) direction agree with
// <grad, v> to about 1% relative plus the fp32 rounding of the loss over the step; a wrong
// gradient term is off by far more. Dense-only and MoE variants.
TEST(ModelSingle, GradientMatchesFiniteDifferences) {
  for (int moe_every : {0, 2})
  for (Arch arch : {Arch::kGpt2, Arch::kBert}) {
    ModelConfig cfg = tiny_config(arch);
    cfg.moe_every = moe_every;
    // Top-k routing is piecewise constant: a step that changes a token's expert set breaks
    // the difference quotient. With k = E every token goes to every expert (no drops at
    // f = E), so the MoE output is smooth. l_aux's first-choice counts are piecewise
    // constant as well, but the steps here are too small to flip a token's first choice on
    // this data (deterministic), and a large coefficient makes the l_aux term count.
    cfg.topk = static_cast<int>(cfg.experts);
    cfg.aux_loss_coeff = 1.0f;
    auto model = make_model(self_topology(), cfg, {}, kMicroBatch);
    const Batch b = make_batch(arch, 0);
    const double denom = static_cast<double>(count_targets(b));
    const double coeff = cfg.aux_loss_coeff;
    auto loss = [&] {
      const LossParts lp = model->forward(b);
      return lp.lm_loss_sum / denom + coeff * lp.aux_loss;
    };
    model->forward_backward(b, {denom, 1.0}, 1.0f);
    int64_t stream = 0;
    for (Param* p : model->params()) {
      Tensor v(p->value.shape());
      fill_normal(v, 99, static_cast<uint64_t>(++stream), 0.0f, 1.0f);
      double analytic = 0.0;
      for (int64_t i = 0; i < v.numel(); ++i) analytic += static_cast<double>(p->grad[i]) * v[i];
      const Tensor saved = p->value.clone();
      // A step of norm about 1e-2 whatever the size: small against curvature, large
      // against fp32 rounding of the loss (about 1e-7, hence the second tolerance term).
      const double eps = 1e-2 / std::sqrt(static_cast<double>(v.numel()));
      auto shifted = [&](double s) {
        for (int64_t i = 0; i < v.numel(); ++i)
          p->value[i] = saved[i] + static_cast<float>(s * eps * v[i]);
        return loss();
      };
      const double numeric = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
      p->value.copy_from(saved);
      const double tol = 2e-2 * std::fabs(analytic) + 3e-7 / eps;
      EXPECT_NEAR(numeric, analytic, tol) << (arch == Arch::kGpt2 ? "gpt2 " : "bert ") << "moe_every " << moe_every << " " << p->name;
    }
  }
}

TEST(ModelSingle, BadConfigsAreRefusedBeforeAnyWork) {
  ModelConfig c = tiny_config(Arch::kGpt2);
  c.topk = static_cast<int>(c.experts) + 1;
  try {
    make_model(self_topology(), c, {}, kMicroBatch);
    ADD_FAILURE() << "topk > experts accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("topk"), std::string::npos) << e.what();
  }
  auto model = make_model(self_topology(), tiny_config(Arch::kGpt2), {}, kMicroBatch);
  Batch wrong = make_batch(Arch::kGpt2, 0);
  wrong.batch = 2;
  EXPECT_THROW(model->forward(wrong), Error);
  Batch bad_token = make_batch(Arch::kGpt2, 0);
  bad_token.tokens[5] = 300;
  EXPECT_THROW(model->forward(bad_token), Error);
}

// Layout constraints refused on a real multi-rank topology, identically on every rank.
TEST(ModelLayout, IndivisibleShapesAreRefusedOnEveryRank) {
  const int p = test::world_size();
  if (p < 2) GTEST_SKIP() << "needs 2 or more ranks";
  auto topo = test::make_topology(p, 1, p, 60);
  ModelConfig c = tiny_config(Arch::kGpt2);
  c.num_heads = p + 1;  // not divisible by N_MP
  c.model_dim = 4 * c.num_heads;
  bool refused = false;
  try {
    make_model(*topo, c, {}, kMicroBatch);
  } catch (const InvalidConfig& e) {
    refused = std::string(e.what()).find("--mp") != std::string::npos;
  }
  EXPECT_TRUE(test::all_ranks(refused));
}

}  // namespace
}  // namespace parm::model
