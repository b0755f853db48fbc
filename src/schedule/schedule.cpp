#include <fmt/format.h>

#include "parm/error.h"
#include "schedule/schedule.h"

namespace parm::schedule {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBaseline: return "baseline";
    case Kind::kS1: return "s1";
    case Kind::kS2: return "s2";
  }
  return "?";
}

Kind parse_kind(const std::string& name) {
  for (Kind k : {Kind::kBaseline, Kind::kS1, Kind::kS2})
    if (name == kind_name(k)) return k;
  throw InvalidConfig(
      fmt::format("unknown schedule '{}'; valid schedules: baseline, s1, s2", name));
}

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::kGate: return "gate";
    case StepKind::kAuxLoss: return "aux_loss";
    case StepKind::kDispatch: return "dispatch";
    case StepKind::kExperts: return "experts";
    case StepKind::kCombine: return "combine";
    case StepKind::kSlice: return "slice";
    case StepKind::kGatherDup: return "gather_dup";
    case StepKind::kAllToAll: return "alltoall";
    case StepKind::kGatherShard: return "gather_shard";
    case StepKind::kReduceScatter: return "reduce_scatter";
    case StepKind::kSumDup: return "sum_dup";
    case StepKind::kShareDup: return "share_dup";
  }
  return "?";
}

bool is_collective(StepKind k) {
  return forward_op(k) != CommOp::kNumOps || backward_op(k) != CommOp::kNumOps;
}

CommOp forward_op(StepKind k) {
  switch (k) {
    case StepKind::kGatherDup:
    case StepKind::kGatherShard: return CommOp::kAllGather;
    case StepKind::kAllToAll: return CommOp::kAllToAll;
    case StepKind::kReduceScatter: return CommOp::kReduceScatter;
    case StepKind::kSumDup: return CommOp::kAllReduce;
    default: return CommOp::kNumOps;
  }
}

CommOp backward_op(StepKind k) {
  switch (k) {
    case StepKind::kSlice:
    case StepKind::kReduceScatter: return CommOp::kAllGather;
    case StepKind::kAllToAll: return CommOp::kAllToAll;
    case StepKind::kGatherShard: return CommOp::kReduceScatter;
    case StepKind::kShareDup: return CommOp::kAllReduce;
    default: return CommOp::kNumOps;
  }
}

std::string Schedule::describe() const {
  std::string out = fmt::format("schedule {}: gate on {} tokens, C={}, slots {} dispatched / {} "
                                "exchanged per expert\n",
                                kind_name(kind), gate_tokens, capacity, dispatch_slots,
                                exchange_slots);
  auto name = [&](int id) {
    return id == kGateWeight ? std::string("dWg") : id < 0 ? std::string("-") : buffers[id].name;
  };
  for (const Step& s : steps) {
    const auto fwd = forward_op(s.kind), bwd = backward_op(s.kind);
    out += fmt::format("  {:<32} {:<14} {:>5}  {} -> {}  fwd {} / bwd {}\n", s.label,
                       step_kind_name(s.kind), is_collective(s.kind) ? group_name(s.group) : "",
                       name(s.in), name(s.out),
                       fwd == CommOp::kNumOps ? "-" : comm_op_name(fwd),
                       bwd == CommOp::kNumOps ? "-" : comm_op_name(bwd));
  }
  return out;
}

}  // namespace parm::schedule
