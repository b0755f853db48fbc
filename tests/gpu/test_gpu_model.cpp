// The whole model on the GPU (issue 16) against the same model on the CPU, the oracle: for
// every layout of this world size (1 rank: NCCL; 2 and 4 ranks sharing the GPU: MPI staging
// device buffers), tiny GPT-2 and BERT, one micro-batch's forward and backward (loss, l_aux,
// every local gradient), then the gradient reduction and the global norm (fp32: 1e-5 relative
// to each tensor's largest entry, only the order of sums differs; bf16: the layer check's
// bf16 tolerance), and one AdamW step from the same gradients (every local parameter).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model_test_util.h"
#include "moe/layer_check.h"
#include "train/optimizer.h"

namespace parm {
namespace {

using model::Arch;
using model::test_util::make_batch;
using model::test_util::max_abs;
using model::test_util::tiny_config;

// max |a - b| / max |b| (b: the CPU's), a and b on any devices.
double rel_error(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::kCpu), hb = b.to(Device::kCpu);
  double worst = 0.0;
  for (int64_t i = 0; i < hb.numel(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(ha[i]) - hb[i]));
  return worst / std::max(max_abs(hb), 1e-30);
}

struct StepRun {
  std::unique_ptr<Topology> topo;
  std::unique_ptr<model::Model> model;
  model::LossParts loss;
  double norm = 0.0;
  std::vector<Tensor> grads, reduced;  // host copies: after backward, after the reduction
};

// One training step of `arch` on `device`: forward and backward of this rank's micro-batch,
// the reduction over dp/edp, the global norm, then one AdamW step from `step_grads` (the
// CPU's reduced gradients, so that both devices update from the same numbers: a gradient
// within rounding of zero may change sign between devices, and AdamW turns its sign into a
// full step) or, when null, from the model's own.
StepRun step_on(Device device, TopologyOptions o, Arch arch, Precision p,
                const StepRun* step_grads) {
  StepRun r;
  o.device = device;
  r.topo = Topology::create(o);
  r.model = model::make_model(*r.topo, tiny_config(arch), {}, model::test_util::kMicroBatch, p);
  const int dp_rank = r.topo->host_comm(Group::kDp).rank();
  const model::Batch b = make_batch(arch, dp_rank);
  double denom = static_cast<double>(model::test_util::count_targets(b));
  r.topo->host_comm(Group::kDp).allreduce(&denom, 1);
  r.loss = r.model->forward_backward(b, {denom, static_cast<double>(r.topo->layout().dp)}, 1.0f);
  const auto params = r.model->params();
  for (const model::Param* q : params) r.grads.push_back(q->grad.to(Device::kCpu));
  train::reduce_gradients(*r.topo, params);
  r.norm = train::global_grad_norm(*r.topo, params);
  for (const model::Param* q : params) r.reduced.push_back(q->grad.to(Device::kCpu));
  double norm = r.norm;
  if (step_grads != nullptr) {
    for (size_t i = 0; i < params.size(); ++i) params[i]->grad.copy_from(step_grads->reduced[i]);
    norm = step_grads->norm;
  }
  train::AdamW opt(*r.topo, params);
  opt.step(train::OptimConfig{}, 1e-2, norm > 1.0 ? 1.0 / norm : 1.0);
  return r;
}

TEST(GpuModel, OneStepOfEveryLayoutMatchesTheCpuModel) {
  int checked = 0;
  for (const TopologyOptions& o : test::all_layouts(120.0))
    for (Arch arch : {Arch::kGpt2, Arch::kBert})
      for (Precision p : {Precision::kFp32, Precision::kBf16}) {
        const model::ModelConfig c = tiny_config(arch);
        if (c.num_heads % o.mp != 0 || c.experts % o.ep != 0 || c.expert_hidden % o.esp != 0)
          continue;
        const double tol = p == Precision::kFp32 ? 1e-5 : default_tolerance(p);
        const std::string where =
            fmt::format("mp={} ep={} esp={} {} {}", o.mp, o.ep, o.esp,
                        arch == Arch::kGpt2 ? "gpt2" : "bert", precision_name(p));
        const StepRun cpu = step_on(Device::kCpu, o, arch, p, nullptr);
        const StepRun gpu = step_on(Device::kCuda, o, arch, p, &cpu);
        EXPECT_NEAR(gpu.loss.lm_loss_sum, cpu.loss.lm_loss_sum,
                    tol * std::fabs(cpu.loss.lm_loss_sum)) << where;
        EXPECT_NEAR(gpu.loss.aux_loss, cpu.loss.aux_loss, tol * std::fabs(cpu.loss.aux_loss))
            << where;
        EXPECT_EQ(gpu.loss.num_targets, cpu.loss.num_targets) << where;
        EXPECT_NEAR(gpu.norm, cpu.norm, tol * cpu.norm) << where;
        const auto pc = cpu.model->params(), pg = gpu.model->params();
        ASSERT_EQ(pc.size(), pg.size()) << where;
        for (size_t i = 0; i < pc.size(); ++i) {
          ASSERT_EQ(pg[i]->name, pc[i]->name) << where;
          EXPECT_EQ(pg[i]->value.device(), Device::kCuda) << pg[i]->name;
          EXPECT_EQ(pg[i]->grad.device(), Device::kCuda) << pg[i]->name;
          EXPECT_LE(rel_error(gpu.grads[i], cpu.grads[i]), tol) << where << " grad " << pc[i]->name;
          EXPECT_LE(rel_error(gpu.reduced[i], cpu.reduced[i]), tol)
              << where << " reduced grad " << pc[i]->name;
          // The same values and gradients in: AdamW's update is element by element, so only
          // the device's rounding of the same formula may differ.
          EXPECT_LE(rel_error(pg[i]->value, pc[i]->value), 1e-6)
              << where << " value after AdamW " << pc[i]->name;
        }
        ++checked;
      }
  EXPECT_GT(checked, 0);
}

// A token outside the vocabulary is refused on the host before anything runs on the device,
// with the CPU's message.
TEST(GpuModel, RefusesATokenOutsideTheVocabulary) {
  TopologyOptions o;
  o.device = Device::kCuda;
  auto topo = Topology::create(o);
  auto m = model::make_model(*topo, tiny_config(Arch::kGpt2), {}, model::test_util::kMicroBatch);
  model::Batch b = make_batch(Arch::kGpt2, 0);
  b.tokens[5] = 300;
  try {
    m->forward(b);
    FAIL() << "token 300 of a 256-token vocabulary ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 300 at (sequence 0, position 5) is outside the "
                                         "vocabulary [0, 256)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace parm
