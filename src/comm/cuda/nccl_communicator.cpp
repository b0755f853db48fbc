// The NCCL backend: every operation queued on the compute stream, a pooled CUDA event per
// request, and a polling watchdog that aborts the NCCL communicator on a deadline or an
// asynchronous NCCL error.
#include "comm/cuda/nccl_communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/cuda/nccl_kernels.h"
#include "comm/fused_any.h"
#include "comm/recycled.h"
#include "comm/tracked_request.h"
#include "comm/scratch_pool.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {

namespace detail {

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  throw CommError(fmt::format("{} failed at {}:{}: NCCL error {} ({}){}", call, file, line,
                              static_cast<int>(result), ncclGetErrorString(result),
                              last != nullptr && *last != '\0'
                                  ? fmt::format("; NCCL's last error: {}", last)
                                  : std::string()));
}

}  // namespace detail

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  throw Error(fmt::format("unknown dtype {}", static_cast<int>(dtype)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  throw Error(fmt::format("unknown reduce op {}", static_cast<int>(op)));
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

const char* at(const void* p, size_t bytes) { return static_cast<const char*>(p) + bytes; }
char* at(void* p, size_t bytes) { return static_cast<char*>(p) + bytes; }

// Block p of send (count elements of `type`, block_bytes) to group rank p and block p of
// recv from it, for every peer p but me, as one NCCL group (my own blocks are left alone).
void exchange_blocks(ncclComm_t comm, const void* send, void* recv, size_t count,
                     size_t block_bytes, ncclDataType_t type, int n, int me,
                     cudaStream_t stream) {
  NcclGroup group;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const size_t off = static_cast<size_t>(p) * block_bytes;
    PARM_NCCL_CHECK(ncclSend(at(send, off), count, type, p, comm, stream));
    PARM_NCCL_CHECK(ncclRecv(at(recv, off), count, type, p, comm, stream));
  }
  group.end();
}

class NcclRequest;

// The NcclGroups open on this thread and the requests issued inside them, whose events are
// recorded when the outermost group ends. `pending` keeps its capacity between groups.
struct GroupState {
  int depth = 0;
  std::vector<NcclRequest*> pending;
};

GroupState& group_state() {
  thread_local GroupState state;
  return state;
}

class NcclRequest final : public TrackedRequest, public Recycled<NcclRequest> {
 public:
  NcclRequest(NcclCommunicator* comm, CommOp op, double bytes, double bus, bool counted,
              NcclCommunicator::DeviceBuffer scratch)
      : comm_(comm), event_(comm->take_event()), op_(op), bytes_(bytes), bus_(bus),
        start_us_(now_us()), counted_(counted), scratch_(scratch) {}

  ~NcclRequest() override {
    if (!recorded_ && !failed()) {
      // Destroyed inside the NcclGroup it was issued in: its operation still goes out with
      // the group, unobserved and uncounted.
      auto& pending = group_state().pending;
      pending.erase(std::remove(pending.begin(), pending.end(), this), pending.end());
      comm_->give_back_event(event_);
      return;
    }
    settle();
    // A failed request (a Timeout, an NCCL error) keeps its event and its scratch buffer: the
    // GPU may still write into the buffer, so neither is reused.
  }

  // After the operation (and, in a group, after the group's ncclGroupEnd).
  void record_event(cudaStream_t stream) {
    const cudaError_t status = cudaEventRecord(event_, stream);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      const std::exception_ptr error = std::make_exception_ptr(CommError(fmt::format(
          "{}: {} of {} bytes: cudaEventRecord failed: {}", comm_->where(), comm_op_name(op_),
          static_cast<int64_t>(bytes_), cudaGetErrorString(status))));
      fail(error);
      std::rethrow_exception(error);
    }
    recorded_ = true;
  }

  // Its group's ncclGroupEnd failed with `error`: the operation was never issued.
  void group_failed(std::exception_ptr error) { fail(std::move(error)); }

 private:
  void check_waitable() override {
    if (!recorded_)
      throw Error(fmt::format(
          "{}: waiting for a {} issued inside an NcclGroup that has not ended would never "
          "return (nothing of the group is queued before its end); end the group first",
          comm_->where(), comm_op_name(op_)));
  }

  bool poll() override {
    if (!recorded_) return false;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      // Not an error; clear it should the runtime have recorded it as the last error.
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      if (comm_->aborted()) comm_->check_usable(comm_op_name(op_));  // it will never complete
      return false;
    }
    (void)cudaGetLastError();
    throw CommError(fmt::format("{}: {} of {} bytes: CUDA error while waiting: {} ({})",
                                comm_->where(), comm_op_name(op_),
                                static_cast<int64_t>(bytes_), cudaGetErrorName(status),
                                cudaGetErrorString(status)));
  }

  void watchdog() override {
    comm_->check_progress(comm_op_name(op_), bytes_, start_us_ + comm_->timeout_s() * 1e6);
  }

  void on_done() override {
    if (scratch_.data != nullptr) comm_->give_back_scratch(std::exchange(scratch_, {}));
    comm_->give_back_event(event_);
    if (counted_) comm_->record(op_, bus_, now_us() - start_us_);
  }

  NcclCommunicator* comm_;
  cudaEvent_t event_;
  CommOp op_;
  double bytes_;
  double bus_;
  double start_us_;
  bool counted_;
  bool recorded_ = false;
  NcclCommunicator::DeviceBuffer scratch_;
};

// The live NCCL communicators of the process: an ncclGroupEnd that returns ncclInProgress
// (they are non-blocking) waits for every one of them to finish enqueuing.
std::vector<NcclCommunicator*>& live_comms() {
  static std::vector<NcclCommunicator*> comms;
  return comms;
}

}  // namespace

// ---- groups ----

NcclGroup::NcclGroup() {
  PARM_NCCL_CHECK(ncclGroupStart());
  ++group_state().depth;
}

NcclGroup::~NcclGroup() {
  if (!open_) return;
  try {
    end();
  } catch (...) {
    // Its requests are marked failed; waiting for them reports it.
  }
}

void NcclGroup::end() {
  if (!open_) return;
  open_ = false;
  GroupState& g = group_state();
  --g.depth;
  if (g.depth > 0) {
    PARM_NCCL_CHECK(ncclGroupEnd());  // nested: the outermost group issues
    return;
  }
  try {
    const ncclResult_t rc = ncclGroupEnd();
    if (rc == ncclInProgress) {
      // Non-blocking communicators: the group's operations are being enqueued in the
      // background; nothing may be queued after them (the events) before that ends.
      for (NcclCommunicator* c : live_comms())
        if (!c->aborted()) c->wait_ready("ncclGroupEnd");
    } else {
      PARM_NCCL_CHECK(rc);
    }
    const cudaStream_t stream = cuda::stream();
    for (NcclRequest* r : g.pending) r->record_event(stream);
  } catch (...) {
    for (NcclRequest* r : g.pending) r->group_failed(std::current_exception());
    g.pending.clear();
    throw;
  }
  g.pending.clear();
}

bool nccl_group_open() { return group_state().depth > 0; }

// ---- the communicator ----

NcclCommunicator::NcclCommunicator(Communicator& host) : LayeredCommunicator(host), host_(host) {
  // NCCL binds the communicator to the current device: the process's GPU, on this thread.
  const cuda::Context& ctx = cuda::context();
  PARM_CUDA_CHECK(cudaSetDevice(ctx.device));
  const cudaStream_t stream = ctx.stream;
  // Rank 0's ncclGetUniqueId result travels with the id, so a failure there is reported on
  // every rank instead of leaving the others waiting in ncclCommInitRank. The broadcast is
  // the host communicator's, under its watchdog.
  struct {
    ncclUniqueId id;
    int32_t status;
  } msg;
  std::memset(&msg, 0, sizeof msg);
  if (host.rank() == 0) msg.status = static_cast<int32_t>(ncclGetUniqueId(&msg.id));
  host.broadcast(&msg, sizeof msg, DType::kU8, 0);
  if (msg.status != static_cast<int32_t>(ncclSuccess))
    detail::throw_nccl_error(static_cast<ncclResult_t>(msg.status),
                             "ncclGetUniqueId (on group rank 0)", __FILE__, __LINE__);
  // Non-blocking, so that the initialisation (which waits for every peer) can be bounded by
  // the deadline and aborted: ncclCommInitRankConfig returns at once and the communicator
  // reports ncclInProgress until it is ready. Its later calls may return ncclInProgress
  // too: each is issued inside an NcclGroup, whose end waits for the enqueueing.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  PARM_NCCL_CHECK(ncclCommInitRankConfig(&comm_, host.size(), msg.id, host.rank(), &config));
  wait_ready("ncclCommInitRank");
  PARM_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
  PARM_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), stream));
  live_comms().push_back(this);
}

NcclCommunicator::~NcclCommunicator() {
  // Never throws: runs at teardown, possibly while unwinding. After an abort the device
  // may still hold this communicator's work, so its memory is left alone.
  auto& live = live_comms();
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
  if (aborted_) return;
  if (comm_ != nullptr) {
    // Flushes its queued operations (bounded by the deadline; aborted past it), then frees.
    try {
      PARM_NCCL_CHECK(ncclCommFinalize(comm_));
      wait_ready("ncclCommFinalize");
      (void)ncclCommDestroy(comm_);
    } catch (...) {
      abort();
      return;
    }
  }
  const cudaStream_t stream = cuda::stream();
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  for (const DeviceBuffer& b : free_scratch_) (void)cudaFreeAsync(b.data, stream);
  if (barrier_buf_ != nullptr) (void)cudaFreeAsync(barrier_buf_, stream);
  if (side_stream_ != nullptr) (void)cudaStreamDestroy(side_stream_);
}

void NcclCommunicator::wait_ready(const char* call) {
  const double deadline_us = now_us() + timeout_s() * 1e6;
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    PARM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    check_progress(call, 0.0, deadline_us);  // aborts and throws on an error or the deadline
    if (spins > 64) sched_yield();
  }
}

std::string NcclCommunicator::where() const {
  return fmt::format("rank {} (group {} rank {} of {})", world_rank(), name(), rank(), size());
}

void NcclCommunicator::check_usable(const char* op) const {
  if (aborted_)
    throw CommError(fmt::format(
        "{}: {} refused: the NCCL communicator was aborted by the watchdog after an earlier "
        "failure",
        where(), op));
}

void NcclCommunicator::abort() {
  if (aborted_) return;
  aborted_ = true;
  (void)ncclCommAbort(comm_);  // also stops this communicator's kernels
}

void NcclCommunicator::check_progress(const char* op, double bytes, double deadline_us) {
  check_usable(op);
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
  if (rc != ncclSuccess) async = rc;
  if (async != ncclSuccess && async != ncclInProgress) {
    const char* last_c = ncclGetLastError(comm_);
    const std::string last = last_c != nullptr ? last_c : "";
    abort();
    throw CommError(fmt::format(
        "{}: {} of {} bytes failed: NCCL asynchronous error {} ({}){}; the NCCL communicator "
        "was aborted",
        where(), op, static_cast<int64_t>(bytes), static_cast<int>(async),
        ncclGetErrorString(async), last.empty() ? "" : "; NCCL's last error: " + last));
  }
  if (now_us() > deadline_us) {
    abort();
    throw Timeout(fmt::format(
        "{}: {} of {} bytes did not complete within {} s; a peer is stuck or dead (the NCCL "
        "communicator was aborted)",
        where(), op, static_cast<int64_t>(bytes), timeout_s()));
  }
}

cudaStream_t NcclCommunicator::side_stream() {
  if (side_stream_ == nullptr)
    PARM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  return side_stream_;
}

cudaEvent_t NcclCommunicator::take_event() {
  if (!free_events_.empty()) {
    const cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  PARM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void NcclCommunicator::give_back_event(cudaEvent_t e) {
  free_events_.push_back(e);  // capacity grows to the peak in flight, then stays
}

NcclCommunicator::DeviceBuffer NcclCommunicator::take_scratch(size_t bytes) {
  DeviceBuffer out;
  if (const size_t pick = pick_scratch(free_scratch_, bytes); pick != free_scratch_.size()) {
    out = free_scratch_[pick];
    free_scratch_[pick] = free_scratch_.back();
    free_scratch_.pop_back();
  }
  if (out.bytes < bytes) {
    // Stream-ordered, so neither call waits for the device; the buffer being replaced is
    // free (its last operation completed).
    const cudaStream_t stream = cuda::stream();
    if (out.data != nullptr) PARM_CUDA_CHECK(cudaFreeAsync(out.data, stream));
    out = {};
    PARM_CUDA_CHECK(cudaMallocAsync(&out.data, bytes, stream));
    out.bytes = bytes;
  }
  return out;
}

void NcclCommunicator::give_back_scratch(DeviceBuffer b) { free_scratch_.push_back(b); }

RequestPtr NcclCommunicator::make_request(CommOp op, double bytes_moved, double bus,
                                          bool counted) {
  return make_request(op, bytes_moved, bus, counted, DeviceBuffer{});
}

RequestPtr NcclCommunicator::make_request(CommOp op, double bytes_moved, double bus,
                                          bool counted, DeviceBuffer scratch) {
  auto req = std::make_unique<NcclRequest>(this, op, bytes_moved, bus, counted, scratch);
  GroupState& g = group_state();
  if (g.depth > 0)
    g.pending.push_back(req.get());
  else
    req->record_event(cuda::stream());
  return req;
}

RequestPtr NcclCommunicator::do_iallreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  check_usable("allreduce");
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  if (count > 0) {
    NcclGroup group;  // a non-blocking communicator's enqueueing ends with the group
    PARM_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_,
                                  cuda::stream()));
    group.end();
  }
  return make_request(CommOp::kAllReduce, bytes, bus_bytes(CommOp::kAllReduce, size(), bytes),
                      /*counted=*/true);
}

RequestPtr NcclCommunicator::do_iallgather(const void* send, void* recv, size_t count,
                                           DType dtype) {
  check_usable("allgather");
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  // In place (send == recv + rank * count) is NCCL's own in-place case.
  if (count > 0) {
    NcclGroup group;
    PARM_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, cuda::stream()));
    group.end();
  }
  return make_request(CommOp::kAllGather, bytes * size(),
                      bus_bytes(CommOp::kAllGather, size(), bytes), /*counted=*/true);
}

// Not ncclReduceScatter: NCCL's summation order depends on the algorithm and the topology,
// so float results would differ from the MPI backend and the fused combine. Every block
// travels to its owner instead (grouped send/recv into a pooled device scratch buffer) and
// a kernel queued after the exchange sums them in group-rank order: the same bytes on the
// wire as a pairwise reduce_scatter, counted as one reduce_scatter call.
RequestPtr NcclCommunicator::do_ireduce_scatter(const void* send, void* recv,
                                                size_t count, DType dtype) {
  check_usable("reduce_scatter");
  PARM_CHECK(!nccl_group_open(),
             "{}: reduce_scatter inside an NcclGroup: its sum would be queued before the "
             "group's exchange; issue it outside the group",
             where());
  const size_t esize = dtype_size(dtype);
  const size_t block_bytes = count * esize;
  const int n = size(), me = rank();
  const double bytes = static_cast<double>(block_bytes);
  DeviceBuffer scratch;
  if (count > 0) {
    const void* own = at(send, static_cast<size_t>(me) * block_bytes);
    PARM_CHECK(recv == own || !overlap(recv, block_bytes, send, block_bytes * n),
               "{}: reduce_scatter: recv overlaps send other than as its own block {} ({} "
               "bytes per block)",
               where(), me, block_bytes);
    const cudaStream_t stream = cuda::stream();
    if (n > 1) {
      // (n, count): block q came from group rank q; this rank's own slot stays unused.
      scratch = take_scratch(block_bytes * static_cast<size_t>(n));
      exchange_blocks(comm_, send, scratch.data, count, block_bytes, nccl_type(dtype), n, me,
                      stream);
    }
    cuda::ordered_block_sum(dtype, scratch.data, count, own, me, n, /*rows=*/1,
                            /*row_stride=*/0, count, recv, /*dst_row_stride=*/0, stream);
  }
  return make_request(CommOp::kReduceScatter, bytes * n,
                      bus_bytes(CommOp::kReduceScatter, n, bytes), /*counted=*/true, scratch);
}

RequestPtr NcclCommunicator::do_ialltoall(const void* send, void* recv, size_t count,
                                          DType dtype) {
  check_usable("alltoall");
  const size_t block_bytes = count * dtype_size(dtype);
  const int n = size(), me = rank();
  const double bytes = static_cast<double>(block_bytes);
  if (count > 0) {
    const size_t total = block_bytes * static_cast<size_t>(n);
    PARM_CHECK(!overlap(send, total, recv, total),
               "{}: alltoall: send and recv overlap ({} bytes per block)", where(),
               block_bytes);
    const cudaStream_t stream = cuda::stream();
    const size_t own = static_cast<size_t>(me) * block_bytes;
    PARM_CUDA_CHECK(cudaMemcpyAsync(at(recv, own), at(send, own), block_bytes,
                                    cudaMemcpyDeviceToDevice, stream));
    if (n > 1)
      exchange_blocks(comm_, send, recv, count, block_bytes, nccl_type(dtype), n, me, stream);
  }
  return make_request(CommOp::kAllToAll, bytes * n, bus_bytes(CommOp::kAllToAll, n, bytes),
                      /*counted=*/true);
}

RequestPtr NcclCommunicator::do_ialltoallv(const void* send, const size_t* send_counts,
                                        const size_t* send_displs, void* recv,
                                        const size_t* recv_counts, const size_t* recv_displs,
                                        DType dtype) {
  check_usable("alltoallv");
  const size_t esize = dtype_size(dtype);
  const int n = size(), me = rank();
  const auto m = static_cast<size_t>(me);
  PARM_CHECK(send_counts[m] == recv_counts[m],
             "{}: alltoallv: this rank sends itself {} elements but expects {}", where(),
             send_counts[m], recv_counts[m]);
  double received = 0.0, total = 0.0;
  for (int p = 0; p < n; ++p) {
    const double b = static_cast<double>(recv_counts[static_cast<size_t>(p)] * esize);
    total += b;
    if (p != me) received += b;
  }
  const cudaStream_t stream = cuda::stream();
  if (send_counts[m] > 0)
    PARM_CUDA_CHECK(cudaMemcpyAsync(at(recv, recv_displs[m] * esize),
                                    at(send, send_displs[m] * esize), send_counts[m] * esize,
                                    cudaMemcpyDeviceToDevice, stream));
  if (n > 1) {
    // Empty messages are skipped on both sides (a zero send count here is a zero receive
    // count on the peer).
    const ncclDataType_t type = nccl_type(dtype);
    NcclGroup group;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto q = static_cast<size_t>(p);
      if (send_counts[q] > 0)
        PARM_NCCL_CHECK(ncclSend(at(send, send_displs[q] * esize), send_counts[q], type, p,
                                 comm_, stream));
      if (recv_counts[q] > 0)
        PARM_NCCL_CHECK(ncclRecv(at(recv, recv_displs[q] * esize), recv_counts[q], type, p,
                                 comm_, stream));
    }
    group.end();
  }
  return make_request(CommOp::kAllToAllv, total, received, /*counted=*/true);
}

RequestPtr NcclCommunicator::post_p2p(bool is_send, void* buf, size_t count, DType dtype,
                                      int peer, int tag, bool counted) {
  const char* op = is_send ? "send" : "recv";
  check_usable(op);
  PARM_CHECK(tag >= 0, "{}: {} with tag {}: tags must be >= 0", where(), op, tag);
  PARM_CHECK(peer >= 0 && peer < size(), "{}: {} to peer {}: valid peers are 0..{}", where(),
             op, peer, size() - 1);
  PARM_CHECK(peer != rank() || nccl_group_open(),
             "{}: {} to itself outside an NcclGroup would block the stream forever (its "
             "matching call is queued behind it); issue both inside one NcclGroup",
             where(), op);
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  if (count > 0) {
    NcclGroup group;
    if (is_send)
      PARM_NCCL_CHECK(ncclSend(buf, count, nccl_type(dtype), peer, comm_, cuda::stream()));
    else
      PARM_NCCL_CHECK(ncclRecv(buf, count, nccl_type(dtype), peer, comm_, cuda::stream()));
    group.end();
  }
  const CommOp cop = is_send ? CommOp::kSend : CommOp::kRecv;
  return make_request(cop, bytes, bus_bytes(cop, size(), bytes), counted);
}

RequestPtr NcclCommunicator::do_isend(const void* buf, size_t count, DType dtype, int peer,
                                      int tag, bool counted) {
  return post_p2p(true, const_cast<void*>(buf), count, dtype, peer, tag, counted);
}

RequestPtr NcclCommunicator::do_irecv(void* buf, size_t count, DType dtype, int peer, int tag,
                                      bool counted) {
  return post_p2p(false, buf, count, dtype, peer, tag, counted);
}

RequestPtr NcclCommunicator::do_ibroadcast(void* buf, size_t count, DType dtype, int root) {
  check_usable("broadcast");
  PARM_CHECK(root >= 0 && root < size(), "{}: broadcast root {} is not a rank of 0..{}", where(),
             root, size() - 1);
  const double bytes = static_cast<double>(count * dtype_size(dtype));
  if (count > 0) {
    NcclGroup group;
    PARM_NCCL_CHECK(
        ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, cuda::stream()));
    group.end();
  }
  return make_request(CommOp::kBroadcast, bytes, bus_bytes(CommOp::kBroadcast, size(), bytes),
                      /*counted=*/true);
}

RequestPtr NcclCommunicator::do_ibarrier() {
  check_usable("barrier");
  NcclGroup group;
  PARM_NCCL_CHECK(
      ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, cuda::stream()));
  group.end();
  return make_request(CommOp::kBarrier, 0.0, 0.0, /*counted=*/true);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host) {
  return std::make_unique<NcclCommunicator>(host);
}

bool is_nccl(const Communicator& c) { return std::strcmp(c.backend(), "nccl") == 0; }

void NcclCommunicator::run_fused_dispatch(Communicator& esp, const float* in, float* out,
                                          size_t block, int chunks) {
  nccl_fused_dispatch(*this, same_backend(*this, esp, "fused dispatch"), in, out, block,
                      chunks);
}

void NcclCommunicator::run_fused_combine(Communicator& ep, const float* in, float* out,
                                         size_t block, int chunks,
                                         const MpGatherPart* mp_part) {
  if (mp_part != nullptr && mp_part->mp != nullptr)
    (void)same_backend(*this, *mp_part->mp, "fused combine");
  nccl_fused_combine(*this, same_backend(*this, ep, "fused combine"), in, out, block, chunks,
                     mp_part);
}

}  // namespace parm
