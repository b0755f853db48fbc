// The three schedules of docs/spec.md §3 as step lists.
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "parm/error.h"
#include "schedule/schedule.h"

namespace parm::schedule {
namespace {

class Builder {
 public:
  Builder(const LayerSpec& spec, Kind kind) : spec_(spec) { s_.kind = kind; }

  int buffer(std::string name, Shape shape) {
    s_.buffers.push_back({std::move(name), std::move(shape)});
    return static_cast<int>(s_.buffers.size()) - 1;
  }
  // Marks buffer `id` as expert rows in segments of `slots` (fill counts like `like`).
  void segmented(int id, int64_t slots, int like = -1) {
    auto& b = s_.buffers[static_cast<size_t>(id)];
    if (b.slots > 0) return;  // a collective left out on a group of one returned its input
    b.slots = slots;
    b.fills_like = like;
  }
  void compute(StepKind kind, int in, int out, std::string label) {
    s_.steps.push_back({kind, Group::kWorld, in, out, 1, 0, std::move(label)});
  }
  // A collective on a group of one rank does nothing: it is left out and its output is its
  // input.
  int collective(StepKind kind, Group g, int in, std::string out_name, Shape out_shape,
                 std::string label, int64_t outer = 1, int64_t chunk = 0) {
    if (spec_.layout.group_size(g) == 1) return in;
    const int out = (kind == StepKind::kSumDup || kind == StepKind::kShareDup)
                        ? in
                        : buffer(std::move(out_name), std::move(out_shape));
    s_.steps.push_back({kind, g, in, out, outer, chunk, std::move(label)});
    return out;
  }
  Schedule& schedule() { return s_; }
  // Marks the last step, if it produced `out`, as a dispatch-path step (fill counts).
  void carries_fills(int out) {
    if (!s_.steps.empty() && s_.steps.back().out == out) s_.steps.back().carries_fills = true;
  }

 private:
  const LayerSpec& spec_;
  Schedule s_;
};

// Gate, l_aux and dispatch on `tokens` (rows, M); returns the dispatch buffer.
// S1 with N_MP > 1 gates on slices of the MP group's tokens: it passes `stats_over_mp`,
// receives the statistics buffer there, sums it over mp and forms l_aux itself (build_s1).
int gate_and_dispatch(Builder& b, const LayerSpec& spec, int tokens, int64_t slots,
                      int* stats_over_mp = nullptr) {
  const auto& sh = spec.shape;
  const int stats =
      b.buffer("aux_stats", {stats_numel(sh.experts, spec.z_loss, sh.aux_sequences())});
  b.compute(StepKind::kGate, tokens, stats, "gate");
  if (stats_over_mp != nullptr)
    *stats_over_mp = stats;
  else
    b.compute(StepKind::kAuxLoss, stats, -1, "l_aux");
  const int disp = b.buffer("dispatch", {sh.experts, slots, sh.model_dim});
  b.segmented(disp, slots);
  b.compute(StepKind::kDispatch, tokens, disp, "dispatch");
  return disp;
}

// Shared experts (docs/spec.md §9), each MP rank its shard of H_s, in three places of a
// schedule: their input (after the gate and the dispatch, which read the tokens too), their
// computation (right after the dispatch AllToAll, which it overlaps: Step::overlap_next), and
// their output added into the layer's (after the combine). `in` and `out` are the buffer ids
// between the parts (-1 without shared experts).
struct SharedParts {
  int in = -1;   // the tokens they read (T, M)
  int out = -1;  // this rank's part of their output (T, M), or its sum (S2)
};

// On the MP group's duplicated tokens x (S2, the baseline): the input's gradient is this
// rank's part, summed over mp by a kShareDup (the shared gate's weight gradient, in the tail
// of the gate weight's, rides on it); placed after the gate and the dispatch, so that backward
// the sum runs before they add their complete parts of dx.
SharedParts shared_input_duplicated(Builder& b, const LayerSpec& spec, int x) {
  const auto& sh = spec.shape;
  if (!sh.has_shared()) return {};
  if (spec.layout.mp > 1) {
    b.collective(StepKind::kShareDup, Group::kMp, x, "", {}, "mp shared input");
    if (sh.shared_gate) b.schedule().steps.back().joined_sum = kGateWeight;
  }
  return {x, b.buffer("shared_out", {sh.tokens, sh.model_dim})};
}

// S1: the token slice xs gathered over mp (its gradient reduce-scattered back into the
// slice's, whose AllGather then completes dx; after the gate and the dispatch, which read xs:
// backward this overwriting step runs before they add). The shared gate's weight gradient
// joins the gate weight's, which S1 sums over mp anyway.
SharedParts shared_input_sliced(Builder& b, const LayerSpec& spec, int xs) {
  const auto& sh = spec.shape;
  if (!sh.has_shared()) return {};
  const int64_t T = sh.tokens, M = sh.model_dim;
  const int x = b.collective(StepKind::kGatherShard, Group::kMp, xs, "shared_in", {T, M},
                             "mp allgather shared input");
  return {x, b.buffer("shared_out", {T, M})};
}

// Their computation; S2 and the baseline sum it over mp (kSumDup: Megatron's g).
void shared_compute(Builder& b, const SharedParts& p, bool sum_over_mp) {
  if (p.in < 0) return;
  b.compute(StepKind::kSharedExperts, p.in, p.out, "shared experts");
  if (sum_over_mp)
    b.collective(StepKind::kSumDup, Group::kMp, p.out, "", {}, "mp allreduce shared");
}

// Their output into the layer's `out` (rows, M); S1 reduce-scatters its part to the slice.
void shared_output(Builder& b, const LayerSpec& spec, const SharedParts& p, int out,
                   bool sliced) {
  if (p.in < 0) return;
  int mine = p.out;
  if (sliced)
    mine = b.collective(StepKind::kReduceScatter, Group::kMp, p.out, "shared_slice",
                        {spec.shape.tokens / spec.layout.mp, spec.shape.model_dim},
                        "mp reduce_scatter shared");
  b.compute(StepKind::kAddShared, mine, out, "add shared");
}

// AllToAll(ep), AllGather(esp), experts, ReduceScatter(esp), AllToAll(ep) on (E, slots, M);
// with spec.fuse, the two pairs as the dispatch and combine collectives. S2 passes its MP
// AllGather (mp_outer > 0) so that it joins the combine collective when fused; the return
// value is then the gathered (E, N_MP * slots, M) buffer, whose fill counts are those of
// `mp_source` (the dispatch buffer before the MP slice).
// after_dispatch adds steps right after the dispatch AllToAll, which overlaps the first of them
// (Step::overlap_next) when it is a computation; with a fused dispatch they come before it.
int expert_exchange(Builder& b, const LayerSpec& spec, int disp, int64_t slots,
                    int64_t mp_outer = 0, int64_t mp_chunk = 0, int mp_source = -1,
                    const std::function<void()>& after_dispatch = {}) {
  const Layout& l = spec.layout;
  const int64_t E = spec.shape.experts, M = spec.shape.model_dim, e_loc = E / l.ep;
  const int64_t block = e_loc * slots * M;
  const bool mp_part = mp_outer > 0 && l.mp > 1;
  Schedule& s = b.schedule();
  int gathered, recv = disp;
  if (spec.fuse && l.ep > 1 && l.esp > 1) {
    if (after_dispatch) after_dispatch();
    gathered = b.buffer("esp_gathered", {l.esp, l.ep, e_loc, slots, M});
    Step st{StepKind::kFusedDispatch, Group::kEp, disp, gathered, 1, 0, "fused dispatch (ep alltoall + esp allgather)"};
    st.group2 = Group::kEsp;
    st.block = block;
    st.carries_fills = true;
    s.steps.push_back(st);
    b.segmented(gathered, slots);
  } else {
    recv = b.collective(StepKind::kAllToAll, Group::kEp, disp, "ep_recv",
                        {l.ep, e_loc, slots, M}, "dispatch alltoall");
    b.carries_fills(recv);
    b.segmented(recv, slots);
    if (after_dispatch) {
      const size_t a2a = s.steps.size() - 1;
      const bool posted = recv != disp;  // the AllToAll exists (ep > 1)
      after_dispatch();
      if (posted && s.steps.size() > a2a + 1 && !is_collective(s.steps[a2a + 1].kind))
        s.steps[a2a].overlap_next = true;
    }
    gathered = b.collective(StepKind::kGatherShard, Group::kEsp, recv, "esp_gathered",
                            {l.esp, l.ep, e_loc, slots, M}, "esp allgather");
    b.carries_fills(gathered);
    b.segmented(gathered, slots);
  }
  const int y = b.buffer("expert_out", {l.esp * l.ep, e_loc, slots, M});
  b.segmented(y, slots, gathered);
  b.compute(StepKind::kExperts, gathered, y, "experts");
  const int parts = (l.esp > 1) + (l.ep > 1) + (mp_part ? 1 : 0);
  if (spec.fuse && parts >= 2) {
    const int back = b.buffer("ep_back", {E, slots, M});
    Step st{StepKind::kFusedCombine, Group::kEsp, y, back, 1, 0, "fused combine (esp reduce_scatter + ep alltoall)"};
    st.group2 = Group::kEp;
    st.block = block;
    if (mp_part) {
      st.label = "fused combine (esp reduce_scatter + ep alltoall + mp allgather)";
      st.group3 = Group::kMp;
      st.mid = back;
      st.outer = mp_outer;
      st.chunk = mp_chunk;
      st.out = b.buffer("combine_in", {E, l.mp * slots, M});
      b.segmented(st.out, l.mp * slots, mp_source);
    }
    b.segmented(back, slots, disp);
    s.steps.push_back(st);
    return st.out;
  }
  const int reduced = b.collective(StepKind::kReduceScatter, Group::kEsp, y, "esp_reduced",
                                   {l.ep, e_loc, slots, M}, "esp reduce_scatter");
  b.segmented(reduced, slots, recv);
  const int back = b.collective(StepKind::kAllToAll, Group::kEp, reduced, "ep_back",
                                {E, slots, M}, "combine alltoall");
  b.segmented(back, slots, disp);
  if (mp_outer == 0) return back;
  const int full = b.collective(StepKind::kGatherDup, Group::kMp, back, "combine_in",
                                {E, l.mp * slots, M}, "mp allgather", mp_outer, mp_chunk);
  b.segmented(full, l.mp * slots, mp_source);
  return full;
}

// The baseline with N_ESP = N_MP > 1: every ESP shard already holds the same tokens.
int expert_exchange_duplicated(Builder& b, const LayerSpec& spec, int disp, int64_t slots) {
  const Layout& l = spec.layout;
  const int64_t E = spec.shape.experts, M = spec.shape.model_dim, e_loc = E / l.ep;
  const int recv = b.collective(StepKind::kAllToAll, Group::kEp, disp, "ep_recv",
                                {l.ep, e_loc, slots, M}, "dispatch alltoall");
  b.carries_fills(recv);
  b.segmented(recv, slots);
  b.collective(StepKind::kShareDup, Group::kEsp, recv, "", {}, "esp shared input");
  const int y = b.buffer("expert_out", {l.ep, e_loc, slots, M});
  b.segmented(y, slots, recv);
  b.compute(StepKind::kExperts, recv, y, "experts");
  b.collective(StepKind::kSumDup, Group::kEsp, y, "", {}, "esp allreduce");
  const int back = b.collective(StepKind::kAllToAll, Group::kEp, y, "ep_back", {E, slots, M},
                                "combine alltoall");
  b.segmented(back, slots, disp);
  return back;
}

Schedule build_s1(const LayerSpec& spec, Kind kind) {
  const auto& sh = spec.shape;
  const Layout& l = spec.layout;
  Builder b(spec, kind);
  Schedule& s = b.schedule();
  const int64_t T = sh.tokens, M = sh.model_dim, rows = T / l.mp;
  s.input = b.buffer("x", {T, M});
  s.gate_tokens = rows;
  s.total_tokens = T;
  s.capacity = capacity(sh.topk, sh.capacity_factor, rows, sh.experts);
  s.dispatch_slots = s.exchange_slots = s.capacity;
  s.expert_blocks = l.esp * l.ep;
  // Two small sums over mp, each riding on an MP AllGather the schedule runs anyway (one
  // rendezvous of the MP group instead of two; docs/spec.md §3): the gate weight is read by every MP
  // rank on its own tokens, so its gradient is summed over mp, with the AllGather of dx (the
  // slice's adjoint, the backward pass's last step); the l_aux statistics with the output's
  // AllGather, after which l_aux is formed (nothing before it reads them).
  const int xs = b.collective(StepKind::kSlice, Group::kMp, s.input, "x_slice", {rows, M},
                              "mp slice tokens", 1, rows * M);
  if (l.mp > 1) s.steps.back().joined_sum = kGateWeight;
  int stats = -1;
  const int disp = gate_and_dispatch(b, spec, xs, s.dispatch_slots, l.mp > 1 ? &stats : nullptr);
  const SharedParts shared = shared_input_sliced(b, spec, xs);
  const bool overlap = sh.shared_overlap;
  if (!overlap) shared_compute(b, shared, false);
  const int back = expert_exchange(b, spec, disp, s.exchange_slots, 0, 0, -1, [&] {
    if (overlap) shared_compute(b, shared, false);
  });
  const int ys = b.buffer("out_slice", {rows, M});
  b.compute(StepKind::kCombine, back, ys, "combine");
  shared_output(b, spec, shared, ys, true);
  s.output = b.collective(StepKind::kGatherDup, Group::kMp, ys, "out", {T, M}, "mp allgather",
                          1, rows * M);
  if (l.mp > 1) {
    s.steps.back().joined_sum = stats;
    b.compute(StepKind::kAuxLoss, stats, -1, "l_aux");
  }
  return std::move(s);
}

Schedule build_s2(const LayerSpec& spec, Kind kind) {
  const auto& sh = spec.shape;
  const Layout& l = spec.layout;
  Builder b(spec, kind);
  Schedule& s = b.schedule();
  const int64_t T = sh.tokens, M = sh.model_dim, E = sh.experts;
  s.input = b.buffer("x", {T, M});
  s.gate_tokens = T;
  s.total_tokens = T;
  s.capacity = capacity(sh.topk, sh.capacity_factor, T, E);
  const int64_t cs = (s.capacity + l.mp - 1) / l.mp;  // Cs = ceil(C / N_MP); Cp = N_MP * Cs
  s.dispatch_slots = cs * l.mp;
  s.exchange_slots = cs;
  s.expert_blocks = l.esp * l.ep;
  const int disp = gate_and_dispatch(b, spec, s.input, s.dispatch_slots);
  const SharedParts shared = shared_input_duplicated(b, spec, s.input);
  const int mine = b.collective(StepKind::kSlice, Group::kMp, disp, "dispatch_slice",
                                {E, cs, M}, "mp slice slots", E, cs * M);
  b.segmented(mine, cs);
  const bool overlap = sh.shared_overlap;
  if (!overlap) shared_compute(b, shared, true);
  const int full = expert_exchange(b, spec, mine, cs, E, cs * M, disp, [&] {
    if (overlap) shared_compute(b, shared, true);
  });
  s.output = b.buffer("out", {T, M});
  b.compute(StepKind::kCombine, full, s.output, "combine");
  shared_output(b, spec, shared, s.output, false);
  return std::move(s);
}

Schedule build_baseline(const LayerSpec& spec) {
  const Layout& l = spec.layout;
  // N_MP = 1: MP is never on, so the baseline is S1's list (AllGather/ReduceScatter form).
  // N_ESP = 1 < N_MP: DeepSpeed-MoE already keeps only its slots: S2 without fusion.
  if (l.mp == 1) return build_s1(spec, Kind::kBaseline);
  if (l.esp == 1) return build_s2(spec, Kind::kBaseline);
  const auto& sh = spec.shape;
  Builder b(spec, Kind::kBaseline);
  Schedule& s = b.schedule();
  const int64_t T = sh.tokens, M = sh.model_dim;
  s.input = b.buffer("x", {T, M});
  s.gate_tokens = s.total_tokens = T;
  s.capacity = s.dispatch_slots = s.exchange_slots =
      capacity(sh.topk, sh.capacity_factor, T, sh.experts);
  s.expert_blocks = l.ep;
  const int disp = gate_and_dispatch(b, spec, s.input, s.dispatch_slots);
  // DeepSpeed-MoE's baseline runs its steps one after another: no overlap.
  const SharedParts shared = shared_input_duplicated(b, spec, s.input);
  shared_compute(b, shared, true);
  const int back = expert_exchange_duplicated(b, spec, disp, s.exchange_slots);
  s.output = b.buffer("out", {T, M});
  b.compute(StepKind::kCombine, back, s.output, "combine");
  shared_output(b, spec, shared, s.output, false);
  return std::move(s);
}

// AuxScope::kGlobal: l_aux (and the z-loss) of the whole micro-step on every data-parallel
// replica: its statistics summed over dp, as the pass's last steps (docs/spec.md §7).
void aux_over_dp(Schedule& s, const Layout& l) {
  auto aux = std::find_if(s.steps.begin(), s.steps.end(),
                          [](const Step& st) { return st.kind == StepKind::kAuxLoss; });
  PARM_CHECK(aux != s.steps.end(), "schedule without an l_aux step");
  const Step step = *aux;
  s.steps.erase(aux);
  s.total_tokens *= l.dp;
  if (l.dp > 1)
    s.steps.push_back({StepKind::kSumDup, Group::kDp, step.in, step.in, 1, 0,
                       "dp allreduce l_aux statistics"});
  s.steps.push_back(step);
}

}  // namespace

int64_t dropless_buffer_rows(const Schedule& s, int topk, const BufferSpec& b) {
  const size_t rank = b.shape.size();
  PARM_CHECK(b.slots > 0 && rank >= 3 && b.shape[rank - 2] == b.slots,
             "buffer {} {} is not a segmented (..., segments, slots {}, M) buffer", b.name,
             shape_str(b.shape), b.slots);
  const int64_t segments = b.shape[rank - 3];
  int64_t blocks = 1;
  for (size_t i = 0; i + 3 < rank; ++i) blocks *= b.shape[i];
  return blocks * dropless_block_rows(s, topk, segments, b.slots);
}

void validate(const LayerSpec& spec, Kind kind, const SizeNames& names) {
  const auto& sh = spec.shape;
  const Layout& l = spec.layout;
  sh.validate();
  PARM_CONFIG_CHECK(sh.experts % l.ep == 0,
                    "{} {} is not divisible by --ep {} (each EP rank owns E/N_EP experts); "
                    "valid --ep values for E={}: {}",
                    names.experts, sh.experts, l.ep, sh.experts, divisors_of(sh.experts));
  PARM_CONFIG_CHECK(sh.hidden % l.esp == 0,
                    "{} {} is not divisible by --esp {} (each ESP rank holds H/N_ESP hidden "
                    "columns of an expert); valid --esp values for H={}: {}",
                    names.hidden, sh.hidden, l.esp, sh.hidden, divisors_of(sh.hidden));
  PARM_CONFIG_CHECK(sh.shared_experts == 0 || sh.shared_hidden % l.mp == 0,
                    "--shared-hidden (model.shared_hidden) {} is not divisible by --mp {} (each "
                    "MP rank holds H_s/N_MP columns of a shared expert, as of the dense FFN); "
                    "valid --mp values for H_s={}: {}",
                    sh.shared_hidden, l.mp, sh.shared_hidden, divisors_of(sh.shared_hidden));
  // The shape's aux_seq_len makes l_aux sequence-wise (whoever prices the layer passes the
  // shape alone); the scopes that say otherwise are refused.
  PARM_CONFIG_CHECK(spec.aux_scope != AuxScope::kSequence || sh.aux_seq_len > 0,
                    "--aux-loss sequence needs the sequence length L of l_aux's sequences (> 0)");
  PARM_CONFIG_CHECK(spec.aux_scope != AuxScope::kGlobal || sh.aux_seq_len == 0,
                    "--aux-loss global takes l_aux over every replica's tokens, not per sequence "
                    "(sequence length {}); use one scope",
                    sh.aux_seq_len);
  PARM_CONFIG_CHECK(sh.tokens % l.mp == 0,
                    "{} = {} tokens is not divisible by --mp {} (the MoE layer splits an MP "
                    "group's tokens over its ranks); use a multiple of {}",
                    names.tokens, sh.tokens, l.mp, l.mp);
  PARM_CONFIG_CHECK(supports(kind, l),
                    "the {} is defined for N_MP = 1, N_ESP = 1 or N_ESP = N_MP with the ESP "
                    "groups the MP groups, got --mp {} --esp {} --order {}; valid --esp values "
                    "with --mp {}: 1, {} (with mp and esp nested alike, as in {}); or use "
                    "--schedule s1 or s2 for this layout",
                    kind_name(kind), l.mp, l.esp, l.order_name(), l.mp, l.mp, kDefaultOrder);
}

Schedule build(const LayerSpec& spec, Kind kind) {
  validate(spec, kind);
  PARM_CONFIG_CHECK(spec.chunks >= 1, "--chunks {} must be at least 1", spec.chunks);
  LayerSpec sp = spec;
  // The baseline is DeepSpeed-MoE's: unfused. Dropless schedules fuse as the others do, their
  // pipelines over the routed rows (comm/fused_rows.h).
  const bool dropless = spec.shape.capacity_factor.dropless;
  sp.fuse = spec.fuse && kind != Kind::kBaseline;
  Schedule s = kind == Kind::kS1   ? build_s1(sp, kind)
               : kind == Kind::kS2 ? build_s2(sp, kind)
                                   : build_baseline(sp);
  s.adds_b2 = spec.esp_rank == 0;
  s.dropless = dropless;
  s.packed = spec.shape.packed_rows();
  if (s.packed)
    for (BufferSpec& buf : s.buffers)
      if (buf.slots > 0) buf.max_routed_rows = dropless_buffer_rows(s, spec.shape.topk, buf);
  for (const Step& st : s.steps)
    PARM_CHECK(st.joined_sum == -1 || joins_sum(st, false) != joins_sum(st, true),
               "step '{}' carries a joined sum but moves data over {} in {} passes", st.label,
               group_name(st.group), joins_sum(st, false) ? 2 : 0);
  s.z_loss = spec.z_loss;
  if (spec.aux_scope == AuxScope::kGlobal) aux_over_dp(s, spec.layout);
  s.gate_weight_numel = spec.shape.model_dim * spec.shape.experts +
                        (spec.shape.shared_gate ? spec.shape.model_dim : 0);
  s.shared_rows = spec.shape.has_shared() ? spec.shape.tokens : 0;
  for (const Step& st : s.steps)
    s.fused = s.fused || st.kind == StepKind::kFusedDispatch || st.kind == StepKind::kFusedCombine;
  s.chunks = s.fused ? spec.chunks : 1;
  return s;
}

}  // namespace parm::schedule
