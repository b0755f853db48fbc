#include "model/param.h"

#include <cstring>

#include "parm/error.h"

namespace parm::model {

ShardBox shard_box(const Shape& whole_shape, const std::vector<Split>& splits) {
  ShardBox box;
  box.offset.assign(whole_shape.size(), 0);
  box.extent = whole_shape;
  for (const Split& s : splits) {
    PARM_CHECK(s.dim >= 0 && s.dim < static_cast<int>(whole_shape.size()),
               "split dim {} of a tensor {}", s.dim, shape_str(whole_shape));
    PARM_CHECK(s.num_parts >= 1 && s.part >= 0 && s.part < s.num_parts,
               "split part {} of {} parts", s.part, s.num_parts);
    const int64_t n = box.extent[static_cast<size_t>(s.dim)];
    if (s.uneven) {
      const int64_t begin = uneven_begin(n, s.num_parts, s.part);
      box.offset[static_cast<size_t>(s.dim)] += begin;
      box.extent[static_cast<size_t>(s.dim)] = uneven_begin(n, s.num_parts, s.part + 1) - begin;
      continue;
    }
    PARM_CHECK(n % s.num_parts == 0, "dim {} of extent {} of a tensor {} does not split into {}",
               s.dim, n, shape_str(whole_shape), s.num_parts);
    const int64_t part = n / s.num_parts;
    box.offset[static_cast<size_t>(s.dim)] += s.part * part;
    box.extent[static_cast<size_t>(s.dim)] = part;
  }
  return box;
}

void copy_shard_from_whole(const Tensor& whole, const std::vector<Split>& splits, Tensor& local) {
  PARM_CHECK_EQ(local.numel(), shape_numel(local_shape(whole.shape(), splits)));
  for_each_shard_run(whole.shape(), splits, [&](int64_t lo, int64_t wo, int64_t n) {
    std::memcpy(local.data() + lo, whole.data() + wo, static_cast<size_t>(n) * sizeof(float));
  });
}

void copy_shard_to_whole(const Tensor& local, const std::vector<Split>& splits, Tensor& whole) {
  PARM_CHECK_EQ(local.numel(), shape_numel(local_shape(whole.shape(), splits)));
  for_each_shard_run(whole.shape(), splits, [&](int64_t lo, int64_t wo, int64_t n) {
    std::memcpy(whole.data() + wo, local.data() + lo, static_cast<size_t>(n) * sizeof(float));
  });
}

bool owns_copy(const Param& p, Topology& topo) {
  for (Group g : p.replicated_over)
    if (topo.comm(g).rank() != 0) return false;
  return true;
}

}  // namespace parm::model
