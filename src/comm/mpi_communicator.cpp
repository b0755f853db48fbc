#include "comm/mpi_communicator.h"

#include <sched.h>

#include <climits>
#include <utility>
#include <vector>

#include "comm/mpi_check.h"
#include "parm/timer.h"

namespace parm {
namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
  }
  throw Error("unknown dtype");
}

// MPI counts are int; refuse what does not fit instead of truncating.
int to_mpi_count(size_t count, const std::string& group, const char* op) {
  if (count > static_cast<size_t>(INT_MAX))
    throw CommError(fmt::format("{} on group {}: count {} exceeds MPI's int limit {}", op, group,
                                count, INT_MAX));
  return static_cast<int>(count);
}

class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request req, MpiCommunicator* comm, CommOp op, double bytes, double bus,
             int world_rank)
      : req_(req), comm_(comm), op_(op), bytes_(bytes), bus_(bus), world_rank_(world_rank),
        start_us_(now_us()) {}

  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (...) {
      // Unwinding already: main reports the first error and aborts the job.
    }
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    PARM_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) finish();
    return done_;
  }

  void wait() override {
    const double deadline_us = start_us_ + comm_->timeout_s() * 1e6;
    for (int spins = 0; !test(); ++spins) {
      if (spins > 64) sched_yield();  // ranks may outnumber cores
      if ((spins & 255) == 0 && now_us() > deadline_us) {
        done_ = true;  // do not wait again from the destructor
        throw Timeout(fmt::format(
            "rank {} (group {} rank {} of {}): {} of {} bytes did not complete within {} s; "
            "a peer is stuck or dead",
            world_rank_, comm_->name(), comm_->rank(), comm_->size(), comm_op_name(op_),
            static_cast<int64_t>(bytes_), comm_->timeout_s()));
      }
    }
  }

 private:
  void finish() {
    done_ = true;
    OpStats& s = comm_->stats().op(op_);
    s.calls += 1;
    s.bus_bytes += bus_;
    s.time_us += now_us() - start_us_;
  }

  MPI_Request req_;
  MpiCommunicator* comm_;
  CommOp op_;
  double bytes_;
  double bus_;
  int world_rank_;
  double start_us_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool intra_node,
                                 double timeout_s)
    : comm_(comm), name_(std::move(name)), intra_node_(intra_node), timeout_s_(timeout_s) {
  PARM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  PARM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  PARM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  PARM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

RequestPtr MpiCommunicator::make_request(MPI_Request req, CommOp op, double bytes_moved,
                                         double bus) {
  return std::make_unique<MpiRequest>(req, this, op, bytes_moved, bus, world_rank_);
}

RequestPtr MpiCommunicator::iallreduce(void* buf, size_t count, DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_mpi_count(count, name_, "allreduce"),
                                mpi_type(dtype), MPI_SUM, comm_, &req));
  return make_request(req, CommOp::kAllReduce, bytes, bus_bytes(CommOp::kAllReduce, size_, bytes));
}

RequestPtr MpiCommunicator::iallgather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t esize = dtype_size(dtype);
  const double bytes = static_cast<double>(count * esize);
  const bool in_place = send == static_cast<const char*>(recv) + rank_ * count * esize;
  const int n = to_mpi_count(count, name_, "allgather");
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n,
                                mpi_type(dtype), comm_, &req));
  return make_request(req, CommOp::kAllGather, bytes * size_,
                      bus_bytes(CommOp::kAllGather, size_, bytes));
}

RequestPtr MpiCommunicator::ireduce_scatter(const void* send, void* recv, size_t count,
                                            DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv,
                                           to_mpi_count(count, name_, "reduce_scatter"),
                                           mpi_type(dtype), MPI_SUM, comm_, &req));
  return make_request(req, CommOp::kReduceScatter, bytes * size_,
                      bus_bytes(CommOp::kReduceScatter, size_, bytes));
}

RequestPtr MpiCommunicator::ialltoall(const void* send, void* recv, size_t count, DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  const int n = to_mpi_count(count, name_, "alltoall");
  MPI_Request req;
  PARM_MPI_CHECK(
      MPI_Ialltoall(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, &req));
  return make_request(req, CommOp::kAllToAll, bytes * size_,
                      bus_bytes(CommOp::kAllToAll, size_, bytes));
}

RequestPtr MpiCommunicator::ialltoallv(const void* send, const size_t* send_counts,
                                       const size_t* send_displs, void* recv,
                                       const size_t* recv_counts, const size_t* recv_displs,
                                       DType dtype) {
  // MPI keeps pointers to the count arrays until completion: they live in the request.
  struct Arrays {
    std::vector<int> sc, sd, rc, rd;
  };
  auto arrays = std::make_shared<Arrays>();
  double received = 0.0, total = 0.0;
  for (int p = 0; p < size_; ++p) {
    arrays->sc.push_back(to_mpi_count(send_counts[p], name_, "alltoallv"));
    arrays->sd.push_back(to_mpi_count(send_displs[p], name_, "alltoallv"));
    arrays->rc.push_back(to_mpi_count(recv_counts[p], name_, "alltoallv"));
    arrays->rd.push_back(to_mpi_count(recv_displs[p], name_, "alltoallv"));
    const double b = static_cast<double>(recv_counts[p] * dtype_size(dtype));
    total += b;
    if (p != rank_) received += b;
  }
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ialltoallv(send, arrays->sc.data(), arrays->sd.data(), mpi_type(dtype),
                                recv, arrays->rc.data(), arrays->rd.data(), mpi_type(dtype),
                                comm_, &req));
  // Keep the arrays alive with the request.
  struct Holder final : Request {
    RequestPtr inner;
    std::shared_ptr<Arrays> keep;
    bool test() override { return inner->test(); }
    void wait() override { inner->wait(); }
    ~Holder() override { inner.reset(); }
  };
  auto h = std::make_unique<Holder>();
  h->inner = make_request(req, CommOp::kAllToAllv, total, received);
  h->keep = std::move(arrays);
  return h;
}

RequestPtr MpiCommunicator::isend(const void* buf, size_t count, DType dtype, int peer, int tag) {
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Isend(buf, to_mpi_count(count, name_, "send"), mpi_type(dtype), peer, tag,
                           comm_, &req));
  return make_request(req, CommOp::kSend, static_cast<double>(count * dtype_size(dtype)), 0.0);
}

RequestPtr MpiCommunicator::irecv(void* buf, size_t count, DType dtype, int peer, int tag) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Irecv(buf, to_mpi_count(count, name_, "recv"), mpi_type(dtype), peer, tag,
                           comm_, &req));
  return make_request(req, CommOp::kRecv, bytes, bytes);
}

RequestPtr MpiCommunicator::ibarrier() {
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  return make_request(req, CommOp::kBarrier, 0.0, 0.0);
}

}  // namespace parm
