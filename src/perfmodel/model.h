// The cost model (docs/spec.md §5): prices every step of a schedule's step list — the same list the
// executor (MoeLayer) runs — for the forward and the backward pass, and picks the fastest
// schedule. Pure: no MPI, so any layout (a 32-GPU cluster, say) can be priced on one process.
// The formulas below, with their derivations and the measurements behind them, are in
// docs/perfmodel.md ("What is priced").
//
// Collective part (group g of n ranks, op o, bus bytes b per rank from
// schedule::collective_parts; collective_us), on the group's link L:
//     alpha(n) = alpha[L][o] + alpha_per_rank[L][o] * (n - 2)
//     intra:  t = alpha_intra(n) + beta_intra[o] * b
//     inter:  t = alpha_inter(n) + beta_intra[o] * intra_share * b
//                                + beta_inter[o] * link_share * b + h[o] * [m above E]
// where (group_span) local_r = members of r's group on r's node,
//     intra_share = max over ranks r of (local_r - 1) / (n - 1): the part of r's bus bytes
//                   exchanged with peers on its own node,
//     link_share  = max over nodes of the sum over its ranks r (every instance of g: they
//                   all run at once) of (n - local_r) / (n - 1): how many ranks' worth of bus
//                   bytes cross that node's link, which they share.
// The two parts add: the same cores drive both. h[o] (handshake_us): a point-to-point message
// above the transport's eager limit E (fused.eager_limit_bytes, on the payload) moves only
// after a handshake with its receiver; m = b / (n - 1), the per-peer message. A fused piece of
// m / W pays it where m / W is above E (piece_cost).
// Rendezvous after computation, once per collective step and direction (rendezvous_us):
//     sync = s.us + s.per_compute * min(C, s.compute_cap_us)   (no cap where it is 0)
// in the order the executor runs the steps (backward: reversed). A step with a group across
// the nodes: C = the predicted compute since the previous step that crossed the nodes (or the
// pass's start), s = step_sync (step_sync_world when every group of the step holds all
// ranks): ranks on different nodes drift apart until a step joins them, and a step within a
// node in between joins only that node's ranks. A step whose groups all lie within a node:
// C = the compute since the previous collective step, s = step_sync_intra (step_sync_world
// where its group is the world, on one node). A step with parts on both (a fused pipeline of
// an inter-node and an intra-node collective) pays both, the intra-node one times 1 - the
// fused overlap: the wait within the node delays its intra-node stage, which the pipeline
// overlaps with the inter-node one as it does the stages' transfers. A fused step is one
// rendezvous: its pieces follow each other without compute. `calibrate` fits both terms inside
// a layer timed at two computations (fit_rendezvous): step_sync_intra on a layout whose
// groups stay within a node, step_sync on its own layout, whose EP group crosses them.
// Routing imbalance, one input (Target::load_max_over_mean = lambda; 1: a balanced router): the
// experts step prices R = min(R_pad, lambda R_mean) rows per local expert (R_mean from
// mean_routed_rows); a dropless exchange moves lambda times the mean routed rows
// (dropless_price.h).
// Fused step with parts p_1..p_K in the stage order of its pipeline (src/comm/fused_plan.h,
// which both executors run: W = chunks pieces through K stages in W + K - 1 lock-step steps;
// in step s the stages i with 0 <= s - i < W are active). A part's per-piece time is c_i =
// alpha_i + beta_i * b_i / W. The executor posts every active stage's messages before it
// waits for any (fused_plan::run_lock_step), so their latencies run at once while the bytes on
// one link class share it:
//     pipelined step = max over link classes L of (max_{active i on L} alpha_i
//                                                  + sum_{active i on L} (c_i - alpha_i))
//     t = unfused - overlap * (unfused - pipelined_total) + (W - 1) * per_piece_us
// unfused = the parts' collective_us in sequence; overlap and per_piece_us from the profile.
// Eager saving (eager_saving_us): a fused step's part on an inter-node group whose unfused m
// is above E while its pieces' m / W are not sends eagerly and is priced
//     t_fused -= g * (t_part - h - alpha_part)
// g = eager_gain where no rank of the group has a peer on its own node (intra_share = 0),
// eager_gain_mixed where some have.
// GEMM (m, n, k): s (alpha_c + 2 m n k / rate_c). Memory-bound work: s (alpha + bytes /
// bandwidth). s = the profile's layer_compute.scale.
#pragma once

#include <string>
#include <vector>

#include "shape/shape.h"
#include "parm/topology.h"
#include "perfmodel/profile.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

// The machine a layer runs on: its layout and the node of every world rank.
struct Target {
  Layout layout;
  std::vector<int> node_of_rank;  // size layout.world
  // The busiest rank's expert rows over mean_routed_rows (the header comment): 1 for a
  // balanced router; load_of_busiest_rows for a measured forward pass.
  double load_max_over_mean = 1.0;
};
// world = 0: the smallest world that fits the layout (lcm(mp, ep * esp)). devices_per_node
// = 0: all ranks on one node. `order` nests the groups (docs/layout.md): it decides which
// ranks a group holds, and so its link. Throws InvalidConfig for an invalid layout, order
// or node size.
Target make_target(int world, int mp, int ep, int esp, int devices_per_node,
                   const std::string& order = kDefaultOrder);
// The machine this job runs on.
Target target_of(const Topology& topo);
// Intra-node when every instance of the group lies within one node; inter otherwise (the
// slowest instance sets the pace). Groups of one rank are intra.
Link group_link(const Target& target, Group g);

// How the instances of group g sit on the nodes: the terms of the collective formula above.
struct GroupSpan {
  int size = 1;               // n
  Link link = Link::kIntra;   // group_link
  double intra_share = 1.0;   // max over ranks of (local - 1) / (n - 1); 1 for an intra group
  double link_share = 0.0;    // max over nodes of sum over its ranks of (n - local) / (n - 1)
};
GroupSpan group_span(const Target& target, Group g);
// A span from the node of each member of every instance of a group, one list per instance
// (the form calibration knows its groups in). Throws for an empty or uneven list.
GroupSpan span_of_instances(const std::vector<std::vector<int>>& nodes_of_instance);

// The collective formula above: t (us) of op on a group with that span, b bus bytes per rank.
double collective_us(const Profile& profile, CommOp op, const GroupSpan& span, double bus_bytes);
// Its latency part alpha(n) alone.
double collective_alpha_us(const Profile& profile, CommOp op, const GroupSpan& span);

// The message one rank sends each peer in a collective of bus_bytes on a group with that span:
// b / (n - 1) (b for a group of one).
double peer_message_bytes(const GroupSpan& span, double bus_bytes);
// Whether a point-to-point message of message_bytes goes by rendezvous: above fused's eager
// limit, a limit on the payload (false where the limit is 0: not priced).
bool above_eager_limit(const FusedFit& fused, double message_bytes);
// The handshake term h[o] of the header comment for one message of message_bytes on a group
// with that span (0 on an intra-node group, for a group of one, or at most the limit).
double handshake_us(const Profile& profile, CommOp op, const GroupSpan& span,
                    double message_bytes);
// One of W pieces of a collective part whose whole time is part_us (priced or measured) and
// whose bus bytes are bus_bytes: what active stages pay once between them (alpha(n), plus the
// handshake where the piece's message is above the eager limit) and the piece's time (that
// latency plus 1/W of the rest: part_us less alpha(n) and the whole message's handshake).
struct PieceCost {
  double latency_us = 0.0;
  double piece_us = 0.0;
  double bytes_us = 0.0;  // the whole part's bytes time: part_us - alpha(n) - its handshake
};
PieceCost piece_cost(const Profile& profile, CommOp op, const GroupSpan& span, double bus_bytes,
                     double part_us, int chunks);

// The rendezvous of one collective step (header comment) after compute_us of computation;
// whole_world: every group of the step holds all ranks. rendezvous_us: a step with a group
// across the nodes (step_sync), intra_rendezvous_us: one whose groups all lie within a node
// (step_sync_intra); step_sync_world where whole_world.
// sync_us: one line's us + per_compute * C, C = compute_us capped at compute_cap_us (if set).
double sync_us(const SyncFit& f, double compute_us);
double rendezvous_us(const Profile& profile, bool whole_world, double compute_us);
double intra_rendezvous_us(const Profile& profile, bool whole_world, double compute_us);
// The measured per_compute of the header comment: one layer's time outside its compute steps
// beyond its price, per us of compute the ranks did before its collective steps,
//     per_compute = ((t - t_c) - (p0 - p_c)) / (R1 * t_c / p_c),   bounded below by 0
// t = total_us, t_c = compute_us: the measured layer and its compute steps (slowest rank);
// p0 = priced_total_us, p_c = priced_compute_us: their prices without the rendezvous; R1 =
// rendezvous_at_one_us: the layer's rendezvous priced at per_compute 1 (the sum of C over its
// collective steps), scaled by t_c / p_c to the compute the ranks really did. 0 where R1 or a
// compute time is not positive.
double rendezvous_per_compute(double total_us, double compute_us, double priced_total_us,
                              double priced_compute_us, double rendezvous_at_one_us);
// The rendezvous' terms (header comment: sync = us + per_compute * min(C, cap)) from one
// layout's layer timed at two computations, and optionally a third, larger one
// (calibrate_rendezvous). Per timing: excess_us = (t - t_c) - (p0 - p_c) and at_one_us = R1 *
// t_c / p_c (as rendezvous_per_compute); step_compute_us: the C of each collective step that
// pays it (priced, scaled by t_c / p_c; their sum is at_one_us), from which A(cap) = sum over
// steps of min(C, cap) (at_one_us where they are not given); `steps`: the layer's collective
// steps that pay it (its rendezvous priced at us 1, in us). Through the median (A, excess) of
// each of the two smaller computations:
//     per_compute = (E_large - E_small) / (A_large - A_small),   us = (E_small - per_compute
//     A_small) / steps
// bounded below by 0: where per_compute would be negative (or the two A do not differ),
// per_compute 0 and us = the mean of the two E / steps; where us would be, us 0 and
// per_compute = (E_small + E_large) / (A_small + A_large). Both 0 where nothing is positive.
// The largest computation sets the cap: none where its median excess reaches the line's
// price (steps us + per_compute A_largest); else the cap at which the line prices it (and
// the line refitted through the two smaller ones at that cap, until the cap settles).
struct RendezvousTiming {
  double excess_us = 0.0, at_one_us = 0.0;
  std::vector<double> step_compute_us;
};
// A(cap) of one timing (cap <= 0: none).
double rendezvous_at_one(const RendezvousTiming& t, double cap_us);
// One timing's (excess, at_one) from the arguments of rendezvous_per_compute (at_one 0 where
// p_c is not positive).
RendezvousTiming rendezvous_timing(double total_us, double compute_us, double priced_total_us,
                                   double priced_compute_us, double rendezvous_at_one_us);
struct RendezvousTerms {
  double us = 0.0, per_compute = 0.0, compute_cap_us = 0.0;
};
RendezvousTerms fit_rendezvous(const std::vector<RendezvousTiming>& small,
                               const std::vector<RendezvousTiming>& large, double steps,
                               const std::vector<RendezvousTiming>& largest = {});

// Expert rows a rank computes (summed over its E_loc local experts) when the router sends
// every expert the same share and nothing drops: E_loc x expert_blocks x (k T_gate / E) /
// (dispatch_slots / exchange_slots). The denominator of Target::load_max_over_mean.
double mean_routed_rows(const schedule::Schedule& sc, const MoeShape& shape,
                        const Layout& layout);
// Target::load_max_over_mean from a measured forward pass: the busiest rank's expert rows
// (the sum over its local experts of MoeLayer::expert_rows, max over ranks) over
// mean_routed_rows. Throws for a negative count.
double load_of_busiest_rows(const schedule::Schedule& sc, const MoeShape& shape,
                            const Layout& layout, double busiest_rank_rows);

struct PartCost {
  Group group;
  CommOp op;
  Link link;
  double bus_bytes;
  double us;  // this part alone, unfused
};

struct StepCost {
  std::string label;
  schedule::StepKind kind = schedule::StepKind::kGate;  // meaningless when executor
  bool executor = false;  // the executor's own work, not a schedule step
  double fwd_us = 0.0, bwd_us = 0.0;
  double fwd_sync_us = 0.0, bwd_sync_us = 0.0;  // the rendezvous, included in fwd_us / bwd_us
  std::vector<PartCost> fwd_parts, bwd_parts;  // collectives only
};

struct Prediction {
  schedule::Kind kind = schedule::Kind::kS1;
  bool fused = false;  // the schedule really uses a fused collective
  int chunks = 1;
  std::vector<StepCost> steps;  // one per schedule step, then the executor's own work
  double fwd_us = 0.0, bwd_us = 0.0;
  double total_us() const { return fwd_us + bwd_us; }
  std::string name() const;  // "s2+fused", "baseline", ...
};

// The price of p's compute steps, forward + backward: every schedule step that is not a
// collective (a collective step's local copies and the executor's own work are not in it), so
// the same steps the executor's compute-step timers measure (MoeLayer::forward_step_us).
double compute_steps_us(const Prediction& p);

// Fused step time for parts with per-piece times piece_us (c_i) and latencies alpha_us
// (alpha_i, the part of c_i that active stages pay once between them; see the header
// comment). Exposed for calibrate and tests.
double fused_us(const std::vector<double>& piece_us, const std::vector<double>& alpha_us,
                const std::vector<Link>& links, int chunks, double overlap,
                double per_piece_us = 0.0);

// Whether a part whose per-peer message is message_bytes is sent by rendezvous whole but
// eagerly in chunks pieces (above the eager limit, its pieces not): the case eager_saving_us
// prices, and the one calibrate leaves out of the fused overlap's fit.
bool pieces_go_eager(const FusedFit& fused, double message_bytes, int chunks);

// What one part of a fused step saves by sending its pieces eagerly (header comment):
// g * bytes_us when message_bytes is above the eager limit and message_bytes / chunks is not
// (above_eager_limit), else 0;
// g = eager_gain_mixed when `mixed` (some rank of the group has a peer on its own node), else
// eager_gain. message_bytes: the part's unfused per-peer message; bytes_us: its unfused time
// less its latency.
double eager_saving_us(const FusedFit& fused, double message_bytes, int chunks, double bytes_us,
                       bool mixed = false);

// Prices `sc` (built for `shape` on target.layout) step by step.
Prediction predict(const Profile& profile, const schedule::Schedule& sc,
                   const MoeShape& shape, const Target& target);

struct Candidate {
  schedule::Kind kind;
  bool fuse;
  Prediction pred;
};

// Every candidate in `kinds` x `fuse_modes` that the layout supports (schedule::supports;
// the baseline is never fused; fused only where the schedule has something to fuse, so
// "s1+fused" is not listed when it would equal "s1"), in the order baseline, s1, s1+fused,
// s2, s2+fused.
std::vector<Candidate> predict_candidates(const Profile& profile, const MoeShape& shape,
                                          const Target& target, int chunks,
                                          const std::vector<schedule::Kind>& kinds,
                                          const std::vector<bool>& fuse_modes);
// Index of the fastest predicted candidate (first on ties). Throws for an empty list.
size_t choose(const std::vector<Candidate>& candidates);

}  // namespace parm::perfmodel
