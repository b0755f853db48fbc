#include "train/flat_groups.h"

#include "parm/error.h"

namespace parm::train {

std::vector<FlatGroup> flat_groups(Topology* topo, const std::vector<model::Param*>& params) {
  std::vector<FlatGroup> out;
  for (Group g : {Group::kDp, Group::kEdp, Group::kMp, Group::kEp, Group::kEsp, Group::kWorld}) {
    FlatGroup f;
    f.group = g;
    f.num_shards = topo == nullptr ? 1 : topo->comm(g).size();
    f.rank = topo == nullptr ? 0 : topo->comm(g).rank();
    for (auto* p : params) {
      if (p->grad_reduce != g) continue;
      f.params.push_back(p);
      f.offsets.push_back(f.total);
      f.total += p->grad.numel();
    }
    if (f.params.empty()) continue;
    f.shard = (f.total + f.num_shards - 1) / f.num_shards;
    out.push_back(std::move(f));
  }
  return out;
}

Communicator& group_comm(Topology& topo, Group g, Device device) {
  return device == Device::kCpu ? topo.host_comm(g) : topo.comm(g);
}

void reduce_scatter_gradients(Topology& topo, const model::DenseOps& ops, const FlatGroup& g,
                              Tensor& flat, Tensor& shard) {
  PARM_CHECK(shard.numel() >= g.shard && shard.device() == ops.device,
             "the {} shard buffer holds {} elements on {}; {} on {} needed", group_name(g.group),
             shard.numel(), device_name(shard.device()), g.shard, device_name(ops.device));
  if (g.num_shards == 1) {
    for_each_piece(g, 0, g.total, [&](size_t i, int64_t from, int64_t at, int64_t n) {
      ops.copy(shard.data() + at, g.params[i]->grad.data() + from, n);
    });
    return;
  }
  if (flat.numel() < g.padded() || flat.device() != ops.device)
    flat = Tensor({g.padded()}, ops.device);
  // Another group may have left its numbers where this one's padding is.
  const int64_t pad = g.padded() - g.total;
  if (pad > 0) Tensor::view(flat.data() + g.total, {pad}, ops.device).zero();
  for_each_piece(g, 0, g.total, [&](size_t i, int64_t from, int64_t at, int64_t n) {
    ops.copy(flat.data() + at, g.params[i]->grad.data() + from, n);
  });
  group_comm(topo, g.group, ops.device)
      .reduce_scatter(flat.data(), shard.data(), static_cast<size_t>(g.shard));
}

bool counts_for_norm(const model::Param& p, Group sharded_over, Topology* topo) {
  if (topo == nullptr) return true;
  for (Group g : p.replicated_over)
    if (g != sharded_over && topo->comm(g).rank() != 0) return false;
  return true;
}

double world_sum_in_rank_order(Topology* topo, double x) {
  if (topo == nullptr) return x;
  Communicator& world = topo->host_comm(Group::kWorld);
  std::vector<double> all(static_cast<size_t>(world.size()));
  world.allgather(&x, all.data(), 1);
  double sum = 0.0;
  for (double v : all) sum += v;
  return sum;
}

}  // namespace parm::train
