#include "train/shard.h"

#include <mpi.h>

#include <climits>

#include "comm/mpi_check.h"
#include "parm/error.h"

namespace parm::train {

Tensor gather_whole(Topology& topo, const model::Param& p, const Tensor& local) {
  const int64_t n = shape_numel(p.whole_shape);
  PARM_CHECK(n <= INT_MAX, "parameter {} too large to gather ({} elements)", p.name, n);
  // Every element is owned by exactly one rank; the others contribute zeros, so the sum is
  // the whole tensor, bit for bit.
  Tensor mine(p.whole_shape);
  if (model::owns_copy(p, topo)) model::copy_shard_to_whole(local, p.splits, mine);
  Tensor whole(topo.world_rank() == 0 ? p.whole_shape : Shape{0});
  PARM_MPI_CHECK(MPI_Reduce(mine.data(), whole.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                            0, MPI_COMM_WORLD));
  return whole;
}

}  // namespace parm::train
