#include "comm/fused_plan.h"

#include "parm/error.h"

namespace parm::fused_plan {
namespace {

using enum Role;
using enum Work;
using enum LinkClass;
using enum CommOp;
using enum Count;

// group, work per piece, link class, recorded collective, its count, name
constexpr Stage kEpA2a{kEp, kEpAlltoall, kInterNode, kAllToAll, kBlock, "ep alltoall"};
constexpr Stage kEspAg{kEsp, kEspAllgather, kIntraNode, kAllGather, kRow, "esp allgather"};
constexpr Stage kEspRs{kEsp, kEspExchange, kIntraNode, kReduceScatter, kRow, "esp exchange"};
constexpr Stage kSumA2a{kEp, kEspSumEpAlltoall, kInterNode, kAllToAll, kBlock, "sum + alltoall"};
constexpr Stage kMpAg{kMp, kMpGather, kIntraNode, kAllGather, kRow, "mp allgather"};

constexpr Description kDispatchPipeline{Pipeline::kDispatch, "dispatch", {kEpA2a, kEspAg}, 2};
constexpr Description kCombinePipeline{Pipeline::kCombine, "combine", {kEspRs, kSumA2a}, 2};
constexpr Description kCombineMpPipeline{
    Pipeline::kCombineMp, "combine+mp", {kEspRs, kSumA2a, kMpAg}, 3};

bool& keep_size_one() {
  thread_local bool keep = false;
  return keep;
}

}  // namespace

int Description::stage_of(Role role) const {
  for (int j = 0; j < num_stages; ++j)
    if (stages[static_cast<size_t>(j)].group == role) return j;
  return -1;
}

const Description& describe(Pipeline pipeline) {
  switch (pipeline) {
    case Pipeline::kDispatch: return kDispatchPipeline;
    case Pipeline::kCombine: return kCombinePipeline;
    case Pipeline::kCombineMp: return kCombineMpPipeline;
  }
  throw Error(
      fmt::format("fused_plan::describe: unknown pipeline {}", static_cast<int>(pipeline)));
}

bool Plan::runs(Role role) const {
  for (int j = 0; j < num_stages; ++j)
    if (stage(j).group == role) return true;
  return false;
}

Plan make_plan(Pipeline pipeline, const std::array<int, kNumRoles>& sizes) {
  Plan p;
  p.desc = &describe(pipeline);
  p.self_messages = keep_size_one();
  for (int j = 0; j < p.desc->num_stages; ++j) {
    const Stage& s = p.desc->stages[static_cast<size_t>(j)];
    const int n = sizes[static_cast<size_t>(s.group)];
    PARM_CHECK(n >= 1, "fused {}: the {} group has {} ranks", p.desc->name, s.name, n);
    if (n > 1 || kept_at_size_one(s) || p.self_messages)
      p.index[static_cast<size_t>(p.num_stages++)] = j;
  }
  return p;
}

void record(const Plan& plan, const std::array<Communicator*, kNumRoles>& comms, size_t block,
            const std::array<double, kMaxStages>& busy_us) {
  Communicator* ep = comms[static_cast<size_t>(Role::kEp)];
  PARM_CHECK(ep != nullptr, "fused {}: no ep communicator to record", plan.desc->name);
  const double block_bytes = static_cast<double>(block * sizeof(float));
  for (int j = 0; j < plan.num_stages; ++j) {
    const Stage& s = plan.stage(j);
    Communicator* c = comms[static_cast<size_t>(s.group)];
    PARM_CHECK(c != nullptr, "fused {}: no communicator for stage {}", plan.desc->name, s.name);
    const int n = c->size();
    if (n <= 1) continue;  // a group of one records nothing, as the unfused op
    const double bytes = s.count == Count::kBlock ? block_bytes : ep->size() * block_bytes;
    c->record(s.records, bus_bytes(s.records, n, bytes), busy_us[static_cast<size_t>(j)]);
  }
}

KeepSizeOneStages::KeepSizeOneStages() : previous_(keep_size_one()) { keep_size_one() = true; }
KeepSizeOneStages::~KeepSizeOneStages() { keep_size_one() = previous_; }

}  // namespace parm::fused_plan
