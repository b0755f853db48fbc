// The communication interface. One Communicator per process group (mp, ep, esp, dp, edp,
// world), implemented by three backends: MPI over host memory (src/comm/mpi_communicator.h),
// device memory staged through host memory over MPI (src/comm/staged_communicator.h), and
// NCCL over device memory (src/comm/cuda/nccl_communicator.h, CUDA builds). Every operation
// is counted per (group, op): calls, bus bytes received by this rank, and wall time; every
// wait is bounded by a deadline that turns a stuck collective into parm::Timeout; and every
// call checks that its buffers live in the communicator's memory space (host or device).
//
// Counts are in elements of `dtype`; buffers are caller-owned and must stay alive until
// the operation completes (blocking calls: until they return; non-blocking: until wait()).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace parm {

enum class DType { kF32, kF64, kI32, kI64, kU8 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }

// Reductions of allreduce.
enum class ReduceOp { kSum, kMax, kMin };

enum class CommOp {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllToAllv,
  kSend,
  kRecv,
  kBarrier,
  kBroadcast,
  // Small integer side messages that travel with a collective and are counted apart from it
  // (the MoE dispatch's per-expert fill counts), so that the collectives' own counts stay
  // exactly the data they move.
  kMetadata,
  kNumOps
};
constexpr int kNumCommOps = static_cast<int>(CommOp::kNumOps);
// "allreduce", "allgather", "reduce_scatter", "alltoall", "alltoallv", "send", "recv", "barrier",
// "broadcast", "metadata"
const char* comm_op_name(CommOp op);

// Bus bytes a rank receives in one call on a group of n ranks (nccl-tests busbw convention):
//   allreduce of B bytes:                 2 (n-1)/n * B
//   allgather, B bytes per rank:          (n-1) * B
//   reduce_scatter, B bytes per rank out: (n-1) * B
//   alltoall, B bytes per peer:           (n-1) * B   (= (n-1)/n of the whole buffer)
//   broadcast of B bytes:                 B (the root receives nothing but is counted as
//                                         nccl-tests counts it: busbw = algbw)
//   send: 0; recv of B bytes: B; barrier: 0. alltoallv, metadata: what it received from
//   others (B).
double bus_bytes(CommOp op, int n, double bytes);

struct OpStats {
  int64_t calls = 0;
  double bus_bytes = 0.0;  // received by this rank
  double time_us = 0.0;    // wall time from issue to completion
};

class CommStats {
 public:
  OpStats& op(CommOp op) { return ops_[static_cast<int>(op)]; }
  const OpStats& op(CommOp op) const { return ops_[static_cast<int>(op)]; }
  void reset() { ops_ = {}; }

 private:
  std::array<OpStats, kNumCommOps> ops_{};
};

// A non-blocking operation in flight. wait() returns when it completed, or throws
// parm::Timeout past the communicator's deadline (parm::CommError on a library error).
// Destroying an unfinished request waits. A request that failed stays failed: every later
// test() and wait() rethrows the same error (src/comm/tracked_request.h).
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;  // true once complete (and then records the stats)
  virtual void wait() = 0;
};
using RequestPtr = std::unique_ptr<Request>;

// Waits for all; throws the first failure after trying the rest.
void wait_all(std::vector<RequestPtr>& requests);

// Point-to-point tags at and above this value belong to the fused collectives; the two just
// below it to the metadata exchange (src/comm/metadata.h) and the dropless row exchanges
// (src/comm/row_exchange.h).
constexpr int kFusedTagBase = 16384;

// Where a buffer lives. Each communicator moves buffers of one space (memory_space()).
enum class MemorySpace { kHost, kDevice };
const char* memory_space_name(MemorySpace s);  // "host", "device"
// How a communicator tells the space of a buffer.
using SpaceOfFn = MemorySpace (*)(const void* p);
// Every buffer is host memory: the MPI communicators of a run without a GPU (no CUDA call is
// ever made for them).
MemorySpace host_space_of(const void* p);
// Asks CUDA (cudaPointerGetAttributes): device or managed memory is kDevice, anything else
// (pageable or pinned host memory) kHost. kHost in a build without CUDA or where no GPU is
// visible.
MemorySpace cuda_space_of(const void* p);

struct MpGatherPart;  // src/comm/fused.h

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const std::string& name() const = 0;  // "mp", "ep", ...
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int world_rank() const = 0;   // this process's rank in the job (for messages)
  virtual bool intra_node() const = 0;  // all members share a node
  virtual CommStats& stats() = 0;
  virtual double timeout_s() const = 0;
  virtual const char* backend() const = 0;  // "mpi", "staged", "nccl"

  // The space every buffer handed to this communicator must be in, and how it tells a
  // buffer's space.
  virtual MemorySpace memory_space() const = 0;
  virtual MemorySpace space_of(const void* p) const = 0;
  // Throws parm::Error naming the rank, group, op, buffer and both spaces when `bytes` (> 0)
  // bytes at `p` are not in memory_space(). Every operation below checks its buffers so.
  void check_buffer(const char* op, const char* which, const void* p, size_t bytes) const;

  // ---- non-blocking ----
  // In place sum over the group.
  RequestPtr iallreduce(void* buf, size_t count, DType dtype, ReduceOp op = ReduceOp::kSum);
  // recv (size * count) = concatenation of every rank's send (count), in rank order.
  // send may be recv + rank * count (in place).
  RequestPtr iallgather(const void* send, void* recv, size_t count, DType dtype);
  // recv (count) = sum over ranks of their send block `rank` (send holds size * count),
  // summed in group-rank order ((b0 + b1) + b2) + ... on every backend, so that results are
  // deterministic and the fused combine (src/comm/fused.h) matches it bit for bit.
  RequestPtr ireduce_scatter(const void* send, void* recv, size_t count, DType dtype);
  // Block p of send (count each) goes to rank p; block p of recv came from rank p.
  RequestPtr ialltoall(const void* send, void* recv, size_t count, DType dtype);
  // Variable blocks: counts and displacements (elements) per peer.
  RequestPtr ialltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                        void* recv, const size_t* recv_counts, const size_t* recv_displs,
                        DType dtype);
  // Tags >= kFusedTagBase - 2 are reserved: the fused collectives (src/comm/fused.cpp), the
  // metadata exchange (src/comm/metadata.h, kMetadataTag = kFusedTagBase - 1) and the
  // dropless row exchanges (src/comm/row_exchange.h, kRowExchangeTag = kFusedTagBase - 2).
  RequestPtr isend(const void* buf, size_t count, DType dtype, int peer, int tag);
  RequestPtr irecv(void* buf, size_t count, DType dtype, int peer, int tag);
  RequestPtr ibarrier() { return do_ibarrier(); }
  // buf (count) of group rank `root` is copied into buf on every rank.
  RequestPtr ibroadcast(void* buf, size_t count, DType dtype, int root);

  // ---- building blocks of composite operations (the fused collectives) ----
  // isend/irecv with the same watchdog, but counted nowhere: a composite operation made of
  // them records its own totals with record(), exactly as its constituent collectives would,
  // so the counters never show send/recv traffic that the unfused path does not have.
  RequestPtr isend_uncounted(const void* buf, size_t count, DType dtype, int peer, int tag);
  RequestPtr irecv_uncounted(void* buf, size_t count, DType dtype, int peer, int tag);
  // Adds one call of `op` to this group's counters: `bus_bytes` as parm::bus_bytes defines
  // them for that op, `time_us` of wall time.
  void record(CommOp op, double bus_bytes, double time_us) {
    OpStats& s = stats().op(op);
    s.calls += 1;
    s.bus_bytes += bus_bytes;
    s.time_us += time_us;
  }

  // ---- blocking: the non-blocking call, then wait() ----
  void allreduce(void* buf, size_t count, DType dtype, ReduceOp op = ReduceOp::kSum) {
    iallreduce(buf, count, dtype, op)->wait();
  }
  void allgather(const void* send, void* recv, size_t count, DType dtype) {
    iallgather(send, recv, count, dtype)->wait();
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype) {
    ireduce_scatter(send, recv, count, dtype)->wait();
  }
  void alltoall(const void* send, void* recv, size_t count, DType dtype) {
    ialltoall(send, recv, count, dtype)->wait();
  }
  void alltoallv(const void* send, const size_t* send_counts, const size_t* send_displs,
                 void* recv, const size_t* recv_counts, const size_t* recv_displs, DType dtype) {
    ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype)->wait();
  }
  void send(const void* buf, size_t count, DType dtype, int peer, int tag) {
    isend(buf, count, dtype, peer, tag)->wait();
  }
  void recv(void* buf, size_t count, DType dtype, int peer, int tag) {
    irecv(buf, count, dtype, peer, tag)->wait();
  }
  void barrier() { ibarrier()->wait(); }
  void broadcast(void* buf, size_t count, DType dtype, int root) {
    ibroadcast(buf, count, dtype, root)->wait();
  }

  // Typed conveniences.
  template <typename T> void allreduce(T* buf, size_t count, ReduceOp op = ReduceOp::kSum) {
    allreduce(buf, count, dtype_of<T>(), op);
  }
  template <typename T> void allgather(const T* send, T* recv, size_t count) {
    allgather(send, recv, count, dtype_of<T>());
  }
  template <typename T> void reduce_scatter(const T* send, T* recv, size_t count) {
    reduce_scatter(send, recv, count, dtype_of<T>());
  }
  template <typename T> void alltoall(const T* send, T* recv, size_t count) {
    alltoall(send, recv, count, dtype_of<T>());
  }

 protected:
  // The backend's operations, called after the buffers were checked; semantics as above
  // (`counted` false: the uncounted variant). Declared here once, for every backend.
#define PARM_COMMUNICATOR_OPS(QUALIFIERS)                                                    \
  virtual RequestPtr do_iallreduce(void* buf, size_t count, DType dtype, ReduceOp op)       \
      QUALIFIERS;                                                                            \
  virtual RequestPtr do_iallgather(const void* send, void* recv, size_t count, DType dtype) \
      QUALIFIERS;                                                                            \
  virtual RequestPtr do_ireduce_scatter(const void* send, void* recv, size_t count,         \
                                        DType dtype) QUALIFIERS;                             \
  virtual RequestPtr do_ialltoall(const void* send, void* recv, size_t count, DType dtype)  \
      QUALIFIERS;                                                                            \
  virtual RequestPtr do_ialltoallv(const void* send, const size_t* send_counts,             \
                                   const size_t* send_displs, void* recv,                   \
                                   const size_t* recv_counts, const size_t* recv_displs,    \
                                   DType dtype) QUALIFIERS;                                  \
  virtual RequestPtr do_isend(const void* buf, size_t count, DType dtype, int peer, int tag, \
                              bool counted) QUALIFIERS;                                      \
  virtual RequestPtr do_irecv(void* buf, size_t count, DType dtype, int peer, int tag,      \
                              bool counted) QUALIFIERS;                                      \
  virtual RequestPtr do_ibarrier() QUALIFIERS;                                               \
  virtual RequestPtr do_ibroadcast(void* buf, size_t count, DType dtype, int root)          \
      QUALIFIERS;                                                                            \
  /* The fused collectives of src/comm/fused.h, run by this backend's implementation: the */ \
  /* dispatch with this as the ep group, the combine with this as the esp group. The other */\
  /* groups must be of the same backend (a mixed pair is refused with parm::Error). */       \
  virtual void run_fused_dispatch(Communicator& esp, const float* in, float* out,           \
                                  size_t block, int chunks) QUALIFIERS;                      \
  virtual void run_fused_combine(Communicator& ep, const float* in, float* out, size_t block,\
                                 int chunks, const MpGatherPart* mp_part) QUALIFIERS;
  PARM_COMMUNICATOR_OPS(= 0)

  // They check the buffers, then call run_fused_dispatch / run_fused_combine.
  friend void fused_dispatch_any(Communicator& ep, Communicator& esp, const float* in,
                                 float* out, size_t block, int chunks);
  friend void fused_combine_any(Communicator& esp, Communicator& ep, const float* in,
                                float* out, size_t block, int chunks,
                                const MpGatherPart* mp_part);
};

// The element-wise max of per-rank values over the ranks of `c` (for timings, the world
// group's host communicator: the slowest rank sets the pace of a collective step). An
// allreduce on `c`, counted and bounded like any other.
std::vector<double> max_over_ranks(Communicator& c, std::vector<double> values);

}  // namespace parm
