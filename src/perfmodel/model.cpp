#include "perfmodel/model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "comm/fused_plan.h"
#include "parm/stats.h"
#include "perfmodel/dropless_price.h"
#include "parm/error.h"

namespace parm::perfmodel {

using schedule::Kind;
using schedule::StepKind;

Target make_target(int world, int mp, int ep, int esp, int devices_per_node,
                   const std::string& order) {
  PARM_CONFIG_CHECK(mp >= 1 && ep >= 1 && esp >= 1,
                    "--mp {} --ep {} --esp {}: every group size must be at least 1", mp, ep, esp);
  PARM_CONFIG_CHECK(devices_per_node >= 0, "--devices-per-node {} must be at least 0 (0: one node)",
                    devices_per_node);
  PARM_CONFIG_CHECK(world >= 0, "--world {} must be at least 0 (0: the smallest that fits)",
                    world);
  if (world == 0) {
    world = std::lcm(mp, ep * esp);
    // More than one node's worth of ranks: round up to whole nodes.
    if (devices_per_node > 0 && world > devices_per_node) world = std::lcm(world, devices_per_node);
  }
  Target t;
  t.layout = make_layout(world, mp, ep, esp, 1, order);
  if (devices_per_node == 0 || devices_per_node >= world)
    t.node_of_rank.assign(static_cast<size_t>(world), 0);
  else
    t.node_of_rank = emulated_nodes(world, devices_per_node);
  return t;
}

Target target_of(const Topology& topo) {
  Target t;
  t.layout = topo.layout();
  for (int r = 0; r < t.layout.world; ++r) t.node_of_rank.push_back(topo.node_of(r));
  return t;
}

Link group_link(const Target& t, Group g) {
  for (int r = 0; r < t.layout.world; ++r)
    if (group_coord(t.layout, g, r).rank == 0 &&
        !group_is_intra_node(t.layout, g, r, t.node_of_rank))
      return Link::kInter;
  return Link::kIntra;
}

GroupSpan span_of_instances(const std::vector<std::vector<int>>& nodes_of_instance) {
  PARM_CHECK(!nodes_of_instance.empty() && !nodes_of_instance[0].empty(),
             "a group span needs at least one instance of at least one rank");
  GroupSpan sp;
  sp.size = static_cast<int>(nodes_of_instance[0].size());
  const int n = sp.size;
  if (n == 1) return sp;
  std::map<int, double> crossing;  // node -> ranks' worth of bus bytes over its link
  double intra = 0.0;
  bool spans = false;
  for (const auto& inst : nodes_of_instance) {
    PARM_CHECK_EQ(static_cast<int>(inst.size()), n);
    for (int node : inst) {
      const int local = static_cast<int>(std::count(inst.begin(), inst.end(), node));
      intra = std::max(intra, static_cast<double>(local - 1) / (n - 1));
      crossing[node] += static_cast<double>(n - local) / (n - 1);
      spans = spans || local < n;
    }
  }
  if (!spans) return sp;  // intra: intra_share 1, nothing crosses a link
  sp.link = Link::kInter;
  sp.intra_share = intra;
  for (const auto& [node, c] : crossing) sp.link_share = std::max(sp.link_share, c);
  return sp;
}

GroupSpan group_span(const Target& t, Group g) {
  std::vector<std::vector<int>> inst;
  for (int r = 0; r < t.layout.world; ++r) {
    if (group_coord(t.layout, g, r).rank != 0) continue;
    std::vector<int> nodes;
    for (int m : group_members(t.layout, g, r))
      nodes.push_back(t.node_of_rank[static_cast<size_t>(m)]);
    inst.push_back(std::move(nodes));
  }
  return span_of_instances(inst);
}

double collective_alpha_us(const Profile& prof, CommOp op, const GroupSpan& sp) {
  return prof.collective(sp.link, op).alpha(sp.size);
}

bool above_eager_limit(const FusedFit& f, double message_bytes) {
  return f.eager_limit_bytes > 0.0 && message_bytes > f.eager_limit_bytes;
}

double handshake_us(const Profile& prof, CommOp op, const GroupSpan& sp, double message_bytes) {
  if (sp.link != Link::kInter || sp.size < 2 || !above_eager_limit(prof.fused, message_bytes))
    return 0.0;
  return prof.collective(Link::kInter, op).handshake_us;
}

double peer_message_bytes(const GroupSpan& sp, double bus_bytes) {
  return sp.size > 1 ? bus_bytes / (sp.size - 1) : bus_bytes;
}

double collective_us(const Profile& prof, CommOp op, const GroupSpan& sp, double bus_bytes) {
  const double beta_intra = prof.collective(Link::kIntra, op).beta_us_per_byte;
  if (sp.link == Link::kIntra) return collective_alpha_us(prof, op, sp) + beta_intra * bus_bytes;
  return collective_alpha_us(prof, op, sp) + beta_intra * sp.intra_share * bus_bytes +
         prof.collective(Link::kInter, op).beta_us_per_byte * sp.link_share * bus_bytes +
         handshake_us(prof, op, sp, peer_message_bytes(sp, bus_bytes));
}

PieceCost piece_cost(const Profile& prof, CommOp op, const GroupSpan& sp, double bus_bytes,
                     double part_us, int chunks) {
  PARM_CHECK(chunks >= 1, "a collective in {} pieces", chunks);
  const double m = peer_message_bytes(sp, bus_bytes);
  const double alpha = collective_alpha_us(prof, op, sp);
  PieceCost c;
  c.bytes_us = std::max(0.0, part_us - alpha - handshake_us(prof, op, sp, m));
  c.latency_us = alpha + handshake_us(prof, op, sp, m / chunks);
  c.piece_us = c.latency_us + c.bytes_us / chunks;
  return c;
}

std::string Prediction::name() const {
  return std::string(schedule::kind_name(kind)) + (fused ? "+fused" : "");
}

double fused_us(const std::vector<double>& piece_us, const std::vector<double>& alpha_us,
                const std::vector<Link>& links, int chunks, double overlap, double per_piece_us) {
  PARM_CHECK_EQ(piece_us.size(), links.size());
  PARM_CHECK_EQ(alpha_us.size(), links.size());
  PARM_CHECK(chunks >= 1, "fused collective with {} chunks", chunks);
  const int num_stages = static_cast<int>(piece_us.size());
  double pipelined = 0.0;
  for (int s = 0; s < fused_plan::num_steps(num_stages, chunks); ++s) {
    // Per link class: its longest latency, then the bytes of every active stage on it.
    double latency[kNumLinks] = {0.0, 0.0}, bytes[kNumLinks] = {0.0, 0.0};
    for (int i = 0; i < num_stages; ++i) {
      if (fused_plan::piece_at(s, i, chunks) < 0) continue;
      const auto k = static_cast<size_t>(i);
      const int l = static_cast<int>(links[k]);
      latency[l] = std::max(latency[l], alpha_us[k]);
      bytes[l] += piece_us[k] - alpha_us[k];
    }
    pipelined += std::max(latency[0] + bytes[0], latency[1] + bytes[1]);
  }
  // The parts unfused, one after the other: each pays its latency once and all its bytes.
  double unfused = 0.0;
  for (size_t k = 0; k < piece_us.size(); ++k)
    unfused += alpha_us[k] + chunks * (piece_us[k] - alpha_us[k]);
  return unfused - overlap * (unfused - pipelined) + (chunks - 1) * per_piece_us;
}

bool pieces_go_eager(const FusedFit& f, double message_bytes, int chunks) {
  PARM_CHECK(chunks >= 1, "fused collective with {} chunks", chunks);
  return above_eager_limit(f, message_bytes) && !above_eager_limit(f, message_bytes / chunks);
}

double eager_saving_us(const FusedFit& f, double message_bytes, int chunks, double bytes_us,
                       bool mixed) {
  if (!pieces_go_eager(f, message_bytes, chunks)) return 0.0;
  return (mixed ? f.eager_gain_mixed : f.eager_gain) * std::max(0.0, bytes_us);
}

namespace {

constexpr double kF = sizeof(float);

struct Pricer {
  const Profile& prof;
  const schedule::Schedule& sc;
  const MoeShape& shape;
  const Target& target;

  double numel(int id) const {
    return static_cast<double>(shape_numel(sc.buffers[static_cast<size_t>(id)].shape));
  }
  double gemm(GemmClass c, double m, double n, double k) const {
    const double flops = 2.0 * m * n * k;
    return flops > 0.0 ? prof.layer_compute.scale * prof.gemm_fit(c).us(flops) : 0.0;
  }
  double mem(MemClass c, double bytes) const {
    return bytes > 0.0 ? prof.layer_compute.scale * prof.mem_fit(c).us(bytes) : 0.0;
  }
  double copy(double bytes) const { return mem(MemClass::kCopy, bytes); }

  // Choices that find a slot: every choice when nothing drops, else the slots (a balanced
  // router; an unbalanced one keeps fewer, so this is an upper bound).
  double kept() const {
    return std::min(static_cast<double>(sc.gate_tokens) * shape.topk,
                    static_cast<double>(shape.experts) * static_cast<double>(sc.capacity));
  }

  // One FFN of the layer's kind over R rows of hidden width hl: its GEMMs (no row copies, no
  // b2). Forward: x W1 (and x W3 for swiglu), act W2. Backward: dW2 += act^T dy, dact = dy W2^T,
  // dW1 += x^T dpre, dx = dpre W1^T (swiglu: dW3 += x^T dgate, dx += dgate W3^T).
  std::pair<double, double> ffn_us(double R, double hl) const {
    const double M = static_cast<double>(shape.model_dim);
    const double gates = is_gated(shape.expert_mlp) ? 2 : 1;
    const double fwd = gemm(GemmClass::kExpertNN, R, hl, M) * gates +
                       gemm(GemmClass::kExpertNN, R, M, hl);
    const double w2 = gemm(GemmClass::kExpertTN, hl, M, R) + gemm(GemmClass::kExpertNT, R, hl, M);
    const double w1 = gemm(GemmClass::kExpertTN, M, hl, R) + gemm(GemmClass::kExpertNT, R, M, hl);
    const double bwd = w2 + w1 * gates;
    return {fwd, bwd};
  }
  // Floats per row and hidden column the FFN's elementwise step moves: bias + GeLU reads x W1
  // and writes act (2), its adjoint with db1 reads x W1 and dact and writes dpre (3); SwiGLU
  // reads x W1 and x W3 and writes act (3), its adjoint reads three and writes two (5).
  double ffn_elementwise(bool backward) const {
    const bool gated = is_gated(shape.expert_mlp);
    return backward ? (gated ? 5 : 3) : (gated ? 3 : 2);
  }

  void compute(const schedule::Step& s, StepCost& c) const {
    const double M = static_cast<double>(shape.model_dim), E = static_cast<double>(shape.experts);
    const double rows = static_cast<double>(sc.gate_tokens), k = shape.topk;
    const Layout& l = target.layout;
    switch (s.kind) {
      case StepKind::kGate:
        // logits GEMM; softmax (read + write), top-k (read), routing and statistics.
        c.fwd_us = gemm(GemmClass::kGate, rows, E, M) + copy(kF * (4 * rows * E + 6 * rows * k));
        // dWg += x^T dlogits, dx += dlogits Wg^T; dprobs fill and softmax adjoint.
        c.bwd_us = gemm(GemmClass::kGate, M, E, rows) + gemm(GemmClass::kGate, rows, M, E) +
                   copy(kF * 4 * rows * E);
        break;
      case StepKind::kAuxLoss: break;  // 2E + 1 numbers
      case StepKind::kDispatch:
        // zero the unfilled rows of (E, slots, M), copy the kept rows in | add them back to dx.
        c.fwd_us = copy(kF * (numel(s.out) - kept() * M + 2 * kept() * M));
        c.bwd_us = copy(kF * 3 * kept() * M);
        break;
      case StepKind::kCombine:
        // zero out (rows, M), weighted adds of the kept rows | zero dbuf's unfilled rows,
        // scale + dot.
        c.fwd_us = copy(kF * (rows * M + 3 * kept() * M));
        c.bwd_us = copy(kF * (numel(s.in) - kept() * M + 4 * kept() * M));
        break;
      case StepKind::kExperts: {
        // The experts compute filled rows only, at most the exchange layout's R_pad; the
        // busiest rank sets the pace: lambda times the mean routed rows (model.h).
        const double R_pad =
            static_cast<double>(sc.expert_blocks) * static_cast<double>(sc.exchange_slots);
        const double e_loc = E / l.ep, hl = static_cast<double>(shape.hidden) / l.esp;
        const double R = std::min(
            R_pad, target.load_max_over_mean * mean_routed_rows(sc, shape, l) / e_loc);
        // Per expert: gather rows, the FFN (ffn_us), [+ b2, gelu], scatter rows and zero the
        // empty slots | gather dy, db2, the FFN's adjoint, scatter.
        const bool gated = is_gated(shape.expert_mlp);
        const auto [ffn_fwd, ffn_bwd] = ffn_us(R, hl);
        c.fwd_us = e_loc * ffn_fwd +
                   copy(kF * e_loc * (4 * R * M + (R_pad - R) * M +
                                      (sc.adds_b2 && !gated ? 2 * R * M : 0.0))) +
                   mem(MemClass::kGelu, kF * e_loc * ffn_elementwise(false) * R * hl);
        c.bwd_us = e_loc * ffn_bwd + copy(kF * e_loc * (5 * R * M + (R_pad - R) * M)) +
                   mem(MemClass::kGelu, kF * e_loc * ffn_elementwise(true) * R * hl);
        break;
      }
      case StepKind::kSharedExperts: {
        // N_s FFNs of this MP rank's H_s / N_MP columns over all T rows, their outputs added
        // up by the GEMMs; the shared gate's dot products and scaling (2 passes over (T, M)).
        const double R = static_cast<double>(sc.shared_rows), n = shape.shared_experts;
        const double hl = static_cast<double>(shape.shared_hidden) / target.layout.mp;
        const auto [ffn_fwd, ffn_bwd] = ffn_us(R, hl);
        const double gate = shape.shared_gate ? copy(kF * 3 * R * M) : 0.0;
        c.fwd_us = n * ffn_fwd + mem(MemClass::kGelu, kF * n * ffn_elementwise(false) * R * hl) +
                   gate;
        // + each expert's dx added into the input's gradient (3 R M floats each).
        c.bwd_us = n * ffn_bwd + mem(MemClass::kGelu, kF * n * ffn_elementwise(true) * R * hl) +
                   copy(kF * n * 3 * R * M) + 2 * gate;
        break;
      }
      case StepKind::kAddShared: {
        // out += in | d in = d out.
        const double n = numel(s.in);
        c.fwd_us = copy(kF * 3 * n);
        c.bwd_us = copy(kF * 2 * n);
        break;
      }
      default: break;
    }
  }

  // Local copies the executor does around a collective step (slices, interleaves).
  void local_copies(const schedule::Step& s, StepCost& c) const {
    const double share = dropless_share(sc, s, shape, target.load_max_over_mean);
    c.fwd_us += copy(share * schedule::local_copy_bytes(sc, s, false));
    c.bwd_us += copy(share * schedule::local_copy_bytes(sc, s, true));
  }

  void collectives(const schedule::Step& s, StepCost& c) const {
    for (bool bwd : {false, true}) {
      // A fused step's parts come in the stage order of its pipeline (comm/fused_plan.h).
      auto parts = schedule::collective_parts(sc, s, target.layout, bwd);
      const bool fused = s.kind == StepKind::kFusedDispatch || s.kind == StepKind::kFusedCombine;
      std::vector<PartCost>& out = bwd ? c.bwd_parts : c.fwd_parts;
      std::vector<double> piece, piece_alpha;
      std::vector<Link> links;
      double sum = 0.0, beside = 0.0, eager = 0.0;
      const double share = dropless_share(sc, s, shape, target.load_max_over_mean);
      for (auto& p : parts) {
        p.bus_bytes *= share;
        // The fill counts (a few int32 per expert) are posted beside the data collective;
        // their latency hides behind it, so they are not priced.
        if (p.op == CommOp::kMetadata) continue;
        const GroupSpan sp = group_span(target, p.group);
        const double us = collective_us(prof, p.op, sp, p.bus_bytes);
        out.push_back({p.group, p.op, sp.link, p.bus_bytes, us});
        if (p.beside) {  // runs at once with the step's collective (Step::joined_sum)
          beside = std::max(beside, us);
          continue;
        }
        sum += us;
        // A piece pays the whole latency and 1/W of the bytes.
        const PieceCost pc = piece_cost(prof, p.op, sp, p.bus_bytes, us, sc.chunks);
        piece.push_back(pc.piece_us);
        piece_alpha.push_back(pc.latency_us);
        links.push_back(sp.link);
        if (sp.link == Link::kInter)
          eager += eager_saving_us(prof.fused, peer_message_bytes(sp, p.bus_bytes), sc.chunks,
                                   pc.bytes_us, sp.intra_share > 0.0);
      }
      double t = fused && !piece.empty()
                     ? fused_us(piece, piece_alpha, links, sc.chunks, prof.fused.overlap,
                                prof.fused.per_piece_us) -
                           eager
                     : sum;
      (bwd ? c.bwd_us : c.fwd_us) += std::max(t, beside);
    }
    local_copies(s, c);
  }
};

// The rendezvous of every collective step, per direction in the order the executor runs the
// steps (backward: reversed, after the executor's own backward work), each after the compute
// since the previous collective step.
void add_rendezvous(const Profile& prof, const Target& target, std::vector<StepCost>& steps) {
  const StepCost& ex = steps.back();
  const size_t n = steps.size() - 1;
  auto whole_world = [&](const std::vector<PartCost>& parts) {
    for (const auto& p : parts)
      if (group_span(target, p.group).size < target.layout.world) return false;
    return true;
  };
  auto has = [&](const std::vector<PartCost>& parts, Link link) {
    for (const auto& p : parts)
      if (p.link == link) return true;
    return false;
  };
  for (bool bwd : {false, true}) {
    // The compute since the previous collective step, and since the previous one that
    // crossed the nodes (or the pass's start).
    double since = bwd ? ex.bwd_us : ex.fwd_us, since_inter = since;
    for (size_t j = 0; j < n; ++j) {
      StepCost& c = steps[bwd ? n - 1 - j : j];
      const std::vector<PartCost>& parts = bwd ? c.bwd_parts : c.fwd_parts;
      double& us = bwd ? c.bwd_us : c.fwd_us;
      if (parts.empty()) {
        since += us;
        since_inter += us;
        continue;
      }
      // A step with parts on both kinds of link (a fused pipeline of an intra-node and an
      // inter-node collective) waits for both, as its parts would as separate steps, but the
      // wait within the node delays only its intra-node stage, which the pipeline overlaps
      // with the inter-node one as it does the stages' transfers: it pays 1 - overlap of it.
      const bool inter = has(parts, Link::kInter), intra = has(parts, Link::kIntra);
      const bool world = whole_world(parts);
      const double intra_share = inter ? 1.0 - prof.fused.overlap : 1.0;
      double& sync = bwd ? c.bwd_sync_us : c.fwd_sync_us;
      sync = (intra ? intra_share * intra_rendezvous_us(prof, world, since) : 0.0) +
             (inter ? rendezvous_us(prof, world, since_inter) : 0.0);
      us += sync;
      since = 0.0;
      if (inter) since_inter = 0.0;
    }
  }
}

}  // namespace

double sync_us(const SyncFit& f, double compute_us) {
  const double c = std::max(0.0, compute_us);
  return f.us + f.per_compute * (f.compute_cap_us > 0.0 ? std::min(c, f.compute_cap_us) : c);
}

double rendezvous_us(const Profile& prof, bool whole_world, double compute_us) {
  return sync_us(whole_world ? prof.step_sync_world : prof.step_sync, compute_us);
}

double intra_rendezvous_us(const Profile& prof, bool whole_world, double compute_us) {
  return sync_us(whole_world ? prof.step_sync_world : prof.step_sync_intra, compute_us);
}

RendezvousTiming rendezvous_timing(double total_us, double compute_us, double priced_total_us,
                                   double priced_compute_us, double rendezvous_at_one_us) {
  RendezvousTiming t;
  t.excess_us = (total_us - compute_us) - (priced_total_us - priced_compute_us);
  t.at_one_us = priced_compute_us > 0.0
                    ? rendezvous_at_one_us * compute_us / priced_compute_us
                    : 0.0;
  return t;
}

double rendezvous_per_compute(double total_us, double compute_us, double priced_total_us,
                              double priced_compute_us, double rendezvous_at_one_us) {
  if (rendezvous_at_one_us <= 0.0 || compute_us <= 0.0 || priced_compute_us <= 0.0) return 0.0;
  const RendezvousTiming t = rendezvous_timing(total_us, compute_us, priced_total_us,
                                               priced_compute_us, rendezvous_at_one_us);
  return std::max(0.0, t.excess_us / t.at_one_us);
}

double rendezvous_at_one(const RendezvousTiming& t, double cap_us) {
  if (cap_us <= 0.0 || t.step_compute_us.empty()) return t.at_one_us;
  double a = 0.0;
  for (double c : t.step_compute_us) a += std::min(std::max(0.0, c), cap_us);
  return a;
}

namespace {

double median_of(const std::vector<RendezvousTiming>& v,
                 const std::function<double(const RendezvousTiming&)>& field) {
  std::vector<double> x;
  for (const auto& t : v) x.push_back(field(t));
  return median(std::move(x));
}

// The line through the two smaller computations, their A taken at `cap` (model.h).
RendezvousTerms fit_line(const std::vector<RendezvousTiming>& small,
                         const std::vector<RendezvousTiming>& large, double steps, double cap) {
  RendezvousTerms out;
  auto excess = [](const RendezvousTiming& t) { return t.excess_us; };
  auto at_one = [cap](const RendezvousTiming& t) { return rendezvous_at_one(t, cap); };
  const double es = median_of(small, excess), el = median_of(large, excess);
  const double as = median_of(small, at_one), al = median_of(large, at_one);
  const double pc = al > as ? (el - es) / (al - as) : -1.0;
  if (pc < 0.0) {
    out.us = std::max(0.0, 0.5 * (es + el) / steps);
    return out;
  }
  const double us = (es - pc * as) / steps;
  if (us < 0.0) {
    out.per_compute = as + al > 0.0 ? std::max(0.0, (es + el) / (as + al)) : 0.0;
    return out;
  }
  out.us = us;
  out.per_compute = pc;
  return out;
}

}  // namespace

RendezvousTerms fit_rendezvous(const std::vector<RendezvousTiming>& small,
                               const std::vector<RendezvousTiming>& large, double steps,
                               const std::vector<RendezvousTiming>& largest) {
  if (small.empty() || large.empty() || steps <= 0.0) return {};
  RendezvousTerms out = fit_line(small, large, steps, 0.0);
  double top = 0.0;  // the largest C of the largest computation: a cap above it is none
  for (const auto& t : largest)
    for (double c : t.step_compute_us) top = std::max(top, c);
  if (top <= 0.0) return out;
  const double excess =
      median_of(largest, [](const RendezvousTiming& t) { return t.excess_us; });
  // The largest computation's rendezvous priced by `t` at cap c.
  auto priced = [&](const RendezvousTerms& t, double c) {
    return steps * t.us +
           t.per_compute * median_of(largest, [c](const RendezvousTiming& x) {
             return rendezvous_at_one(x, c);
           });
  };
  double cap = 0.0;
  for (int round = 0; round < 200; ++round) {
    // No cap where the line prices the largest at most its excess (to rounding): the line.
    if (out.per_compute <= 0.0 || excess >= priced(out, 0.0) * (1.0 - 1e-9)) {
      if (cap > 0.0) out = fit_line(small, large, steps, 0.0);
      cap = 0.0;
      break;
    }
    // priced(out, c) grows with c from steps us (c = 0) to the uncapped price (c = top):
    // bisect for the cap where it meets the excess (the smallest positive cap where even
    // steps us is above it).
    double lo = 0.0, hi = top;
    for (int i = 0; i < 60; ++i) {
      const double mid = 0.5 * (lo + hi);
      (priced(out, mid) < excess ? lo : hi) = mid;
    }
    const double next = std::max(hi, 1.0);
    const bool settled = std::abs(next - cap) <= 1e-12 * top;
    cap = next;
    out = fit_line(small, large, steps, cap);
    if (settled) break;
  }
  if (out.per_compute > 0.0 && cap > 0.0 && cap < top * (1.0 - 1e-9)) out.compute_cap_us = cap;
  return out;
}

double mean_routed_rows(const schedule::Schedule& sc, const MoeShape& shape, const Layout& l) {
  // Per (source block, expert) segment the source's k T_gate / E choices, of which S2's MP
  // slice keeps 1 / N_MP (dispatch_slots / exchange_slots).
  const double E = static_cast<double>(shape.experts);
  const double per_segment = static_cast<double>(sc.gate_tokens) * shape.topk / E /
                             static_cast<double>(sc.dispatch_slots / sc.exchange_slots);
  return E / l.ep * static_cast<double>(sc.expert_blocks) * per_segment;
}

double load_of_busiest_rows(const schedule::Schedule& sc, const MoeShape& shape,
                            const Layout& l, double busiest_rank_rows) {
  // The mean routed rows per rank are n = 1 share of a total of that much.
  return max_over_mean(busiest_rank_rows, mean_routed_rows(sc, shape, l), 1.0, 0.0);
}

Prediction predict(const Profile& profile, const schedule::Schedule& sc,
                   const MoeShape& shape, const Target& target) {
  Pricer pr{profile, sc, shape, target};
  Prediction p;
  p.kind = sc.kind;
  p.fused = sc.fused;
  p.chunks = sc.chunks;
  for (const auto& s : sc.steps) {
    StepCost c;
    c.label = s.label;
    c.kind = s.kind;
    if (schedule::is_collective(s.kind))
      pr.collectives(s, c);
    else
      pr.compute(s, c);
    p.steps.push_back(std::move(c));
  }
  // The executor itself: copies x in | zeroes the gradients that are accumulated (the token
  // buffer the gate and the dispatch read), copies dout in and adds the call's dWg to the
  // gradient.
  StepCost ex;
  ex.label = "(executor: input copy, gradient zeroing)";
  ex.executor = true;
  const std::vector<bool> accumulated = schedule::accumulated_gradients(sc);
  double all = 0.0;
  for (size_t i = 0; i < sc.buffers.size(); ++i)
    if (accumulated[i]) all += pr.numel(static_cast<int>(i));
  const double TM = static_cast<double>(shape.tokens * shape.model_dim);
  ex.fwd_us = pr.copy(kF * 2 * TM);
  ex.bwd_us = pr.copy(kF * (all + 2 * TM + 3.0 * static_cast<double>(sc.gate_weight_numel)));
  p.steps.push_back(std::move(ex));
  add_rendezvous(profile, target, p.steps);
  // A computation run while an AllToAll is in flight (Step::overlap_next: the shared experts
  // during the dispatch) hides the shorter of the two, each pass: priced as an entry of its own
  // that takes that much off.
  for (size_t i = 0; i + 1 < sc.steps.size(); ++i) {
    if (!sc.steps[i].overlap_next) continue;
    StepCost credit;
    credit.label = "(overlap: " + sc.steps[i + 1].label + " during " + sc.steps[i].label + ")";
    credit.executor = true;
    credit.fwd_us = -std::min(p.steps[i].fwd_us, p.steps[i + 1].fwd_us);
    credit.bwd_us = -std::min(p.steps[i].bwd_us, p.steps[i + 1].bwd_us);
    p.steps.push_back(std::move(credit));
  }
  for (const auto& c : p.steps) {
    p.fwd_us += c.fwd_us;
    p.bwd_us += c.bwd_us;
  }
  return p;
}

double compute_steps_us(const Prediction& p) {
  double us = 0.0;
  for (const auto& c : p.steps)
    if (!c.executor && !schedule::is_collective(c.kind)) us += c.fwd_us + c.bwd_us;
  return us;
}

std::vector<Candidate> predict_candidates(const Profile& profile, const MoeShape& shape,
                                          const Target& target, int chunks,
                                          const std::vector<Kind>& kinds,
                                          const std::vector<bool>& fuse_modes) {
  const bool has_unfused =
      std::find(fuse_modes.begin(), fuse_modes.end(), false) != fuse_modes.end();
  std::vector<Candidate> out;
  for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2}) {
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
    if (!schedule::supports(kind, target.layout)) continue;
    if (kind == Kind::kBaseline) {
      const auto sc = schedule::build({shape, target.layout, 0, false, chunks}, kind);
      out.push_back({kind, false, predict(profile, sc, shape, target)});
      continue;
    }
    for (bool fuse : {false, true}) {
      if (std::find(fuse_modes.begin(), fuse_modes.end(), fuse) == fuse_modes.end()) continue;
      const auto sc = schedule::build({shape, target.layout, 0, fuse, chunks}, kind);
      if (fuse && !sc.fused && has_unfused) continue;  // same list as the unfused one
      out.push_back({kind, fuse, predict(profile, sc, shape, target)});
    }
  }
  return out;
}

size_t choose(const std::vector<Candidate>& c) {
  PARM_CHECK(!c.empty(), "no candidate schedule to choose from");
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i)
    if (c[i].pred.total_us() < c[best].pred.total_us()) best = i;
  return best;
}

}  // namespace parm::perfmodel
