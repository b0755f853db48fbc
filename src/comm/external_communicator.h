// A communicator whose operations another library runs over a process group of its own: the
// torch.distributed backend (python/torch_group.cpp: a torch process group, gloo on the
// CPU). Parm keeps here what comm.h promises whatever runs the bytes: the counters (same
// ops, same bus bytes, so SPEC's table holds unchanged), the deadline of every wait (a stuck
// peer becomes parm::Timeout naming rank, group, op and bytes), the buffer checks, and the
// summation orders:
//   - reduce_scatter: an alltoall into a scratch buffer, then the owner sums the blocks in
//     group-rank order, exactly as MpiCommunicator does (gloo has no reduce_scatter, and an
//     order left to the library would differ from MPI's);
//   - allreduce of a float sum: an allgather into a scratch buffer, then the binomial-tree
//     sum of comm/block_sum.h, which is Open MPI's order for Parm's in-place allreduce, so
//     the two backends give the same bits (integer sums and max/min, where order cannot
//     change a bit, run as the library's own allreduce).
// Everything else runs as the library's operation on the caller's buffers in place. The
// fused collectives run fused.h's host pipeline over send/recv, as on MPI.
//
// Host memory only: the library's group must move host buffers (gloo). On a cuda run it is
// the host communicator of its group, and Parm's own NCCL communicator is bootstrapped over
// it (the unique id broadcast over the group: Topology::adopt; docs/torch.md).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/scratch_pool.h"
#include "parm/comm.h"

namespace parm {

// One operation in flight in the other library.
class ExternalWork {
 public:
  virtual ~ExternalWork() = default;
  // True once complete. Throws CommError on the library's error.
  virtual bool poll() = 0;
  // Waits at most `seconds` (> 0): true once complete, false when the time ran out first.
  // Throws CommError on the library's error.
  virtual bool wait_for(double seconds) = 0;
};
using ExternalWorkPtr = std::unique_ptr<ExternalWork>;

// The operations of one group of the other library, in group ranks, over buffers that were
// checked already; each returns the library's work handle at once (non-blocking). The
// buffers stay alive until the work completed (or forever, when it never did).
class ExternalGroup {
 public:
  virtual ~ExternalGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual ExternalWorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op) = 0;
  // recv (size * count) = every rank's send in rank order; send may alias its own block.
  virtual ExternalWorkPtr allgather(const void* send, void* recv, size_t count,
                                    DType dtype) = 0;
  virtual ExternalWorkPtr alltoall(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual ExternalWorkPtr alltoallv(const void* send, const size_t* send_counts,
                                    const size_t* send_displs, void* recv,
                                    const size_t* recv_counts, const size_t* recv_displs,
                                    DType dtype) = 0;
  virtual ExternalWorkPtr send(const void* buf, size_t count, DType dtype, int peer,
                               int tag) = 0;
  virtual ExternalWorkPtr recv(void* buf, size_t count, DType dtype, int peer, int tag) = 0;
  virtual ExternalWorkPtr broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual ExternalWorkPtr barrier() = 0;
};

class ExternalCommunicator final : public Communicator {
 public:
  // `backend_name`: what backend() answers ("torch"); a string literal.
  // `space_of`: how buffers are told apart (cuda_space_of on a cuda run, so that a device
  // pointer is refused rather than handed to the library).
  ExternalCommunicator(std::unique_ptr<ExternalGroup> group, std::string name, int world_rank,
                       bool intra_node, double timeout_s, const char* backend_name,
                       SpaceOfFn space_of = &host_space_of);

  const std::string& name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank() const override { return world_rank_; }
  bool intra_node() const override { return intra_node_; }
  CommStats& stats() override { return stats_; }
  double timeout_s() const override { return timeout_s_; }
  const char* backend() const override { return backend_; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  MemorySpace space_of(const void* p) const override { return space_of_(p); }
  void set_timeout_s(double s) { timeout_s_ = s; }
  ExternalGroup& group() { return *group_; }

  // What a request does when the library reports completion (public for the request class
  // of external_communicator.cpp): sums the `blocks` blocks of `scratch` into `recv` in
  // `order`, then returns `scratch` to the pool.
  enum class Sum { kNone, kRankOrder, kBinomial };
  struct BlockSum {
    Sum order = Sum::kNone;
    ScratchPool::Buffer scratch;
    void* recv = nullptr;
    size_t count = 0;
    DType dtype = DType::kF32;
    int blocks = 0;
  };
  void finish_sum(BlockSum& sum);

 protected:
  PARM_COMMUNICATOR_OPS(override)

 private:
  RequestPtr make_request(ExternalWorkPtr work, CommOp op, double bytes_moved, double bus,
                          bool counted, BlockSum sum);
  RequestPtr make_request(ExternalWorkPtr work, CommOp op, double bytes_moved, double bus,
                          bool counted = true);

  std::unique_ptr<ExternalGroup> group_;
  std::string name_;
  int world_rank_;
  bool intra_node_;
  double timeout_s_;
  const char* backend_;
  SpaceOfFn space_of_;
  int rank_ = 0;
  int size_ = 1;
  CommStats stats_;
  ScratchPool scratch_pool_;
};

}  // namespace parm
