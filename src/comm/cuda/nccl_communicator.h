// The NCCL backend of parm::Communicator (CUDA builds only), over DEVICE buffers: every
// pointer passed to it must be device memory of the process's GPU (parm::device_alloc, or
// memory inside such an allocation); the host never touches the data.
//
// Streams: every operation is queued on the process's compute stream (cuda::stream(),
// src/kernels/cuda/runtime.h), so it runs after the kernels that produced its input and the
// kernels queued after it see its output without any host synchronisation. Its Request
// records a CUDA event after the operation: test() asks the event, wait() polls it (and
// NCCL's asynchronous error state) until it completes or the communicator's deadline
// passes. The watchdog: on a deadline or an asynchronous NCCL error, wait() aborts the
// NCCL communicator (ncclCommAbort, which also stops its kernels) and throws parm::Timeout
// / parm::CommError naming the rank, group, op and bytes. An aborted communicator refuses
// every later operation with parm::CommError; the job is expected to end. Requests follow
// the state machine of src/comm/tracked_request.h.
//
// The NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so that its
// initialisation, which waits for every peer, is bounded by the same deadline (aborted past
// it). Every operation is issued inside an NcclGroup, whose end waits, under the deadline,
// until NCCL has enqueued it (ncclGroupEnd may return ncclInProgress).
//
// Identity, deadline and counters come from the host communicator of the same group
// (`host`: MPI's, or the torch backend's over a gloo group, python/torch_group.h; the unique
// id travels by its broadcast): name, rank, size, intra_node, timeout_s, and stats() IS
// host.stats(), so a group has one set of counters whichever backend moved its bytes. Each
// op records exactly what MpiCommunicator records for it (one call, parm::bus_bytes, wall
// time from issue to the completion seen by test()/wait()).
//
// Point-to-point (isend/irecv and the uncounted pair): NCCL cannot match tags, so `tag` is
// only checked (>= 0); messages between one pair of ranks match in the order they are
// issued, and both sides must issue them in the same order with the same counts. Each
// call is its own NCCL operation queued on the compute stream, which blocks the stream
// until the peer's matching call: an exchange in which both ranks first post a receive and
// then a send deadlocks unless the calls are issued inside one NcclGroup (below), which
// lets them progress together (NCCL's ncclGroupStart/ncclGroupEnd). A send to this rank
// itself is only allowed inside a group.
//
// Steady state: requests come from a per-thread free list, their events from a
// per-communicator pool, and reduce_scatter's device scratch blocks from a grow-only
// per-communicator pool, so repeating the same operations allocates nothing (host or
// device) once warmed up.
//
// Threads: one thread issues and completes a communicator's operations (as with MPI).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/fused.h"
#include "comm/layered_communicator.h"
#include "comm/mpi_communicator.h"
#include "parm/comm.h"

namespace parm {

namespace detail {
// Throws parm::CommError "<call> failed at <file>:<line>: NCCL error <code> (<string>);
// NCCL's last error: <text>".
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line);
}  // namespace detail

// Every NCCL call goes through this check. ncclInProgress is not an error: the call is
// being completed in the background by a non-blocking communicator, and whoever issued it
// waits for it (the end of its NcclGroup, or wait_ready()).
#define PARM_NCCL_CHECK(call)                                                     \
  do {                                                                            \
    const ncclResult_t parm_nccl_rc_ = (call);                                    \
    if (parm_nccl_rc_ != ncclSuccess && parm_nccl_rc_ != ncclInProgress) [[unlikely]] \
      ::parm::detail::throw_nccl_error(parm_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)

class NcclCommunicator final : public LayeredCommunicator {
 public:
  // Collective over `host` (every member constructs its NcclCommunicator at the same point):
  // host rank 0 creates the NCCL unique id, host.broadcast hands it to the others, and each
  // initialises its NCCL communicator on the process's GPU, bounded by host.timeout_s()
  // (parm::Timeout past it, the half-made communicator aborted). `host` must outlive this
  // object. Throws parm::CommError when NCCL refuses (for instance two ranks of the group on
  // one GPU: use StagedCommunicator there).
  explicit NcclCommunicator(Communicator& host);
  // Finalizes and destroys the NCCL communicator (nothing of it may still be in flight;
  // aborted if finalizing outlasts the deadline), or nothing when the watchdog aborted it.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  const char* backend() const override { return "nccl"; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  MemorySpace space_of(const void* p) const override { return cuda_space_of(p); }

  ncclComm_t nccl_comm() const { return comm_; }
  Communicator& host() const { return host_; }
  // True once the watchdog aborted the NCCL communicator.
  bool aborted() const { return aborted_; }

  // ---- internals, public for the request class and the fused collectives ----

  // The stream of this group's share of a fused collective (created on first use).
  cudaStream_t side_stream();
  // Events without timing, recycled (a request takes one when issued and gives it back
  // when it completes).
  cudaEvent_t take_event();
  void give_back_event(cudaEvent_t e);

  // Grow-only pool of device scratch buffers (reduce_scatter's received blocks), as
  // the host ScratchPool (comm/scratch_pool.h) over device memory allocated in stream order
  // (cudaMallocAsync on the compute stream). A buffer whose operation never completed (a
  // Timeout) is never handed out again.
  struct DeviceBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  DeviceBuffer take_scratch(size_t bytes);
  void give_back_scratch(DeviceBuffer b);

  // "rank 3 (group ep rank 1 of 2)": the prefix of every error message.
  std::string where() const;
  // Throws parm::CommError when the watchdog has aborted this communicator.
  void check_usable(const char* op) const;
  // The watchdog's checks while waiting for `op` of `bytes`: on an asynchronous NCCL error
  // aborts and throws parm::CommError; past `deadline_us` (parm::now_us clock) aborts and
  // throws parm::Timeout.
  void check_progress(const char* op, double bytes, double deadline_us);
  // ncclCommAbort (once); later operations are refused.
  void abort();
  // Polls the non-blocking communicator until `call` (ncclCommInitRankConfig, a group's
  // enqueueing, ncclCommFinalize) has finished, under check_progress's rules with a deadline
  // of timeout_s() from now.
  void wait_ready(const char* call);

 protected:
  // Semantics as parm::Communicator, over device buffers; every DType and ReduceOp is
  // supported. Restrictions (refused with parm::Error): ialltoall's send and recv must not
  // overlap; ialltoallv's own block must have equal send and receive counts;
  // ireduce_scatter's recv may be send's own block (recv == send + rank * count) but must
  // not overlap the rest of send. A count of 0 moves nothing and is still counted as a call.
  // ireduce_scatter sums in group-rank order ((b0 + b1) + b2) + ... by a kernel after an
  // exchange of blocks, so it is bit-identical to the MPI backend's and to the fused
  // combine. ibarrier is an allreduce of one int32 on a small device buffer.
  PARM_COMMUNICATOR_OPS(override)

 private:
  // Queues the event of a request (now, or at the end of the open NcclGroup) and wraps it.
  RequestPtr make_request(CommOp op, double bytes_moved, double bus, bool counted,
                          DeviceBuffer scratch);
  RequestPtr make_request(CommOp op, double bytes_moved, double bus, bool counted);
  RequestPtr post_p2p(bool is_send, void* buf, size_t count, DType dtype, int peer, int tag,
                      bool counted);

  Communicator& host_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  cudaStream_t side_stream_ = nullptr;
  int32_t* barrier_buf_ = nullptr;  // (1) device int of ibarrier
  std::vector<cudaEvent_t> free_events_;
  std::vector<DeviceBuffer> free_scratch_;
};

// Groups NCCL operations issued on this thread (on any NcclCommunicator) between its
// construction and end() (or its destruction) into one ncclGroupStart / ncclGroupEnd, so
// that point-to-point messages that must progress together do not deadlock:
//   { NcclGroup g; for (p ...) { reqs.push_back(c.irecv(..., p, t)); reqs.push_back(c.isend(..., p, t)); } }
//   wait_all(reqs);
// Nothing is queued on the stream until the group ends; the requests' events are recorded
// then, and waiting for a request of a group that has not ended throws. Allowed inside:
// isend, irecv (and uncounted), iallreduce, iallgather, ialltoall, ialltoallv, ibarrier.
// Refused inside (they queue work that depends on the group's result): ireduce_scatter and
// the fused collectives. Groups nest; the outermost one issues.
class NcclGroup {
 public:
  NcclGroup();
  ~NcclGroup();  // calls end() if needed; swallows its error while unwinding
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  // ncclGroupEnd; the outermost group then records the events of the requests issued in it.
  void end();

 private:
  bool open_ = true;
};

// True while an NcclGroup is open on this thread.
bool nccl_group_open();

// The communicator the topology builds for a group in a CUDA run with one GPU per rank.
// Collective over `host`, as the constructor.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host);
// True when `c` is an NcclCommunicator (its backend() is "nccl").
bool is_nccl(const Communicator& c);

// ---- fused collectives on CUDA streams (src/comm/cuda/nccl_fused.cpp): what
// NcclCommunicator::run_fused_dispatch / run_fused_combine run, every group an NCCL one ----
// Semantics, layouts and counters exactly those of fused_dispatch / fused_combine
// (src/comm/fused.h), over device buffers, bit-identical to the unfused composition. The
// data is cut into `chunks` pieces (the same contiguous range of every block); each
// communicator moves its pieces on its own stream (side_stream()), stage j+1 of piece c
// waiting (a CUDA event) for stage j of piece c, so piece c's inter-node exchange overlaps
// piece c-1's intra-node one. The streams start after the work already queued on the
// compute stream, and the compute stream waits for them at the end. Blocking: returns when
// complete (bounded by the communicators' deadline; on a deadline or NCCL error, every
// communicator involved is aborted and parm::Timeout / parm::CommError thrown).
//
// Counters: one call of each constituent collective (on a group of more than one rank),
// with its bus bytes, and as time the GPU time from its stage's first piece starting to its
// last piece ending (so with chunks > 1 the parts overlap, as in fused.cpp).

// out (N_ESP, N_EP, block) = esp.allgather(ep.alltoall(in (N_EP, block))). `in` and `out`
// must not overlap.
void nccl_fused_dispatch(NcclCommunicator& ep, NcclCommunicator& esp, const float* in,
                         float* out, size_t block, int chunks);

// out (N_EP, block) = ep.alltoall(esp.reduce_scatter(in (N_ESP, N_EP, block))), the ESP sum
// in ESP-rank order; then, with `mp_part` (whose mp must be an NcclCommunicator and whose
// `full` is device memory), the MP AllGather of `out` into mp_part->full (outer, N_MP,
// chunk), interleaved as fused.h says.
void nccl_fused_combine(NcclCommunicator& esp, NcclCommunicator& ep, const float* in,
                        float* out, size_t block, int chunks,
                        const MpGatherPart* mp_part = nullptr);

}  // namespace parm
