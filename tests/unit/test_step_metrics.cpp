// The trainer's two lines per step (train/step_metrics.h): the progress line and the metrics
// JSON line print the same StepMetrics, each number once, the optional parts as ReportFields say.
#include <gtest/gtest.h>

#include <string>

#include "train/step_metrics.h"

namespace parm::train {
namespace {

// Exact binary fractions, so that every printed value is exact.
StepMetrics sample() {
  StepMetrics m;
  m.step = 7;
  m.loss = 3.5;
  m.aux_loss = 1.25;
  m.z_loss = 0.5;
  m.lr = 0.0625;
  m.grad_norm = 2.75;
  m.step_ms = 96.5;
  m.comm_ms = 40.5;
  m.compute_ms = 48.25;
  m.grad_norm_ms = 2.5;
  m.optimizer_ms = 1.5;
  m.tokens_per_s = 4096.0;
  m.mfu = 0.375;
  m.bubble = 0.25;
  m.bubble_1f1b = 0.125;
  m.moe_comm_ms = 12.5;
  m.mem_peak_bytes = {1048576.0, 1048576.0, 2097152.0, 5242880.0, 524288.0, 9961472.0};
  return m;
}

TEST(StepMetrics, ProgressLineSplitsTheStep) {
  const std::string line = progress_text(sample(), {20, false, false, false}, "s1,s2");
  EXPECT_EQ(line,
            "step     7/20  loss 3.5000  aux 1.2500  lr 6.25e-02  |g| 2.750     4096 tok/s  "
            "   96.5 ms (comm 40.5, compute 48.2, grad-norm 2.5, optimizer 1.5)  MFU 37.5%  "
            "moe s1,s2  load max/mean per expert 0.000, per rank 0.000  mem MiB params 1.00 "
            "grads 1.00 optim 2.00 acts 5.00 other 0.50 peak 9.50\n");
}

TEST(StepMetrics, OptionalPartsFollowTheFields) {
  StepMetrics m = sample();
  m.val_loss = 3.25;
  m.load_expert_max_over_mean = 1.5;
  m.load_rank_max_over_mean = 1.25;
  m.phases.add("moe", 2500.0);
  m.phases.add("optimizer", 1500.0);
  const std::string text = progress_text(m, {20, true, true, true}, "s1");
  EXPECT_NE(text.find(" loss 3.5000 val 3.2500  aux 1.2500  z 0.5000  lr"), std::string::npos)
      << text;
  EXPECT_NE(text.find("MFU 37.5%  bubble 25.0% (1F1B 12.5%)  moe-comm 12.5 ms  moe s1  load "
                      "max/mean per expert 1.500, per rank 1.250  mem MiB "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n        phases (ms, world rank 0):  moe 2.5  optimizer 1.5\n"),
            std::string::npos)
      << text;

  const nlohmann::json j = metrics_json(m, {20, true, true, true});
  EXPECT_EQ(j.at("step"), 7);
  EXPECT_EQ(j.at("loss"), 3.5);
  EXPECT_EQ(j.at("val_loss"), 3.25);
  EXPECT_EQ(j.at("z_loss"), 0.5);
  EXPECT_EQ(j.at("comm_ms"), 40.5);
  EXPECT_EQ(j.at("compute_ms"), 48.25);
  EXPECT_EQ(j.at("grad_norm_ms"), 2.5);
  EXPECT_EQ(j.at("optimizer_ms"), 1.5);
  EXPECT_EQ(j.at("bubble"), 0.25);
  EXPECT_EQ(j.at("bubble_1f1b"), 0.125);
  EXPECT_EQ(j.at("moe_comm_ms"), 12.5);
  EXPECT_EQ(j.at("load_expert_max_over_mean"), 1.5);
  EXPECT_EQ(j.at("load_rank_max_over_mean"), 1.25);
  EXPECT_EQ(j.at("phase_ms"), (nlohmann::json{{"moe", 2.5}, {"optimizer", 1.5}}));
}

TEST(StepMetrics, MetricsLineLeavesOutWhatTheRunLacks) {
  const nlohmann::json j = metrics_json(sample(), {20, false, false, false});
  for (const char* key : {"val_loss", "z_loss", "bubble", "bubble_1f1b", "moe_comm_ms",
                          "phase_ms", "load_expert_max_over_mean", "load_rank_max_over_mean"})
    EXPECT_FALSE(j.contains(key)) << key;
  for (const char* key : {"step", "loss", "aux_loss", "lr", "grad_norm", "step_ms", "comm_ms",
                          "compute_ms", "grad_norm_ms", "optimizer_ms", "tokens_per_s", "mfu",
                          "mem_peak_bytes"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.size(), 13u);
  EXPECT_EQ(j.at("mem_peak_bytes").at("activations"), 5242880.0);
  EXPECT_EQ(j.at("mem_peak_bytes").at("total"), 9961472.0);
}

}  // namespace
}  // namespace parm::train
