#include "perfmodel/calibrate_collectives.h"

#include <algorithm>
#include <array>

#include <fmt/ranges.h>

#include "parm/error.h"
#include "perfmodel/fit.h"
#include "perfmodel/model.h"

namespace parm::perfmodel {
namespace {

void run_op(Communicator& c, CommOp op, size_t count, const float* send, float* recv) {
  switch (op) {
    case CommOp::kAllReduce: c.allreduce(recv, count); break;
    case CommOp::kAllGather: c.allgather(send, recv, count); break;
    case CommOp::kReduceScatter: c.reduce_scatter(send, recv, count); break;
    case CommOp::kAllToAll: c.alltoall(send, recv, count); break;
    default: PARM_CHECK(false, "op {} is not calibrated", comm_op_name(op));
  }
}

// One group calibrated: a layout whose group g has the span wanted.
struct GroupShape {
  int mp = 1, ep = 1, esp = 1;
  Group group = Group::kWorld;
};

// The groups that pin down the collective terms (model.h), for nodes of R ranks:
//   intra: groups of 2 and of R ranks inside a node (mp) -> alpha, alpha_per_rank, beta;
//   inter: one rank per node (ep over esp = R: every rank of a node sends across its link
//          at once, link_share R, intra_share 0) and the whole world (n = world, R ranks of
//          a node in each instance: both shares between 0 and R) -> alpha(n) at two sizes
//          and the link's beta.
std::vector<GroupShape> shapes_to_measure(int world, int per_node, int nodes) {
  std::vector<GroupShape> out;
  for (int s : {2, per_node})
    if (s >= 2 && per_node % s == 0 && (out.empty() || out.back().mp != s))
      out.push_back({s, 1, 1, Group::kMp});
  if (nodes >= 2) {
    out.push_back({1, nodes, per_node, Group::kEp});
    if (world > nodes) out.push_back({1, 1, 1, Group::kWorld});
  }
  return out;
}

struct ShapeSamples {
  GroupSpan span;
  std::vector<double> bus, us;
};

// alpha(n) = alpha_us + alpha_per_rank_us (n - 2) through the latencies fitted per group size.
void fit_alpha_over_sizes(const std::vector<ShapeSamples>& shapes,
                          const std::vector<double>& alpha_of_shape, CommFit& e) {
  std::vector<double> xs, ys;
  for (size_t i = 0; i < shapes.size(); ++i) {
    xs.push_back(shapes[i].span.size - 2.0);
    ys.push_back(alpha_of_shape[i]);
    e.group_sizes.push_back(shapes[i].span.size);
  }
  std::sort(e.group_sizes.begin(), e.group_sizes.end());
  e.group_sizes.erase(std::unique(e.group_sizes.begin(), e.group_sizes.end()),
                      e.group_sizes.end());
  if (e.group_sizes.size() >= 2) {
    const LineFit f = fit_line(xs, ys);
    e.alpha_us = f.intercept;
    e.alpha_per_rank_us = f.slope;
    return;
  }
  double sum = 0.0;
  for (double y : ys) sum += y;
  e.alpha_us = sum / static_cast<double>(ys.size());
  e.alpha_per_rank_us = 0.0;
  e.alpha_per_rank_source = fmt::format("assumed 0 (measured at one group size, {})",
                                        e.group_sizes.empty() ? 0 : e.group_sizes[0]);
}

// Fits one (link, op) entry from the samples of its groups: the bytes term of model.h
// (intra: beta * bus; inter: beta_intra * intra_share * bus, known from the intra fit, plus
// beta * link_share * bus), one slope pooled over the groups with a latency per group, then
// the latencies over the group sizes.
void fit_link_op(Link link, CommOp op, const std::vector<ShapeSamples>& shapes,
                 const std::string& source, Profile& prof) {
  const double beta_intra = prof.collective(Link::kIntra, op).beta_us_per_byte;
  std::vector<std::vector<double>> xs, ys;
  std::vector<std::vector<bool>> above;  // inter: the per-peer message above the eager limit
  for (const auto& sh : shapes) {
    std::vector<double> x, y;
    std::vector<bool> a;
    for (size_t i = 0; i < sh.bus.size(); ++i) {
      const double known = link == Link::kInter ? beta_intra * sh.span.intra_share * sh.bus[i] : 0.0;
      x.push_back(link == Link::kInter ? sh.span.link_share * sh.bus[i] : sh.bus[i]);
      y.push_back(sh.us[i] - known);
      a.push_back(link == Link::kInter && sh.span.size > 1 &&
                  above_eager_limit(prof.fused, peer_message_bytes(sh.span, sh.bus[i])));
    }
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
    above.push_back(std::move(a));
  }
  const PooledFit pf = fit_anchored_pooled(xs, ys, above);
  CommFit& e = prof.collective(link, op);
  e = CommFit{};
  e.beta_us_per_byte = pf.slope;
  e.source = source;
  e.alpha_per_rank_source = source;
  if (link == Link::kInter) {
    e.handshake_us = pf.step;
    e.handshake_source =
        pf.step_fitted
            ? source + " (the step at the eager limit)"
            : fmt::format("assumed 0 (the timings do not pin a step at the eager limit, {:.0f} "
                          "bytes: they need sizes below it and two above it in one group)",
                          prof.fused.eager_limit_bytes);
  } else {
    e.handshake_source = "not priced on an intra-node link";
  }
  fit_alpha_over_sizes(shapes, pf.intercepts, e);
  // r2 of the final formula over every sample.
  std::vector<double> meas, pred;
  for (const auto& sh : shapes)
    for (size_t i = 0; i < sh.bus.size(); ++i) {
      meas.push_back(sh.us[i]);
      pred.push_back(collective_us(prof, op, sh.span, sh.bus[i]));
    }
  e.r2 = r_squared(meas, pred);
  e.samples = static_cast<int64_t>(meas.size());
}

}  // namespace

void calibrate_collectives(Topology& topo, const TopologyOptions& topo_options,
                           const CalibrateOptions& o, BenchDevice& dev, Calibration& cal,
                           const Logger& log) {
  const Target here = target_of(topo);
  const int world = here.layout.world, nodes = topo.num_nodes();
  const int per_node = world % nodes == 0 ? world / nodes : 0;
  std::array<std::vector<ShapeSamples>, kNumLinks * kModelOps.size()> by_entry;
  auto entry = [](Link l, size_t o) { return static_cast<size_t>(l) * kModelOps.size() + o; };
  for (const GroupShape& gs : shapes_to_measure(world, per_node, nodes)) {
    TopologyOptions to = topo_options;
    to.mp = gs.mp;
    to.ep = gs.ep;
    to.esp = gs.esp;
    auto t = Topology::create(to);
    const GroupSpan sp = group_span(target_of(*t), gs.group);
    Communicator& c = t->comm(gs.group);
    Communicator& w = t->host_comm(Group::kWorld);
    const int n = c.size();
    log("  {} group {} ({} ranks; intra share {:.3f}, link share {:.3f}):", link_name(sp.link),
        group_name(gs.group), n, sp.intra_share, sp.link_share);
    for (size_t oi = 0; oi < kModelOps.size(); ++oi) {
      const CommOp op = kModelOps[oi];
      ShapeSamples ss;
      ss.span = sp;
      for (int64_t bytes : collective_sizes(o)) {
        const size_t elems = static_cast<size_t>(bytes) / sizeof(float);
        const size_t count = op == CommOp::kAllReduce ? elems : elems / static_cast<size_t>(n);
        if (count == 0) continue;
        const size_t total = op == CommOp::kAllReduce ? count : count * static_cast<size_t>(n);
        const auto send = filled(dev, total, 1.0f), recv = filled(dev, total, 0.0f);
        // The two smallest sizes anchor the latency (fit_anchored_pooled), so a slow median
        // there sets the op's alpha; they cost microseconds: 3x the iterations.
        const int iters = bytes <= 4 * o.min_bytes ? 3 * o.iters : o.iters;
        const double us = time_all_ranks(w, o.warmup, iters, [&] {
          run_op(c, op, count, send->f(), recv->f());
          dev.sync();
        });
        const double real = static_cast<double>(total * sizeof(float));
        const double bus = bus_bytes(op, n, op == CommOp::kAllReduce ? real : real / n);
        ss.bus.push_back(bus);
        ss.us.push_back(us);
        cal.samples.push_back(
            {fmt::format("{}.{}.n{}", link_name(sp.link), comm_op_name(op), n), bus, us});
      }
      if (ss.bus.size() >= 2) by_entry[entry(sp.link, oi)].push_back(std::move(ss));
    }
  }
  const std::string inter_source = topo.nodes_emulated() ? "emulated" : "measured";
  bool has_intra = false, has_inter = false;
  for (Link link : {Link::kIntra, Link::kInter}) {
    std::vector<size_t> fitted;
    std::vector<double> alphas;
    for (size_t oi = 0; oi < kModelOps.size(); ++oi) {
      const auto& shapes = by_entry[entry(link, oi)];
      if (shapes.empty()) continue;
      (link == Link::kIntra ? has_intra : has_inter) = true;
      fit_link_op(link, kModelOps[oi], shapes,
                  link == Link::kIntra ? std::string("measured") : inter_source, cal.profile);
      fitted.push_back(oi);
      alphas.push_back(cal.profile.collective(link, kModelOps[oi]).alpha_us);
    }
    if (fitted.empty()) continue;
    // One latency of a pair for every op on this link (fit.h: pair_latency).
    const double pair_us = pair_latency(alphas);
    log("  {:<5} latency of a pair, every op: {:.2f} us (median of the ops' {:.2f} us)",
        link_name(link), pair_us, fmt::join(alphas, ", "));
    for (size_t j = 0; j < fitted.size(); ++j) {
      const size_t oi = fitted[j];
      CommFit& e = cal.profile.collective(link, kModelOps[oi]);
      e.alpha_us = pair_us;
      std::vector<double> meas, pred;
      for (const auto& sh : by_entry[entry(link, oi)])
        for (size_t i = 0; i < sh.bus.size(); ++i) {
          meas.push_back(sh.us[i]);
          pred.push_back(collective_us(cal.profile, kModelOps[oi], sh.span, sh.bus[i]));
        }
      e.r2 = r_squared(meas, pred);
      log("  {:<5} {:<14} alpha {:8.2f} us + {:7.2f} us/rank beyond 2  beta {:.3e} us/B "
          "({:7.3f} GB/s{}){}  r2 {:.4f}  [{} samples, sizes {}]",
          link_name(link), comm_op_name(kModelOps[oi]), e.alpha_us, e.alpha_per_rank_us,
          e.beta_us_per_byte, e.beta_us_per_byte > 0 ? 1e-3 / e.beta_us_per_byte : 0.0,
          link == Link::kInter ? " per node link" : " bus",
          link == Link::kInter ? fmt::format("  handshake {:.2f} us ({})", e.handshake_us,
                                             e.handshake_source)
                               : std::string(),
          e.r2, e.samples, fmt::join(e.group_sizes, ","));
    }
  }
  // A machine with only one kind of link: the other is copied and marked "assumed".
  if (has_intra && has_inter) return;
  const Link have = has_intra ? Link::kIntra : Link::kInter;
  const Link miss = has_intra ? Link::kInter : Link::kIntra;
  log("  no {}-node group in this layout: the {} entries copy the {} fit (source \"assumed\")",
      link_name(miss), link_name(miss), link_name(have));
  for (CommOp op : kModelOps) {
    CommFit f = cal.profile.collective(have, op);
    f.source = fmt::format("assumed (copied from {}: no {}-node group measured)",
                           link_name(have), link_name(miss));
    cal.profile.collective(miss, op) = f;
  }
}

}  // namespace parm::perfmodel
