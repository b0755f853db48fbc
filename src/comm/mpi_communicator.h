// The MPI backend of parm::Communicator. Every operation is issued non-blocking and
// completed by polling with a deadline (the watchdog): a collective that does not finish in
// time throws parm::Timeout naming the rank, group, op and bytes.
//
// The fused collectives run fused.h's host pipeline (all groups must be MPI communicators).
//
// Host memory only: every buffer is checked with the communicator's SpaceOfFn
// (host_space_of by default; the topology of a cuda run passes cuda_space_of, so a device
// pointer is refused instead of handed to MPI).
//
// Steady state: after a warm-up call, the same operation with the same sizes makes no C++
// heap allocation (alltoallv excepted): request objects are recycled through a per-thread
// free list, and reduce_scatter's scratch buffers through a per-communicator pool. Requests
// follow the state machine of tracked_request.h; a failed one keeps its scratch buffer and
// alltoallv's count arrays forever (MPI may still use them).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/scratch_pool.h"
#include "parm/comm.h"

namespace parm {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD).
  MpiCommunicator(MPI_Comm comm, std::string name, bool intra_node, double timeout_s,
                  SpaceOfFn space_of = &host_space_of);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank() const override { return world_rank_; }
  bool intra_node() const override { return intra_node_; }
  CommStats& stats() override { return stats_; }
  double timeout_s() const override { return timeout_s_; }
  const char* backend() const override { return "mpi"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  MemorySpace space_of(const void* p) const override { return space_of_(p); }
  void set_timeout_s(double s) { timeout_s_ = s; }
  void set_intra_node(bool intra_node) { intra_node_ = intra_node; }
  MPI_Comm mpi_comm() const { return comm_; }

  // ---- internals, public only for the request class of mpi_communicator.cpp ----

  // reduce_scatter's receive blocks come from a scratch pool (comm/scratch_pool.h).
  using ScratchPool = parm::ScratchPool;

  // What a reduce_scatter does when MPI reports completion: sums the (num_blocks, count)
  // blocks that arrived in `scratch` into `recv` in group-rank order, then returns
  // `scratch` to `pool`.
  struct BlockSum {
    ScratchPool* pool = nullptr;  // null: nothing to do
    ScratchPool::Buffer scratch;
    void* recv = nullptr;
    size_t count = 0;
    DType dtype = DType::kF32;
    int num_blocks = 0;
  };
  // alltoallv's int counts and displacements, which MPI reads until completion.
  struct VCounts;

 private:
 protected:
  PARM_COMMUNICATOR_OPS(override)

 private:
  // `sum` runs once when MPI reports completion, before the stats are recorded (so its time
  // counts); `counted` false records nothing; `counts` lives as long as the MPI request.
  RequestPtr make_request(MPI_Request req, CommOp op, double bytes_moved, double bus,
                          bool counted, BlockSum sum, std::unique_ptr<VCounts> counts);
  RequestPtr make_request(MPI_Request req, CommOp op, double bytes_moved, double bus,
                          bool counted = true);

  MPI_Comm comm_;
  std::string name_;
  bool intra_node_;
  double timeout_s_;
  SpaceOfFn space_of_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  CommStats stats_;
  ScratchPool scratch_pool_;
};

// Waits for a request of a setup call made before any communicator exists (Topology::create's
// MPI_Comm_idup of the world) under the same deadline rule as every operation: throws
// parm::Timeout naming `world_rank` and `what` after `timeout_s`. A request that timed out is
// abandoned, never freed (MPI may still complete it).
void wait_setup_request(MPI_Request req, int world_rank, const std::string& what,
                        double timeout_s);

}  // namespace parm
