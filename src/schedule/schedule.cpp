#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "comm/fused_plan.h"
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

bool supports(Kind kind, const Layout& l) {
  return kind != Kind::kBaseline || l.mp == 1 || l.esp == 1 || esp_groups_are_mp_groups(l);
}

namespace {

// One row per step kind, in the order of StepKind.
constexpr StepKindInfo kSteps[] = {
    {StepKind::kGate, "gate", Move::kCompute, Move::kCompute, true},
    {StepKind::kAuxLoss, "aux_loss", Move::kCompute, Move::kCompute, false},
    {StepKind::kDispatch, "dispatch", Move::kCompute, Move::kCompute, true},
    {StepKind::kExperts, "experts", Move::kCompute, Move::kCompute, false},
    {StepKind::kCombine, "combine", Move::kCompute, Move::kCompute, false},
    {StepKind::kSharedExperts, "shared_experts", Move::kCompute, Move::kCompute, true},
    {StepKind::kAddShared, "add_shared", Move::kCompute, Move::kCompute, false},
    {StepKind::kSlice, "slice", Move::kKeepChunk, Move::kAllGather, false},
    {StepKind::kGatherDup, "gather_dup", Move::kAllGather, Move::kKeepChunk, false},
    {StepKind::kAllToAll, "alltoall", Move::kAllToAll, Move::kAllToAll, false},
    {StepKind::kGatherShard, "gather_shard", Move::kAllGather, Move::kReduceScatter, false},
    {StepKind::kReduceScatter, "reduce_scatter", Move::kReduceScatter, Move::kAllGather, false},
    {StepKind::kSumDup, "sum_dup", Move::kAllReduce, Move::kNone, false},
    {StepKind::kShareDup, "share_dup", Move::kNone, Move::kAllReduce, false},
    {StepKind::kFusedDispatch, "fused_dispatch", Move::kFusedDispatch, Move::kFusedCombine, false},
    {StepKind::kFusedCombine, "fused_combine", Move::kFusedCombine, Move::kFusedDispatch, false},
};
static_assert(std::size(kSteps) == kNumStepKinds, "one row per step kind");
constexpr bool rows_in_order() {
  for (int i = 0; i < kNumStepKinds; ++i)
    if (static_cast<int>(kSteps[i].kind) != i) return false;
  return true;
}
static_assert(rows_in_order(), "kSteps is indexed by StepKind");

}  // namespace

const StepKindInfo& step_info(StepKind k) { return kSteps[static_cast<int>(k)]; }
const char* step_kind_name(StepKind k) { return step_info(k).name; }
bool is_collective(StepKind k) { return step_info(k).forward != Move::kCompute; }
Move step_move(StepKind k, bool backward) {
  return backward ? step_info(k).backward : step_info(k).forward;
}

bool joins_sum(const Step& s, bool backward) {
  if (s.joined_sum == -1) return false;
  const Move m = step_move(s.kind, backward);
  return m == Move::kAllGather || m == Move::kAllToAll || m == Move::kReduceScatter ||
         m == Move::kAllReduce;
}

bool moves_routed_rows(const Schedule& sc, const Step& s) {
  const auto segmented = [&](int id) {
    return id >= 0 && sc.buffers[static_cast<size_t>(id)].slots > 0;
  };
  return sc.packed && is_collective(s.kind) && segmented(s.in) && segmented(s.out);
}

namespace {

constexpr double kF = sizeof(float);

double numel_of(const Schedule& sc, int id) {
  return id == kGateWeight ? static_cast<double>(sc.gate_weight_numel)
                           : static_cast<double>(shape_numel(sc.buffers[static_cast<size_t>(id)].shape));
}

}  // namespace

std::vector<CollectivePart> collective_parts(const Schedule& sc, const Step& s, const Layout& l,
                                             bool backward) {
  const Move move = step_move(s.kind, backward);
  // The pass's source and destination (bytes; compute steps may have neither), and the
  // fused moves' two groups.
  auto src = [&] { return numel_of(sc, backward ? s.out : s.in) * kF; };
  auto dst = [&] { return numel_of(sc, backward ? s.in : s.out) * kF; };
  const Group a = backward ? s.group2 : s.group, b = backward ? s.group : s.group2;
  std::vector<CollectivePart> parts;
  auto add = [&](Group g, CommOp op, double bytes) {
    const int n = l.group_size(g);
    if (n > 1) parts.push_back({g, op, bus_bytes(op, n, bytes)});
  };
  // Fill counts: one int32 per expert segment of the input ((..., slots, M) rows each), sent
  // beside the tokens: an exchange (1 / n stays here) or a gather (every rank's counts).
  if (s.carries_fills && !backward) {
    const Shape& in = sc.buffers[static_cast<size_t>(s.in)].shape;
    const double segments = numel_of(sc, s.in) / static_cast<double>(in[in.size() - 1] * in[in.size() - 2]);
    constexpr double kI = sizeof(int32_t);
    auto exchange = [&](Group g) {
      const int n = l.group_size(g);
      add(g, CommOp::kMetadata, (n - 1) * segments / n * kI);
    };
    auto gather = [&](Group g) {
      add(g, CommOp::kMetadata, (l.group_size(g) - 1) * segments * kI);
    };
    if (move == Move::kAllToAll) exchange(s.group);
    if (move == Move::kAllGather) gather(s.group);
    if (move == Move::kFusedDispatch) {
      exchange(a);
      gather(b);
    }
  }
  switch (move) {
    case Move::kNone:
    case Move::kCompute:
    case Move::kKeepChunk: break;
    case Move::kAllGather: add(s.group, CommOp::kAllGather, src()); break;
    case Move::kAllToAll: add(s.group, CommOp::kAllToAll, src() / l.group_size(s.group)); break;
    case Move::kReduceScatter: add(s.group, CommOp::kReduceScatter, dst()); break;
    case Move::kAllReduce: add(s.group, CommOp::kAllReduce, src()); break;
    case Move::kFusedDispatch:
    case Move::kFusedCombine: {
      // The stages of the pipeline the executors run, in its order (comm/fused_plan.h); the
      // dispatch move runs on (ep, esp) = (a, b), the combine move on (esp, ep) [+ mp].
      const bool dispatch = move == Move::kFusedDispatch;
      const Group ep = dispatch ? a : b, esp = dispatch ? b : a;
      using fused_plan::Pipeline, fused_plan::Role;
      const Pipeline pipeline = dispatch          ? Pipeline::kDispatch
                                : s.has_mp_part() ? Pipeline::kCombineMp
                                                  : Pipeline::kCombine;
      const fused_plan::Description& d = fused_plan::describe(pipeline);
      for (int j = 0; j < d.num_stages; ++j) {
        const fused_plan::Stage& st = d.stages[static_cast<size_t>(j)];
        const Group g = st.group == Role::kEp ? ep : st.group == Role::kEsp ? esp : s.group3;
        add(g, st.records,
            fused_plan::stage_bytes(st, l.group_size(ep), static_cast<size_t>(s.block)));
      }
      break;
    }
  }
  if (joins_sum(s, backward)) {
    const size_t before = parts.size();
    add(s.group, CommOp::kAllReduce, numel_of(sc, s.joined_sum) * kF);
    if (parts.size() > before) parts.back().beside = true;
  }
  return parts;
}

double local_copy_bytes(const Schedule& sc, const Step& s, bool backward) {
  auto dst = [&] { return numel_of(sc, backward ? s.in : s.out) * kF; };
  switch (step_move(s.kind, backward)) {
    case Move::kKeepChunk: return 2 * dst();
    case Move::kAllGather: return s.outer > 1 ? 2 * dst() : 0.0;
    case Move::kFusedDispatch: return s.has_mp_part() ? 2 * numel_of(sc, s.mid) * kF : 0.0;
    default: return 0.0;
  }
}

std::vector<bool> accumulated_gradients(const Schedule& sc) {
  std::vector<bool> acc(sc.buffers.size(), false);
  for (const Step& s : sc.steps)
    if (step_info(s.kind).accumulates_input_grad) acc[static_cast<size_t>(s.in)] = true;
  return acc;
}

std::string Schedule::name() const {
  const bool overlap = std::any_of(steps.begin(), steps.end(),
                                   [](const Step& st) { return st.overlap_next; });
  return std::string(kind_name(kind)) + (fused ? "+fused" : "") +
         (overlap ? "+shared-overlap" : "");
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
    out += fmt::format("  {:<34} {:<15} {} -> {}{}\n", s.label, step_kind_name(s.kind),
                       name(s.in), name(s.out),
                       s.joined_sum == -1 ? "" : fmt::format(" (+ sum of {})", name(s.joined_sum)));
  return out;
}

}  // namespace parm::schedule
