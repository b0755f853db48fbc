#include "train/shard.h"

#include <climits>

#include "parm/error.h"

namespace parm::train {

Tensor gather_whole(Topology& topo, const Shape& whole_shape, const model::Param* p,
                    const Tensor* local) {
  const int64_t n = shape_numel(whole_shape);
  PARM_CHECK(n <= INT_MAX, "a parameter of shape {} is too large to gather ({} elements)",
             shape_str(whole_shape), n);
  // Every element is owned by exactly one rank; the others contribute zeros. Summed as the
  // int32 bit patterns of the floats, x + 0 + ... + 0 is x bit for bit (a float sum would
  // turn -0.0 into +0.0).
  Tensor whole(whole_shape);
  if (p != nullptr && model::owns_copy(*p, topo))
    // A device tensor is copied to the host first: the checkpoint's tensors are host fp32.
    model::copy_shard_to_whole(local->on_host() ? *local : local->to(Device::kCpu), p->splits,
                               whole);
  static_assert(sizeof(float) == sizeof(int32_t));
  topo.host_comm(Group::kWorld).allreduce(whole.data(), static_cast<size_t>(n), DType::kI32);
  if (topo.world_rank() != 0) return Tensor(Shape{0});
  return whole;
}

}  // namespace parm::train
