// Local sums of n equal blocks received from the n ranks of a group, in a fixed order, so
// that a collective built from an exchange plus a local sum gives the same bits on every
// backend (comm.h promises reduce_scatter in group-rank order; the torch backend's float
// allreduce follows the binomial tree of Open MPI's in-place MPI_Iallreduce).
#pragma once

#include <cstddef>

#include "parm/comm.h"

namespace parm {

// recv[i] = ((blocks[0][i] + blocks[1][i]) + blocks[2][i]) + ...: group-rank order.
// `blocks` holds n blocks of `count` elements of `dtype` back to back. Integer sums wrap as
// MPI_SUM does.
void sum_blocks_in_rank_order(DType dtype, const void* blocks, void* recv, size_t count, int n);

// The binomial tree over group ranks 0..n-1 with root 0: at distance d = 1, 2, 4, ... every
// rank r with r % 2d == 0 adds the partial sum of rank r + d (when r + d < n) to its own.
// n = 4: (b0 + b1) + (b2 + b3). This is the order of Open MPI's non-blocking allreduce in
// place (libnbc picks its binomial algorithm whenever the call is MPI_IN_PLACE, as Parm's
// is), so the torch backend's float sums equal the MPI backend's bit for bit (tested:
// tests/python/test_torch_backend.py). `blocks` is overwritten (it holds the partial sums).
void sum_blocks_binomial(DType dtype, void* blocks, void* recv, size_t count, int n);

}  // namespace parm
