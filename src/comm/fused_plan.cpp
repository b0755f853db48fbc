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

double stage_bytes(const Stage& s, int n_ep, size_t block) {
  const double block_bytes = static_cast<double>(block * sizeof(float));
  return s.count == Count::kBlock ? block_bytes : n_ep * block_bytes;
}

double stage_bus_bytes(const Stage& s, int group_size, int n_ep, size_t block) {
  return bus_bytes(s.records, group_size, stage_bytes(s, n_ep, block));
}

void run_unfused_stage(const Stage& s, Communicator& c, const float* send, float* recv,
                       int n_ep, size_t block) {
  const size_t count = s.count == Count::kBlock ? block : static_cast<size_t>(n_ep) * block;
  switch (s.records) {
    case CommOp::kAllToAll: c.alltoall(send, recv, count); break;
    case CommOp::kAllGather: c.allgather(send, recv, count); break;
    case CommOp::kReduceScatter: c.reduce_scatter(send, recv, count); break;
    default: PARM_CHECK(false, "fused stage {} records {}, not a collective it can run alone",
                        s.name, comm_op_name(s.records));
  }
}

void record(const Plan& plan, const std::array<Communicator*, kNumRoles>& comms, size_t block,
            const std::array<double, kMaxStages>& busy_us) {
  Communicator* ep = comms[static_cast<size_t>(Role::kEp)];
  PARM_CHECK(ep != nullptr, "fused {}: no ep communicator to record", plan.desc->name);
  for (int j = 0; j < plan.num_stages; ++j) {
    const Stage& s = plan.stage(j);
    Communicator* c = comms[static_cast<size_t>(s.group)];
    PARM_CHECK(c != nullptr, "fused {}: no communicator for stage {}", plan.desc->name, s.name);
    const int n = c->size();
    if (n <= 1) continue;  // a group of one records nothing, as the unfused op
    c->record(s.records, stage_bus_bytes(s, n, ep->size(), block),
              busy_us[static_cast<size_t>(j)]);
  }
}

KeepSizeOneStages::KeepSizeOneStages() : previous_(keep_size_one()) { keep_size_one() = true; }
KeepSizeOneStages::~KeepSizeOneStages() { keep_size_one() = previous_; }

}  // namespace parm::fused_plan
