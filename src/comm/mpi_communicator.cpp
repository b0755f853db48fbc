#include "comm/mpi_communicator.h"

#include <climits>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "comm/block_sum.h"
#include "comm/mpi_check.h"
#include "comm/fused.h"
#include "comm/fused_any.h"
#include "comm/recycled.h"
#include "comm/tracked_request.h"
#include "parm/timer.h"

namespace parm {

struct MpiCommunicator::VCounts {
  std::vector<int> sc, sd, rc, rd;
};

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

// "rank 3 (group ep rank 1 of 2): alltoall of 4096 bytes did not complete within 60 s; a
// peer is stuck or dead": the Timeout of an operation past its deadline.
Timeout timeout_error(int world_rank, const std::string& where, const std::string& what,
                      double timeout_s, const char* cause) {
  return Timeout(fmt::format("rank {} ({}): {} did not complete within {} s; {}", world_rank,
                             where, what, timeout_s, cause));
}

// MPI_Test: true once MPI reports `req` complete (it then becomes MPI_REQUEST_NULL).
bool mpi_test(MPI_Request& req) {
  int flag = 0;
  PARM_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

class MpiRequest final : public TrackedRequest, public Recycled<MpiRequest> {
 public:
  MpiRequest(MPI_Request req, MpiCommunicator* comm, CommOp op, double bytes, double bus,
             bool counted, MpiCommunicator::BlockSum sum,
             std::unique_ptr<MpiCommunicator::VCounts> counts)
      : req_(req), comm_(comm), op_(op), bytes_(bytes), bus_(bus), start_us_(now_us()),
        counted_(counted), sum_(std::move(sum)), counts_(std::move(counts)) {}

  ~MpiRequest() override {
    settle();
    if (failed()) {
      // MPI never reported completion and may still write into the scratch buffer or read
      // the count arrays: both are abandoned, never freed or handed out again.
      (void)sum_.scratch.data.release();
      (void)counts_.release();
    }
  }

 private:
  bool poll() override { return mpi_test(req_); }

  void watchdog() override {
    if (now_us() > start_us_ + comm_->timeout_s() * 1e6)
      throw timeout_error(comm_->world_rank(),
                          fmt::format("group {} rank {} of {}", comm_->name(), comm_->rank(),
                                      comm_->size()),
                          fmt::format("{} of {} bytes", comm_op_name(op_),
                                      static_cast<int64_t>(bytes_)),
                          comm_->timeout_s(), "a peer is stuck or dead");
  }

  void on_done() override {
    if (sum_.pool != nullptr) {
      sum_blocks_in_rank_order(sum_.dtype, sum_.scratch.data.get(), sum_.recv, sum_.count,
                               sum_.num_blocks);
      sum_.pool->give_back(std::move(sum_.scratch));
    }
    if (counted_) comm_->record(op_, bus_, now_us() - start_us_);
  }

  MPI_Request req_;
  MpiCommunicator* comm_;
  CommOp op_;
  double bytes_;
  double bus_;
  double start_us_;
  bool counted_;
  MpiCommunicator::BlockSum sum_;
  std::unique_ptr<MpiCommunicator::VCounts> counts_;
};

// A setup call's request (wait_setup_request).
class SetupRequest final : public TrackedRequest {
 public:
  SetupRequest(MPI_Request req, int world_rank, const std::string& what, double timeout_s)
      : req_(req), world_rank_(world_rank), what_(what), timeout_s_(timeout_s),
        deadline_us_(now_us() + timeout_s * 1e6) {}
  ~SetupRequest() override { settle(); }

 private:
  bool poll() override { return mpi_test(req_); }
  void watchdog() override {
    if (now_us() > deadline_us_)
      throw timeout_error(world_rank_, "topology setup", what_, timeout_s_,
                          "a rank did not take part, or is stuck or dead");
  }
  void on_done() override {}

  MPI_Request req_;
  int world_rank_;
  std::string what_;
  double timeout_s_;
  double deadline_us_;
};

}  // namespace

void wait_setup_request(MPI_Request req, int world_rank, const std::string& what,
                        double timeout_s) {
  SetupRequest r(req, world_rank, what, timeout_s);
  r.wait();
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool intra_node,
                                 double timeout_s, SpaceOfFn space_of)
    : comm_(comm), name_(std::move(name)), intra_node_(intra_node), timeout_s_(timeout_s),
      space_of_(space_of) {
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
                                         double bus, bool counted, BlockSum sum,
                                         std::unique_ptr<VCounts> counts) {
  return std::make_unique<MpiRequest>(req, this, op, bytes_moved, bus, counted, std::move(sum),
                                      std::move(counts));
}

RequestPtr MpiCommunicator::make_request(MPI_Request req, CommOp op, double bytes_moved,
                                         double bus, bool counted) {
  return make_request(req, op, bytes_moved, bus, counted, BlockSum{}, nullptr);
}

void MpiCommunicator::run_fused_dispatch(Communicator& esp, const float* in, float* out,
                                         size_t block, int chunks) {
  fused_dispatch(*this, same_backend(*this, esp, "fused dispatch"), in, out, block, chunks);
}

void MpiCommunicator::run_fused_combine(Communicator& ep, const float* in, float* out,
                                        size_t block, int chunks, const MpGatherPart* mp_part) {
  if (mp_part != nullptr && mp_part->mp != nullptr)
    (void)same_backend(*this, *mp_part->mp, "fused combine");
  fused_combine(*this, same_backend(*this, ep, "fused combine"), in, out, block, chunks,
                mp_part);
}

RequestPtr MpiCommunicator::do_iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  const MPI_Op mpi_op = op == ReduceOp::kMax ? MPI_MAX : op == ReduceOp::kMin ? MPI_MIN : MPI_SUM;
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, to_mpi_count(count, name_, "allreduce"),
                                mpi_type(dtype), mpi_op, comm_, &req));
  return make_request(req, CommOp::kAllReduce, bytes, bus_bytes(CommOp::kAllReduce, size_, bytes));
}

RequestPtr MpiCommunicator::do_iallgather(const void* send, void* recv, size_t count, DType dtype) {
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

// Not MPI_Ireduce_scatter_block: MPI leaves its summation order unspecified (it depends on
// the algorithm the library picks for the size), so float results could differ between
// sizes, runs and the fused combine. Here every block travels to its owner (an alltoall
// into a scratch buffer the request owns) and the owner sums them in group-rank order
// 0..n-1 on completion: deterministic, and bit-identical to fused_combine, which sums in the
// same order. It moves the same bytes as a pairwise reduce_scatter and is counted as one
// reduce_scatter call (never as an alltoall). The scratch buffer comes from the
// communicator's pool and goes back to it on completion.
RequestPtr MpiCommunicator::do_ireduce_scatter(const void* send, void* recv, size_t count,
                                               DType dtype) {
  const size_t esize = dtype_size(dtype);
  const double bytes = static_cast<double>(count * esize);
  const int per_rank = to_mpi_count(count, name_, "reduce_scatter");
  BlockSum sum;
  sum.pool = &scratch_pool_;
  // (size, count): block q came from group rank q. Uninitialised (it is overwritten); one
  // spare byte so the pointer is never null.
  sum.scratch = scratch_pool_.take(count * esize * size_ + 1);
  sum.recv = recv;
  sum.count = count;
  sum.dtype = dtype;
  sum.num_blocks = size_;
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ialltoall(send, per_rank, mpi_type(dtype), sum.scratch.data.get(),
                               per_rank, mpi_type(dtype), comm_, &req));
  return make_request(req, CommOp::kReduceScatter, bytes * size_,
                      bus_bytes(CommOp::kReduceScatter, size_, bytes), /*counted=*/true,
                      std::move(sum), nullptr);
}

RequestPtr MpiCommunicator::do_ialltoall(const void* send, void* recv, size_t count, DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  const int n = to_mpi_count(count, name_, "alltoall");
  MPI_Request req;
  PARM_MPI_CHECK(
      MPI_Ialltoall(send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_, &req));
  return make_request(req, CommOp::kAllToAll, bytes * size_,
                      bus_bytes(CommOp::kAllToAll, size_, bytes));
}

RequestPtr MpiCommunicator::do_ialltoallv(const void* send, const size_t* send_counts,
                                          const size_t* send_displs, void* recv,
                                          const size_t* recv_counts, const size_t* recv_displs,
                                          DType dtype) {
  // MPI keeps pointers to the count arrays until completion: they live in the request.
  // Allocates on every call (the arrays), unlike every other operation: the MoE layer does
  // not use alltoallv.
  auto counts = std::make_unique<VCounts>();
  double received = 0.0, total = 0.0;
  for (int p = 0; p < size_; ++p) {
    counts->sc.push_back(to_mpi_count(send_counts[p], name_, "alltoallv"));
    counts->sd.push_back(to_mpi_count(send_displs[p], name_, "alltoallv"));
    counts->rc.push_back(to_mpi_count(recv_counts[p], name_, "alltoallv"));
    counts->rd.push_back(to_mpi_count(recv_displs[p], name_, "alltoallv"));
    const double b = static_cast<double>(recv_counts[p] * dtype_size(dtype));
    total += b;
    if (p != rank_) received += b;
  }
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ialltoallv(send, counts->sc.data(), counts->sd.data(), mpi_type(dtype),
                                recv, counts->rc.data(), counts->rd.data(), mpi_type(dtype),
                                comm_, &req));
  return make_request(req, CommOp::kAllToAllv, total, received, /*counted=*/true, BlockSum{},
                      std::move(counts));
}

RequestPtr MpiCommunicator::do_isend(const void* buf, size_t count, DType dtype, int peer,
                                     int tag, bool counted) {
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Isend(buf, to_mpi_count(count, name_, "send"), mpi_type(dtype), peer, tag,
                           comm_, &req));
  return make_request(req, CommOp::kSend, static_cast<double>(count * dtype_size(dtype)), 0.0,
                      counted);
}

RequestPtr MpiCommunicator::do_irecv(void* buf, size_t count, DType dtype, int peer, int tag,
                                     bool counted) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Irecv(buf, to_mpi_count(count, name_, "recv"), mpi_type(dtype), peer, tag,
                           comm_, &req));
  return make_request(req, CommOp::kRecv, bytes, bytes, counted);
}

RequestPtr MpiCommunicator::do_ibroadcast(void* buf, size_t count, DType dtype, int root) {
  PARM_CHECK(root >= 0 && root < size_, "broadcast on group {}: root {} is not a rank of 0..{}",
             name_, root, size_ - 1);
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ibcast(buf, to_mpi_count(count, name_, "broadcast"), mpi_type(dtype), root,
                            comm_, &req));
  return make_request(req, CommOp::kBroadcast, bytes, bus_bytes(CommOp::kBroadcast, size_, bytes));
}

RequestPtr MpiCommunicator::do_ibarrier() {
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ibarrier(comm_, &req));
  return make_request(req, CommOp::kBarrier, 0.0, 0.0);
}

}  // namespace parm
