// The MPI backend of parm::Communicator. Every operation is issued non-blocking and
// completed by polling with a deadline (the watchdog): a collective that does not finish in
// time throws parm::Timeout naming the rank, group, op and bytes.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

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
  RequestPtr isend_uncounted(const void* buf, size_t count, DType dtype, int peer,
                             int tag) override;
  RequestPtr irecv_uncounted(void* buf, size_t count, DType dtype, int peer, int tag) override;

 private:
  // `on_done` runs once when MPI reports completion, before the stats are recorded (so its
  // time counts); `counted` false records nothing.
  RequestPtr make_request(MPI_Request req, CommOp op, double bytes_moved, double bus,
                          std::function<void()> on_done = {}, bool counted = true);

  MPI_Comm comm_;
  std::string name_;
  bool intra_node_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  CommStats stats_;
};

}  // namespace parm
