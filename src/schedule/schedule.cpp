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
    case StepKind::kFusedDispatch: return "fused_dispatch";
    case StepKind::kFusedCombine: return "fused_combine";
  }
  return "?";
}

bool is_collective(StepKind k) {
  switch (k) {
    case StepKind::kGate:
    case StepKind::kAuxLoss:
    case StepKind::kDispatch:
    case StepKind::kExperts:
    case StepKind::kCombine: return false;
    default: return true;
  }
}

std::vector<CollectivePart> collective_parts(const Schedule& sc, const Step& s, const Layout& l,
                                             bool backward) {
  constexpr double kF = sizeof(float);
  auto numel = [&](int id) {
    return id == kGateWeight ? static_cast<double>(sc.gate_weight_numel)
                             : static_cast<double>(shape_numel(sc.buffers[id].shape));
  };
  std::vector<CollectivePart> parts;
  auto add = [&](Group g, CommOp op, double bytes) {
    const int n = l.group_size(g);
    if (n > 1) parts.push_back({g, op, bus_bytes(op, n, bytes)});
  };
  const double nep = l.ep;
  // Fill counts: one int32 per expert segment of the input ((..., slots, M) rows each).
  if (s.carries_fills && !backward) {
    const Shape& in = sc.buffers[static_cast<size_t>(s.in)].shape;
    const double segments = numel(s.in) / static_cast<double>(in[in.size() - 1] * in[in.size() - 2]);
    constexpr double kI = sizeof(int32_t);
    if (s.kind == StepKind::kAllToAll || s.kind == StepKind::kFusedDispatch) {
      const int n = l.group_size(Group::kEp);
      add(Group::kEp, CommOp::kMetadata, (n - 1) * segments / n * kI);
    }
    if (s.kind == StepKind::kGatherShard || s.kind == StepKind::kFusedDispatch)
      add(Group::kEsp, CommOp::kMetadata, (l.group_size(Group::kEsp) - 1) * segments * kI);
  }
  switch (s.kind) {
    case StepKind::kSlice:
      if (backward) add(s.group, CommOp::kAllGather, numel(s.out) * kF);
      break;
    case StepKind::kGatherDup:
      if (!backward) add(s.group, CommOp::kAllGather, numel(s.in) * kF);
      break;
    case StepKind::kAllToAll:
      add(s.group, CommOp::kAllToAll, numel(s.in) * kF / l.group_size(s.group));
      break;
    case StepKind::kGatherShard:
      add(s.group, backward ? CommOp::kReduceScatter : CommOp::kAllGather, numel(s.in) * kF);
      break;
    case StepKind::kReduceScatter:
      add(s.group, backward ? CommOp::kAllGather : CommOp::kReduceScatter, numel(s.out) * kF);
      break;
    case StepKind::kSumDup:
      if (!backward) add(s.group, CommOp::kAllReduce, numel(s.in) * kF);
      break;
    case StepKind::kShareDup:
      if (backward) add(s.group, CommOp::kAllReduce, numel(s.in) * kF);
      break;
    case StepKind::kFusedDispatch:  // backward: the combine collective
      add(Group::kEp, CommOp::kAllToAll, s.block * kF);
      add(Group::kEsp, backward ? CommOp::kReduceScatter : CommOp::kAllGather,
          nep * s.block * kF);
      break;
    case StepKind::kFusedCombine:  // backward: [keep my chunk,] the dispatch collective
      add(Group::kEsp, backward ? CommOp::kAllGather : CommOp::kReduceScatter,
          nep * s.block * kF);
      add(Group::kEp, CommOp::kAllToAll, s.block * kF);
      if (s.has_mp_part() && !backward)
        add(s.group3, CommOp::kAllGather, static_cast<double>(s.outer * s.chunk) * kF);
      break;
    default: break;
  }
  return parts;
}

std::vector<bool> accumulated_gradients(const Schedule& sc) {
  std::vector<bool> acc(sc.buffers.size(), false);
  for (const Step& s : sc.steps)
    if (s.kind == StepKind::kGate || s.kind == StepKind::kDispatch)
      acc[static_cast<size_t>(s.in)] = true;
  return acc;
}

std::string Schedule::describe() const {
  std::string out = fmt::format("schedule {}: gate on {} tokens, C={}, slots {} dispatched / {} "
                                "exchanged per expert\n",
                                kind_name(kind), gate_tokens, capacity, dispatch_slots,
                                exchange_slots);
  auto name = [&](int id) {
    return id == kGateWeight ? std::string("dWg") : id < 0 ? std::string("-") : buffers[id].name;
  };
  for (const Step& s : steps)
    out += fmt::format("  {:<34} {:<15} {} -> {}\n", s.label, step_kind_name(s.kind), name(s.in),
                       name(s.out));
  return out;
}

}  // namespace parm::schedule
