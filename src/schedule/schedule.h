// A schedule is data: the buffers of one MoE layer call and the list of steps that move
// tokens through them. What each kind of step does is one table (step_info): the executor
// (MoeLayer) runs the list forward and its adjoint in reverse by it, and collective_parts
// (the byte counter's tests) and the cost model (perfmodel::predict) read the same list
// through the same table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/fused_plan.h"
#include "shape/aux_scope.h"
#include "shape/shape.h"
#include "parm/tensor.h"
#include "parm/topology.h"

namespace parm::schedule {

enum class Kind { kBaseline, kS1, kS2 };
const char* kind_name(Kind k);  // "baseline", "s1", "s2"
Kind parse_kind(const std::string& name);

// Whether schedule `kind` exists on `layout` (docs/spec.md §3): S1 and S2 on every layout; the
// baseline (DeepSpeed-MoE) when N_MP = 1, N_ESP = 1 or the ESP groups are the MP groups
// (N_ESP = N_MP, and an --order that nests them alike).
bool supports(Kind kind, const Layout& layout);

// The kinds of step; their meaning is in step_info's table below.
enum class StepKind {
  // compute (on the layer's backend)
  kGate,      // in (rows, M) tokens -> out (2E, or 2E + 1 with the z-loss) statistics;
              // routing kept in the state
  kAuxLoss,   // in statistics -> l_aux [and the z-loss] (total_tokens = the MP group's T)
  kDispatch,  // in (rows, M) tokens -> out (E * slots, M)
  kExperts,   // in (blocks, E_loc, slots, M) -> out, same layout (the local ESP shards)
  kCombine,   // in (E * slots, M) -> out (rows, M)
  kSharedExperts,  // in (T, M) tokens -> out (T, M) this MP rank's part of g * shared(x)
                   // (docs/spec.md §9)
  kAddShared,      // in (rows, M) the shared output -> added into out (rows, M), the layer's
                   // output being built (the combine's); backward: d in = d out
  // communication
  kSlice,          // keep my chunk of a duplicated tensor (MP off)
  kGatherDup,      // gather into a duplicated tensor (MP on)
  kAllToAll,       // exchange blocks over the group
  kGatherShard,    // tokens fan out to the ESP shards
  kReduceScatter,  // the ESP shards' partial outputs summed, each rank keeping its part
  kSumDup,         // sum a duplicated tensor in place
  kShareDup,       // a duplicated input read by every rank (its gradient is summed)
  // fused collectives (docs/spec.md §4)
  kFusedDispatch,  // the dispatch collective: AllToAll(ep) + AllGather(esp)
  kFusedCombine,   // the combine collective: ReduceScatter(esp) + AllToAll(ep)
                   // [+ AllGather(mp) into a duplicated tensor, S2]
};
constexpr int kNumStepKinds = static_cast<int>(StepKind::kFusedCombine) + 1;

// What one pass of a step does. The forward pass moves `in` to `out`; the backward pass
// (the adjoint) moves the gradient of `out` to the gradient of `in`. "Source" and
// "destination" below are those two buffers; a collective move runs on the step's group.
enum class Move {
  kNone,           // nothing (the gradient of a duplicated sum is already complete)
  kCompute,        // the step kind's own computation on the layer's backend
  kKeepChunk,      // local: keep this rank's (outer, chunk) part of an (outer, n, chunk)
                   // source (n: the group's size); copies 2 x numel(destination) elements
  kAllGather,      // AllGather of the source, (outer, numel / outer) from each rank, into
                   // (outer, n, numel / outer); interleaved locally (2 x numel(destination)
                   // elements copied) when outer > 1
  kAllToAll,       // AllToAll: numel(source) / n elements to each rank
  kReduceScatter,  // ReduceScatter: the destination's numel elements per rank
  kAllReduce,      // AllReduce in place (the source is the destination)
  // Fused: on (group, group2) forward and (group2, group) backward, `block` elements from
  // each EP rank to each EP peer, pipelined over Schedule::chunks pieces (comm/fused.h).
  kFusedDispatch,  // AllToAll then AllGather; with an MP part (Step::has_mp_part) the
                   // source is first cut to this rank's chunk (kKeepChunk on group3 into mid)
  kFusedCombine,   // ReduceScatter then AllToAll; with an MP part the result goes to mid and
                   // an AllGather on group3 (outer, chunk as kAllGather) fills the destination
};

struct StepKindInfo {
  StepKind kind;
  const char* name;            // "gate", "alltoall", ...
  Move forward;
  Move backward;               // the adjoint of forward
  bool accumulates_input_grad; // the backward pass adds (+=) into the gradient of `in`
};
// The table: one row per step kind.
const StepKindInfo& step_info(StepKind k);
const char* step_kind_name(StepKind k);  // step_info(k).name
bool is_collective(StepKind k);          // its passes are moves, not computations
Move step_move(StepKind k, bool backward);

struct BufferSpec {
  std::string name;
  Shape shape;
  // A buffer of expert rows (the dispatch and combine paths): segments of `slots` rows, one
  // per expert (and block), each holding its routed rows first; 0: not segmented. Under
  // dropless routing only the routed rows of such buffers travel (comm/row_exchange.h).
  int64_t slots = 0;
  // The buffer whose per-segment fill counts this one has (the combine path mirrors the
  // dispatch path); -1: its counts come from its own step (dispatch, or the exchange that
  // carries them).
  int fills_like = -1;
  // Packed (Schedule::packed), segmented: the most routed rows the buffer can hold in one
  // pass (dropless_buffer_rows; docs/dropless.md, "Worst case per buffer"); 0 otherwise. The layer
  // then holds this many rows, its segments back to back (the packed layout,
  // shape/packed_rows.h); `shape` stays the (segments, slots, M) form the byte formulas of
  // the capacity-factor layout and the cost model read.
  int64_t max_routed_rows = 0;
};

// Buffer id of the gate weight's gradient, for kShareDup steps on a parameter (S1's dWg):
// the router's (M, E), then the shared gate's M values when there is one (gate_weight_numel).
constexpr int kGateWeight = -2;

struct Step {
  StepKind kind;
  Group group = Group::kWorld;  // collectives only
  int in = -1;                  // buffer ids (kGateWeight: the gate weight)
  int out = -1;
  // kSlice / kGatherDup: the duplicated tensor is (outer, group size, chunk) elements and a
  // rank's part is (outer, chunk) — S1 slices tokens (outer 1), S2 slots of every expert.
  int64_t outer = 1;
  int64_t chunk = 0;
  std::string label;  // e.g. "dispatch alltoall"
  // Fused steps: the dispatch collective runs on (group = ep, group2 = esp), the combine
  // collective on (group = esp, group2 = ep) and, for S2, its MP AllGather on group3 = mp
  // (with outer/chunk as kGatherDup) from the intermediate buffer `mid`. `block` is what one
  // EP rank sends to one EP peer (elements).
  Group group2 = Group::kWorld;
  Group group3 = Group::kWorld;
  int mid = -1;
  int64_t block = 0;
  // A dispatch-path collective (forward): the per-expert fill counts of its input travel
  // with the tokens (CommOp::kMetadata), so that the experts compute filled rows only.
  bool carries_fills = false;
  // A small duplicated tensor (a buffer id, or kGateWeight) summed in place over `group` in
  // the pass in which this step moves data over it (joins_sum), posted before the step's
  // collective and completed after it: one rendezvous of the group where a kSumDup (the
  // value, forward) or kShareDup (the gradient, backward) step would add a second. S1's
  // l_aux statistics ride on its output AllGather, its dWg on the AllGather of dx. -1: none.
  int joined_sum = -1;
  // An AllToAll whose move is left in flight while the next step of the list (a computation
  // that neither reads nor writes what it moves: the shared experts, docs/spec.md §9) runs, in
  // both passes: forward this step then that one, backward that one's adjoint then this one's,
  // each pair as post, compute, wait. The result is that of running them one after another.
  bool overlap_next = false;
  bool has_mp_part() const { return mid >= 0; }
};

// Whether `step` sums its joined_sum tensor in this pass: the pass that moves data over its
// group (an AllGather, AllToAll, ReduceScatter or AllReduce; a step has one such pass where
// it carries a joined sum, build() checks).
bool joins_sum(const Step& step, bool backward);

// One collective a step issues, and the bus bytes it moves on this rank
// (parm::bus_bytes of its size); a fused step has one part per constituent collective, and
// a step that carries fill counts one kMetadata part per group they cross.
struct CollectivePart {
  Group group;
  CommOp op;
  double bus_bytes;
  // Posted beside the step's main collective and completed with it (Step::joined_sum): the
  // two run at once, with one rendezvous.
  bool beside = false;
};

struct Schedule {
  Kind kind = Kind::kS1;
  std::vector<BufferSpec> buffers;
  std::vector<Step> steps;
  int input = -1;   // (T, M) on every rank of the MP group
  int output = -1;  // (T, M) on every rank of the MP group

  // Layer numbers the compute steps use.
  int64_t gate_tokens = 0;     // rows the gate sees (T or T / N_MP)
  int64_t total_tokens = 0;    // tokens of l_aux: T of the MP group (x N_DP under kGlobal)
  int64_t capacity = 0;        // C used for drops (C or C1)
  int64_t dispatch_slots = 0;  // rows per expert in the dispatch buffer (C, C1 or Cp)
  int64_t exchange_slots = 0;  // rows per expert that travel (C, C1 or Cs)
  int64_t expert_blocks = 0;   // blocks of the experts' input layout
  bool adds_b2 = true;         // this rank adds b2 (ESP rank 0 of its group)
  int64_t gate_weight_numel = 0;  // M * E (+ M with the shared gate)
  bool fused = false;          // uses fused collectives
  // Capacity factor none (C = the gate call's tokens, nothing drops).
  bool dropless = false;
  // Dropless, or a capacity factor without padding (MoeShape::packed_rows): segmented
  // buffers hold max_routed_rows rows, packed, and their exchanges move the routed (kept)
  // rows only (moves_routed_rows).
  bool packed = false;
  bool z_loss = false;         // the router z-loss is on: its sum is the statistics' last value
  int chunks = 1;              // their pipeline depth
  int64_t shared_rows = 0;     // shared experts: the tokens they compute (the MP group's T)

  std::string describe() const;  // one line per step
  // "s2", "s2+fused" where it uses fused collectives, "+shared-overlap" after that where a
  // step's computation runs while an AllToAll is in flight (Step::overlap_next: the shared
  // experts, MoeShape::shared_overlap): what the layer runs, as the CLI and parm.torch name it.
  std::string name() const;
};

// Dropless: collective `step` moves segmented buffers (BufferSpec::slots) in both passes, so
// only their routed rows travel (comm/row_exchange.h, comm/fused_rows.h); every other
// collective moves whole buffers.
bool moves_routed_rows(const Schedule& schedule, const Step& step);

struct LayerSpec {
  MoeShape shape;  // T is per MP group
  Layout layout;
  int esp_rank = 0;     // this rank's place in its ESP group (who adds b2)
  bool fuse = false;    // S1/S2: fused dispatch and combine collectives (never the baseline)
  int chunks = fused_plan::kDefaultChunks;  // pipeline depth of the fused collectives
  // The router z-loss is on: the gate's statistics carry the sum of lse^2 beside docs/spec.md §3's 2E
  // numbers (2E + 1 values, summed over mp under S1); off, they are the 2E of docs/spec.md §3's table.
  bool z_loss = false;
  // kGlobal: the statistics are summed over dp (a kSumDup step at the end of the forward,
  // before l_aux is formed: nothing else waits on it) and total_tokens is N_DP x T.
  // kSequence: shape.aux_seq_len is L (> 0; 0 under kGlobal) and the statistics hold one set
  // per sequence of the MP group's T (summed over mp under S1 like the one set). A shape with
  // aux_seq_len > 0 is sequence-wise under kMicroBatch too (a caller that prices the layer
  // passes the shape alone).
  AuxScope aux_scope = AuxScope::kMicroBatch;
};

// Values of the gate's statistics: per set (one, or one per sequence under the sequence-wise
// l_aux: MoeShape::aux_sequences) [1st-choice counts (E), probability sums (E)], and, with
// the z-loss, the sum of the rows' squared log-sum-exp of the logits last.
inline int64_t stats_numel(int64_t experts, bool z_loss, int64_t sets = 1) {
  return 2 * experts * sets + (z_loss ? 1 : 0);
}

// The collectives `step` issues in the forward (or backward) pass, with their bus bytes.
std::vector<CollectivePart> collective_parts(const Schedule& schedule, const Step& step,
                                             const Layout& layout, bool backward);

// Elements read plus written by the local copies of `step`'s forward (or backward) pass
// (kKeepChunk, interleaving kAllGather), times sizeof(float): bytes of memory traffic.
double local_copy_bytes(const Schedule& schedule, const Step& step, bool backward);

// By buffer id: whether the backward pass accumulates (+=) into its gradient, which must
// then be zeroed first (the token buffer the gate and the dispatch both read); every other
// gradient is overwritten by the step that produces it.
std::vector<bool> accumulated_gradients(const Schedule& schedule);

// How the caller's user spells the layer's sizes, for messages (the CLI's flags by default;
// a training config passes its keys).
struct SizeNames {
  const char* experts = "--experts";
  const char* hidden = "--hidden";
  const char* tokens = "--tokens";
};

// Dropless S2: MP rank j of n keeps rows [first, first + rows) of an expert's `routed` rows,
// first = floor(j * routed / n): the ranks share every expert's rows evenly (with a capacity
// factor it keeps slots [j*Cs, (j+1)*Cs) instead, docs/spec.md §3).
struct RowPart {
  int64_t first = 0;
  int64_t rows = 0;
};
inline RowPart dropless_part(int64_t routed, int64_t j, int64_t n) {
  const int64_t lo = j * routed / n, hi = (j + 1) * routed / n;
  return {lo, hi - lo};
}

// Dropless: the most routed rows one block of `segments` expert segments of `slots` rows
// holds (docs/dropless.md, "Worst case per buffer"). A block is one gate call's rows for
// these experts: all E (the dispatch, the combine's input) or one EP rank's E_loc (one
// source's block of an exchange). Either the whole call's (slots = its tokens T_g, or
// dispatch_slots), each token choosing at most min(k, segments) of these experts:
// min(k, segments) x slots rows; or (S2, split over N_MP ranks: slots = Cs <
// dispatch_slots) MP rank j's part dropless_part(n_e, j, N_MP) <= n_e / N_MP + 1 of each
// expert's n_e <= T routed rows, with sum n_e <= min(k, segments) T: at most
// min(k, segments) Cs + segments rows. Never above segments x slots, the capacity-factor
// layout's rows, which is the bound of a packed capacity-factor layer (not dropless): its
// segments keep at most C rows (S2's parts ceil(n_e / N_MP) <= Cs), and k C may be fewer
// than an expert's share of k T.
inline int64_t dropless_block_rows(const Schedule& s, int topk, int64_t segments,
                                   int64_t slots) {
  if (!s.dropless) return segments * slots;
  const int64_t choices = topk < segments ? topk : segments;
  const int64_t slack = s.dispatch_slots > slots ? segments : 0;
  const int64_t rows = choices * slots + slack;
  const int64_t most = segments * slots;
  return rows < most ? rows : most;
}

// Packed: the most rows `local_experts` experts get together in one pass, over the
// schedule's expert_blocks blocks of exchange_slots rows per expert.
inline int64_t dropless_local_rows(const Schedule& s, int topk, int64_t local_experts) {
  return s.expert_blocks * dropless_block_rows(s, topk, local_experts, s.exchange_slots);
}

// Packed: the most routed rows segmented buffer b holds: its shape is (blocks...,
// segments, slots, M), each block one gate call's rows for its segments' experts.
int64_t dropless_buffer_rows(const Schedule& s, int topk, const BufferSpec& b);

// Checks the layer against the layout and the schedule (E % N_EP, H % N_ESP, T % N_MP;
// supports(kind, layout)). Throws InvalidConfig naming the constraint and valid values.
void validate(const LayerSpec& spec, Kind kind, const SizeNames& names = {});
Schedule build(const LayerSpec& spec, Kind kind);

}  // namespace parm::schedule
