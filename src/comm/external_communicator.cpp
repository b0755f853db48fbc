#include "comm/external_communicator.h"

#include <utility>

#include "comm/block_sum.h"
#include "comm/fused.h"
#include "comm/fused_any.h"
#include "comm/tracked_request.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

class ExternalRequest final : public TrackedRequest {
 public:
  ExternalRequest(ExternalWorkPtr work, ExternalCommunicator* comm, CommOp op, double bytes,
                  double bus, bool counted, ExternalCommunicator::BlockSum sum)
      : work_(std::move(work)), comm_(comm), op_(op), bytes_(bytes), bus_(bus),
        start_us_(now_us()), counted_(counted), sum_(std::move(sum)) {}

  ~ExternalRequest() override {
    settle();
    if (failed()) {
      // The library never reported completion and may still write into the scratch
      // buffer, or still hold its work (and the buffers it names): both are abandoned.
      (void)sum_.scratch.data.release();
      (void)work_.release();
    }
  }

 private:
  bool poll() override { return work_->poll(); }

  // Sleeps in the library's own wait (not a polling loop: the library's threads move the
  // bytes, and on a shared core a spinning waiter would take their time) until done or the
  // deadline.
  void block() override {
    const double deadline_us = start_us_ + comm_->timeout_s() * 1e6;
    for (;;) {
      const double left_s = (deadline_us - now_us()) / 1e6;
      if (left_s <= 0) {
        if (work_->poll()) return;
        watchdog();
      }
      if (work_->wait_for(left_s > 0 ? left_s : 1e-3)) return;
    }
  }

  void watchdog() override {
    if (now_us() > start_us_ + comm_->timeout_s() * 1e6)
      throw Timeout(fmt::format(
          "rank {} (group {} rank {} of {}): {} of {} bytes did not complete within {} s; a "
          "peer is stuck or dead",
          comm_->world_rank(), comm_->name(), comm_->rank(), comm_->size(), comm_op_name(op_),
          static_cast<int64_t>(bytes_), comm_->timeout_s()));
  }

  void on_done() override {
    comm_->finish_sum(sum_);
    if (counted_) comm_->record(op_, bus_, now_us() - start_us_);
  }

  ExternalWorkPtr work_;
  ExternalCommunicator* comm_;
  CommOp op_;
  double bytes_;
  double bus_;
  double start_us_;
  bool counted_;
  ExternalCommunicator::BlockSum sum_;
};

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF64; }

}  // namespace

ExternalCommunicator::ExternalCommunicator(std::unique_ptr<ExternalGroup> group,
                                           std::string name, int world_rank, bool intra_node,
                                           double timeout_s, const char* backend_name,
                                           SpaceOfFn space_of)
    : group_(std::move(group)), name_(std::move(name)), world_rank_(world_rank),
      intra_node_(intra_node), timeout_s_(timeout_s), backend_(backend_name),
      space_of_(space_of), rank_(group_->rank()), size_(group_->size()) {}

void ExternalCommunicator::finish_sum(BlockSum& sum) {
  if (sum.order == Sum::kNone) return;
  if (sum.order == Sum::kRankOrder)
    sum_blocks_in_rank_order(sum.dtype, sum.scratch.data.get(), sum.recv, sum.count,
                             sum.blocks);
  else
    sum_blocks_binomial(sum.dtype, sum.scratch.data.get(), sum.recv, sum.count, sum.blocks);
  scratch_pool_.give_back(std::move(sum.scratch));
  sum.order = Sum::kNone;
}

RequestPtr ExternalCommunicator::make_request(ExternalWorkPtr work, CommOp op,
                                              double bytes_moved, double bus, bool counted,
                                              BlockSum sum) {
  return std::make_unique<ExternalRequest>(std::move(work), this, op, bytes_moved, bus,
                                           counted, std::move(sum));
}

RequestPtr ExternalCommunicator::make_request(ExternalWorkPtr work, CommOp op,
                                              double bytes_moved, double bus, bool counted) {
  return make_request(std::move(work), op, bytes_moved, bus, counted, BlockSum{});
}

void ExternalCommunicator::run_fused_dispatch(Communicator& esp, const float* in, float* out,
                                              size_t block, int chunks) {
  fused_dispatch(*this, same_backend(*this, esp, "fused dispatch"), in, out, block, chunks);
}

void ExternalCommunicator::run_fused_combine(Communicator& ep, const float* in, float* out,
                                             size_t block, int chunks,
                                             const MpGatherPart* mp_part) {
  if (mp_part != nullptr && mp_part->mp != nullptr)
    (void)same_backend(*this, *mp_part->mp, "fused combine");
  fused_combine(*this, same_backend(*this, ep, "fused combine"), in, out, block, chunks,
                mp_part);
}

RequestPtr ExternalCommunicator::do_iallreduce(void* buf, size_t count, DType dtype,
                                               ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const double bytes = static_cast<double>(count * esize);
  const double bus = bus_bytes(CommOp::kAllReduce, size_, bytes);
  if (op != ReduceOp::kSum || !is_float(dtype) || size_ == 1 || count == 0)
    return make_request(group_->allreduce(buf, count, dtype, op), CommOp::kAllReduce, bytes,
                        bus);
  // A float sum in the binomial order (see the header): every block, then the local sum.
  BlockSum sum;
  sum.order = Sum::kBinomial;
  sum.scratch = scratch_pool_.take(count * esize * static_cast<size_t>(size_));
  sum.recv = buf;
  sum.count = count;
  sum.dtype = dtype;
  sum.blocks = size_;
  ExternalWorkPtr work = group_->allgather(buf, sum.scratch.data.get(), count, dtype);
  return make_request(std::move(work), CommOp::kAllReduce, bytes, bus, true, std::move(sum));
}

RequestPtr ExternalCommunicator::do_iallgather(const void* send, void* recv, size_t count,
                                               DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  return make_request(group_->allgather(send, recv, count, dtype), CommOp::kAllGather,
                      bytes * size_, bus_bytes(CommOp::kAllGather, size_, bytes));
}

// As MpiCommunicator's: the blocks travel to their owner (an alltoall into scratch) and the
// owner sums them in group-rank order on completion; counted as one reduce_scatter.
RequestPtr ExternalCommunicator::do_ireduce_scatter(const void* send, void* recv, size_t count,
                                                    DType dtype) {
  const size_t esize = dtype_size(dtype);
  const double bytes = static_cast<double>(count * esize);
  BlockSum sum;
  sum.order = Sum::kRankOrder;
  sum.scratch = scratch_pool_.take(count * esize * static_cast<size_t>(size_) + 1);
  sum.recv = recv;
  sum.count = count;
  sum.dtype = dtype;
  sum.blocks = size_;
  ExternalWorkPtr work = group_->alltoall(send, sum.scratch.data.get(), count, dtype);
  return make_request(std::move(work), CommOp::kReduceScatter, bytes * size_,
                      bus_bytes(CommOp::kReduceScatter, size_, bytes), true, std::move(sum));
}

RequestPtr ExternalCommunicator::do_ialltoall(const void* send, void* recv, size_t count,
                                              DType dtype) {
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  return make_request(group_->alltoall(send, recv, count, dtype), CommOp::kAllToAll,
                      bytes * size_, bus_bytes(CommOp::kAllToAll, size_, bytes));
}

RequestPtr ExternalCommunicator::do_ialltoallv(const void* send, const size_t* send_counts,
                                               const size_t* send_displs, void* recv,
                                               const size_t* recv_counts,
                                               const size_t* recv_displs, DType dtype) {
  double received = 0.0, total = 0.0;
  for (int p = 0; p < size_; ++p) {
    const double b = static_cast<double>(recv_counts[p] * dtype_size(dtype));
    total += b;
    if (p != rank_) received += b;
  }
  return make_request(group_->alltoallv(send, send_counts, send_displs, recv, recv_counts,
                                        recv_displs, dtype),
                      CommOp::kAllToAllv, total, received);
}

RequestPtr ExternalCommunicator::do_isend(const void* buf, size_t count, DType dtype, int peer,
                                          int tag, bool counted) {
  PARM_CHECK(peer >= 0 && peer < size_, "send on group {}: peer {} is not a rank of 0..{}",
             name_, peer, size_ - 1);
  return make_request(group_->send(buf, count, dtype, peer, tag), CommOp::kSend,
                      static_cast<double>(count * dtype_size(dtype)), 0.0, counted);
}

RequestPtr ExternalCommunicator::do_irecv(void* buf, size_t count, DType dtype, int peer,
                                          int tag, bool counted) {
  PARM_CHECK(peer >= 0 && peer < size_, "recv on group {}: peer {} is not a rank of 0..{}",
             name_, peer, size_ - 1);
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  return make_request(group_->recv(buf, count, dtype, peer, tag), CommOp::kRecv, bytes, bytes,
                      counted);
}

RequestPtr ExternalCommunicator::do_ibroadcast(void* buf, size_t count, DType dtype, int root) {
  PARM_CHECK(root >= 0 && root < size_, "broadcast on group {}: root {} is not a rank of 0..{}",
             name_, root, size_ - 1);
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  return make_request(group_->broadcast(buf, count, dtype, root), CommOp::kBroadcast, bytes,
                      bus_bytes(CommOp::kBroadcast, size_, bytes));
}

RequestPtr ExternalCommunicator::do_ibarrier() {
  return make_request(group_->barrier(), CommOp::kBarrier, 0.0, 0.0);
}

}  // namespace parm
