#include "train/pipeline_schedule.h"

#include <algorithm>

#include "parm/error.h"

namespace parm::train {

int pipeline_slots(int stage, int num_stages, int num_micro) {
  return std::min(num_stages - stage, num_micro);
}

int pipeline_lanes(int num_stages, const std::string& pp_overlap) {
  return num_stages > 1 && pp_overlap == "on" ? 2 : 1;
}

std::vector<PipeStep> one_f_one_b(int stage, int num_stages, int num_micro) {
  PARM_CONFIG_CHECK(num_stages >= 1 && stage >= 0 && stage < num_stages,
                    "pipeline stage {} is not one of 0..{}", stage, num_stages - 1);
  PARM_CONFIG_CHECK(num_micro >= 1, "a pipeline step needs at least 1 micro-batch, got {}",
                    num_micro);
  const int slots = pipeline_slots(stage, num_stages, num_micro);
  const int warmup = std::min(num_stages - stage - 1, num_micro);
  std::vector<PipeStep> out;
  out.reserve(static_cast<size_t>(2 * num_micro));
  int next_f = 0, next_b = 0;
  auto forward = [&] {
    out.push_back({PipeOp::kForward, next_f, next_f % slots});
    ++next_f;
  };
  auto backward = [&] {
    out.push_back({PipeOp::kBackward, next_b, next_b % slots});
    ++next_b;
  };
  for (int i = 0; i < warmup; ++i) forward();
  while (next_f < num_micro) {
    forward();
    backward();
  }
  while (next_b < num_micro) backward();
  return out;
}

std::vector<std::vector<int>> overlap_groups(int stage, int num_stages, int num_micro) {
  const int n = static_cast<int>(one_f_one_b(stage, num_stages, num_micro).size());
  const int warmup = std::min(num_stages - stage - 1, num_micro);
  const int steady_end = warmup + 2 * (num_micro - warmup);  // F B pairs after the warm-up
  std::vector<std::vector<int>> out;
  int i = 0;
  for (; i + 1 < warmup; i += 2) out.push_back({i, i + 1});
  if (i < warmup) out.push_back({i++});
  for (; i < steady_end; i += 2)
    if (warmup > 0)
      out.push_back({i, i + 1});
    else
      out.insert(out.end(), {{i}, {i + 1}});
  for (; i < n; ++i) out.push_back({i});
  return out;
}

std::string groups_str(const std::vector<PipeStep>& steps,
                       const std::vector<std::vector<int>>& groups) {
  std::string s;
  for (const auto& g : groups) {
    if (!s.empty()) s += ' ';
    std::string one;
    for (int j : g) {
      if (!one.empty()) one += '+';
      one += steps_str({steps.at(static_cast<size_t>(j))});
    }
    s += one;
  }
  return s;
}

double one_f_one_b_bubble(int num_stages, int num_micro) {
  return static_cast<double>(num_stages - 1) / static_cast<double>(num_micro + num_stages - 1);
}

std::string steps_str(const std::vector<PipeStep>& steps) {
  std::string s;
  for (const PipeStep& p : steps) {
    if (!s.empty()) s += ' ';
    s += (p.op == PipeOp::kForward ? 'F' : 'B') + std::to_string(p.micro);
  }
  return s;
}

}  // namespace parm::train
