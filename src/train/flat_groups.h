// The parameters whose gradients are summed over one group (Param::grad_reduce: dp for dense,
// edp for experts), laid out back to back in one flat buffer and cut into equal shards, one
// per rank of that group: the layout that the gradient reduction, the global norm and the
// (optionally sharded) AdamW state all share (train/optimizer.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/dense_ops.h"
#include "model/param.h"

namespace parm::train {

// Flat element j of the group is element j - offsets[i] of params[i] for the i with
// offsets[i] <= j < offsets[i] + numel. The buffer is padded with zeros to num_shards * shard
// elements (fewer than num_shards of padding); rank r of the group holds shard r, flat
// elements [r * shard, (r + 1) * shard).
struct FlatGroup {
  Group group = Group::kDp;
  int num_shards = 1;  // the group's size
  int rank = 0;        // this rank's shard
  std::vector<model::Param*> params;  // registration order
  std::vector<int64_t> offsets;
  int64_t total = 0;  // elements of the parameters, without the padding
  int64_t shard = 0;  // elements per shard
  int64_t padded() const { return shard * num_shards; }
  int64_t shard_begin() const { return shard * rank; }
  // The end of this rank's part of the parameters (the padding excluded).
  int64_t shard_end() const { return std::min(total, shard_begin() + shard); }
};

// Every parameter in one FlatGroup per reduction group, the groups in the order dp, edp,
// mp, ep, esp, world (groups that reduce nothing omitted): the same list on every rank of each
// group. Shards and ranks come from topo->comm(group); topo null: one process (every group
// one rank).
std::vector<FlatGroup> flat_groups(Topology* topo, const std::vector<model::Param*>& params);

// fn(i, param_offset, flat_offset, n) for every piece of a parameter of g that lies inside
// the flat range [begin, end), in flat order: elements [param_offset, + n) of params[i].
template <typename Fn>
void for_each_piece(const FlatGroup& g, int64_t begin, int64_t end, Fn&& fn) {
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t lo = std::max(begin, g.offsets[i]);
    const int64_t hi = std::min(end, g.offsets[i] + g.params[i]->grad.numel());
    if (lo < hi) fn(i, lo - g.offsets[i], lo, hi - lo);
  }
}

// The communicator that moves g's tensors on `device`: the group's host communicator for
// host tensors, its device communicator (topo.comm) for device tensors.
Communicator& group_comm(Topology& topo, Group g, Device device);

// Sums the gradients of g over the group into `shard` (at least g.shard elements; the first
// g.shard overwritten): the gradients are copied into `flat` (scratch of at least g.padded()
// elements, reallocated when too small; its padding zeroed) and reduce-scattered, which sums
// in group-rank order. Both on ops.device.
void reduce_scatter_gradients(Topology& topo, const model::DenseOps& ops, const FlatGroup& g,
                              Tensor& flat, Tensor& shard);

// This rank's part of the squared global gradient norm from group g: the squares of the
// reduced gradients in its shard, of the parameters whose copy it counts (it is rank 0 of every
// group of Param::replicated_over other than g.group, over which the shards are cut).
// `grad_of(i, flat_offset)`: where the reduced gradient of params[i] at that flat element is.
// Every piece in one sum_of_squares call, in flat order, so that the same pieces give the
// same bits wherever they are held.
// topo null: one process.
template <typename GradOf>
double shard_sum_of_squares(Topology* topo, const model::DenseOps& ops, const FlatGroup& g,
                            GradOf&& grad_of);

// The sum over the world's ranks of x, added in world-rank order (the same bits on every rank
// and for every reduction algorithm). Collective over the world (host); topo null: x.
double world_sum_in_rank_order(Topology* topo, double x);

// ---- template implementation ----
bool counts_for_norm(const model::Param& p, Group sharded_over, Topology* topo);

template <typename GradOf>
double shard_sum_of_squares(Topology* topo, const model::DenseOps& ops, const FlatGroup& g,
                            GradOf&& grad_of) {
  std::vector<const float*> bufs;
  std::vector<int64_t> sizes;
  for_each_piece(g, g.shard_begin(), g.shard_end(),
                 [&](size_t i, int64_t, int64_t flat, int64_t n) {
                   if (!counts_for_norm(*g.params[i], g.group, topo)) return;
                   bufs.push_back(grad_of(i, flat));
                   sizes.push_back(n);
                 });
  return ops.sum_of_squares(bufs.data(), sizes.data(), static_cast<int64_t>(bufs.size()), 0.0);
}

}  // namespace parm::train
