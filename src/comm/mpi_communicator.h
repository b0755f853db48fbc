// The MPI backend of parm::Communicator. Every operation is issued non-blocking and
// completed by polling with a deadline (the watchdog): a collective that does not finish in
// time throws parm::Timeout naming the rank, group, op and bytes.
//
// Steady state: after a warm-up call, the same operation with the same sizes makes no C++
// heap allocation (alltoallv excepted): request objects are recycled through a per-thread
// free list, and reduce_scatter's scratch buffers through a per-communicator pool.
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
  MpiCommunicator(MPI_Comm comm, std::string name, bool intra_node, double timeout_s);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool intra_node() const override { return intra_node_; }
  CommStats& stats() override { return stats_; }
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double s) { timeout_s_ = s; }
  MPI_Comm mpi_comm() const { return comm_; }

  RequestPtr iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  RequestPtr iallgather(const void* send, void* recv, size_t count, DType dtype) override;
  RequestPtr ireduce_scatter(const void* send, void* recv, size_t count, DType dtype) override;
  RequestPtr ialltoall(const void* send, void* recv, size_t count, DType dtype) override;
  RequestPtr ialltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                        void* recv, const size_t* recv_counts, const size_t* recv_displs,
                        DType dtype) override;
  RequestPtr isend(const void* buf, size_t count, DType dtype, int peer, int tag) override;
  RequestPtr irecv(void* buf, size_t count, DType dtype, int peer, int tag) override;
  RequestPtr ibarrier() override;
  RequestPtr ibroadcast(void* buf, size_t count, DType dtype, int root) override;
  RequestPtr isend_uncounted(const void* buf, size_t count, DType dtype, int peer,
                             int tag) override;
  RequestPtr irecv_uncounted(void* buf, size_t count, DType dtype, int peer, int tag) override;

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

 private:
  // `sum` runs once when MPI reports completion, before the stats are recorded (so its time
  // counts); `counted` false records nothing.
  RequestPtr make_request(MPI_Request req, CommOp op, double bytes_moved, double bus,
                          bool counted, BlockSum sum);
  RequestPtr make_request(MPI_Request req, CommOp op, double bytes_moved, double bus,
                          bool counted = true);

  MPI_Comm comm_;
  std::string name_;
  bool intra_node_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  CommStats stats_;
  ScratchPool scratch_pool_;
};

}  // namespace parm
