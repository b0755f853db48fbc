// The allocator's memory counters (parm/memory.h), --memory-limit's sizes and the memory
// predictor's optimizer divisors (model/memory_plan.h).
#include <gtest/gtest.h>

#include "model/memory_plan.h"
#include "parm/error.h"
#include "parm/memory.h"
#include "parm/tensor.h"

namespace parm {
namespace {

TEST(MemoryCounters, CountEachKindUntilFreed) {
  const MemoryCounters before = memory_counters(false);
  const auto acts = static_cast<size_t>(MemoryKind::kActivations);
  const auto opt = static_cast<size_t>(MemoryKind::kOptimizer);
  {
    MemoryKindScope kind(MemoryKind::kActivations);
    Tensor a({1000});
    {
      MemoryKindScope inner(MemoryKind::kOptimizer);
      Tensor b({10, 10});
      EXPECT_EQ(memory_counters(false).current[opt] - before.current[opt], 400);
    }
    EXPECT_EQ(current_memory_kind(), MemoryKind::kActivations);
    Tensor view = Tensor::view(a.data(), {10});  // a view holds nothing of its own
    Tensor shared = a;                           // nor does a copy
    const MemoryCounters now = memory_counters(false);
    EXPECT_EQ(now.current[acts] - before.current[acts], 4000);
    EXPECT_EQ(now.current[opt], before.current[opt]);
    EXPECT_GE(now.peak[opt], 400);
    EXPECT_GE(now.peak_total, now.current_total());
  }
  EXPECT_EQ(memory_counters(false).current[acts], before.current[acts]);
  EXPECT_EQ(current_memory_kind(), MemoryKind::kOther);
}

TEST(MemoryLimit, SizesTakeBinaryAndDecimalSuffixes) {
  EXPECT_EQ(model::parse_bytes("123", "--memory-limit"), 123);
  EXPECT_EQ(model::parse_bytes("8GiB", "--memory-limit"), 8LL << 30);
  EXPECT_EQ(model::parse_bytes("1.5 GB", "--memory-limit"), 1500000000);
  EXPECT_EQ(model::parse_bytes("2KiB", "--memory-limit"), 2048);
  EXPECT_EQ(model::parse_bytes("3MB", "--memory-limit"), 3000000);
  for (const char* bad : {"8x", "", "GiB", "-1", "1e30TiB", "8 G"})
    EXPECT_THROW(model::parse_bytes(bad, "--memory-limit"), InvalidConfig) << bad;
}

// The optimizer state is 2 fp32 moments per parameter, divided by N_DP for the dense
// parameters and N_EDP for the experts' under optimizer sharding; parameters, gradients and
// activations do not change.
TEST(MemoryPlan, OptimizerStateFollowsTheDivisors) {
  model::MemoryPlanInput in;
  in.model.seq_len = 32;
  in.model.model_dim = 64;
  in.model.ffn_hidden = 128;
  in.model.experts = 4;
  in.model.expert_hidden = 64;
  in.layout = make_layout(8, 1, 2, 1);  // dp 8, ep 2, edp 4
  in.micro_batch = 2;
  in.split = {in.model.num_layers};
  in.slots = {1};
  const auto plain = model::plan_memory(in).at(0);
  EXPECT_EQ(plain.optimizer, 2 * plain.parameters);
  EXPECT_EQ(plain.gradients, plain.parameters);
  in.dense_optimizer_divisor = 8;
  in.expert_optimizer_divisor = 4;
  const auto sharded = model::plan_memory(in).at(0);
  // The routed experts: 2 MoE blocks x 2 local experts x (W1, W2: 64 x 64; b1 64; b2 64).
  const int64_t expert = 4 * 2 * 2 * (2 * 64 * 64 + 64 + 64);
  const int64_t dense = plain.parameters - expert;
  EXPECT_EQ(sharded.optimizer, 2 * dense / 8 + 2 * expert / 4);
  EXPECT_EQ(sharded.parameters, plain.parameters);
  EXPECT_EQ(sharded.activations, plain.activations);
}

}  // namespace
}  // namespace parm
