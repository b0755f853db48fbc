// The fused collectives of SPEC §4 over NCCL: the pipeline of src/comm/fused.cpp, with each
// stage on the CUDA stream of its communicator instead of host-side steps.
//
// Pieces: as fused.cpp, piece c of `chunks` is the same contiguous range [lo, lo + len) of
// every block (the first block % chunks pieces one element longer; pieces may be empty).
//
// Stages (a part on a group of one rank is dropped, except the ep stage, which is then the
// local copy):
//   dispatch  stage 0: ep alltoall of piece c                              (ep's stream)
//             stage 1: esp allgather of piece c                            (esp's stream)
//   combine   stage 0: esp exchange of piece c (the reduce_scatter inputs) (esp's stream)
//             stage 1: esp sum (kernel, ESP-rank order) + ep alltoall of c (ep's stream)
//             stage 2: mp exchange of piece c + interleave kernel          (mp's stream)
// Stage j of piece c waits (cudaStreamWaitEvent) for stage j-1 of piece c; nothing else
// orders them, so stage j-1 moves piece c+1 while stage j moves piece c. Each stage records
// one `done` event per piece, re-recorded for the next piece: in every host step the later
// stages are issued first, so a stage's wait always names the record of the piece it needs
// (a wait binds to the record current at the time of the call).
//
// Issue order: every rank issues the same NCCL groups in the same order (the same loop), so
// two communicators' operations in flight on two streams cannot deadlock on a rank order.
//
// Bit-identity: elements are only moved, except in the ESP sum, which adds blocks 0, 1, ...
// in ESP-rank order (nccl_kernels.h), as NcclCommunicator::ireduce_scatter and
// MpiCommunicator::ireduce_scatter do.
//
// Counters: as fused.cpp, one call per part on a group of more than one rank, with the bus
// bytes of its collective; its time is the GPU time from its first piece starting to its
// last piece ending (timing events on its stream).
//
// Steady state: the events and the combine's staging buffers live in a per-thread workspace
// kept between calls (device buffers only grow), and the stages are std::functions over
// std::cref of the caller's lambdas, so a call allocates nothing once warmed up.
#include <sched.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>

#include "comm/cuda/nccl_communicator.h"
#include "comm/cuda/nccl_kernels.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

constexpr int kMaxStages = 3;

using fused_detail::Piece;
using fused_detail::piece_of;

// Device floats that only grow (allocated in stream order on the compute stream).
class GrowOnlyDeviceBuffer {
 public:
  float* get(size_t n, cudaStream_t stream) {
    if (n > capacity_) {
      if (data_ != nullptr) PARM_CUDA_CHECK(cudaFreeAsync(data_, stream));
      data_ = nullptr;
      capacity_ = 0;
      void* p = nullptr;
      PARM_CUDA_CHECK(cudaMallocAsync(&p, n * sizeof(float), stream));
      data_ = static_cast<float*>(p);
      capacity_ = n;
    }
    return data_;
  }
  // Forgets the storage without freeing it (a failed operation may still write into it).
  void abandon() {
    data_ = nullptr;
    capacity_ = 0;
  }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

struct StageEvents {
  cudaEvent_t done = nullptr;   // after the stage's latest piece (no timing)
  cudaEvent_t begin = nullptr;  // before its first piece (timing)
  cudaEvent_t end = nullptr;    // after its last piece (timing)
};

// What the fused collectives keep between calls on one thread. Never destroyed: it holds
// CUDA resources that outlive nothing useful at exit.
struct Workspace {
  bool ready = false;
  cudaEvent_t start = nullptr;   // the compute stream's work before the call
  cudaEvent_t finish = nullptr;  // the compute stream after joining every stage
  std::array<StageEvents, kMaxStages> stages;
  GrowOnlyDeviceBuffer theirs, reduced, mp_stage;  // fused combine's staging
};

Workspace& workspace() {
  static thread_local Workspace* ws = new Workspace;  // intentionally never freed
  if (!ws->ready) {
    PARM_CUDA_CHECK(cudaEventCreateWithFlags(&ws->start, cudaEventDisableTiming));
    PARM_CUDA_CHECK(cudaEventCreateWithFlags(&ws->finish, cudaEventDisableTiming));
    for (StageEvents& s : ws->stages) {
      PARM_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      PARM_CUDA_CHECK(cudaEventCreate(&s.begin));
      PARM_CUDA_CHECK(cudaEventCreate(&s.end));
    }
    ws->ready = true;
  }
  return *ws;
}

using PostFn = std::function<void(int piece, cudaStream_t stream)>;

struct Stage {
  NcclCommunicator* comm = nullptr;
  cudaStream_t stream = nullptr;
  PostFn post;  // std::cref of the caller's lambda
  double busy_us = 0.0;
};

struct Pipeline {
  std::array<Stage, kMaxStages> stages;
  int num_stages = 0;
  // Queued on the compute stream after the stages joined, before the call completes.
  float* copy_dst = nullptr;
  const float* copy_src = nullptr;
  size_t copy_len = 0;

  // Appends a stage of `comm` running `post`, which must outlive the pipeline.
  template <typename Post> int add(NcclCommunicator& comm, const Post& post) {
    PARM_CHECK(num_stages < kMaxStages, "fused pipeline: too many stages");
    Stage& s = stages[static_cast<size_t>(num_stages)];
    s.comm = &comm;
    s.stream = comm.side_stream();
    s.post = std::cref(post);
    return num_stages++;
  }
  template <typename Post> int add(NcclCommunicator& comm, const Post&& post) = delete;
  double busy_us(int stage) const { return stages[static_cast<size_t>(stage)].busy_us; }
};

// Every communicator of the pipeline is aborted (its peers will time out on their own) and
// the staging buffers are never handed out again.
void fail_pipeline(Pipeline& p, Workspace& ws) {
  for (int j = 0; j < p.num_stages; ++j) p.stages[static_cast<size_t>(j)].comm->abort();
  ws.theirs.abandon();
  ws.reduced.abandon();
  ws.mp_stage.abandon();
}

// Waits for the finish event with the watchdog of every communicator involved.
void wait_finish(Pipeline& p, Workspace& ws, const char* op, double bytes, double t0_us) {
  double timeout_s = 0.0;
  for (int j = 0; j < p.num_stages; ++j)
    timeout_s = std::max(timeout_s, p.stages[static_cast<size_t>(j)].comm->timeout_s());
  const double deadline_us = t0_us + timeout_s * 1e6;
  for (int spins = 0;; ++spins) {
    const cudaError_t status = cudaEventQuery(ws.finish);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();
      NcclCommunicator& c = *p.stages[0].comm;
      throw CommError(fmt::format("{}: {} of {} bytes: CUDA error while waiting: {} ({})",
                                  c.where(), op, static_cast<int64_t>(bytes),
                                  cudaGetErrorName(status), cudaGetErrorString(status)));
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    if (spins > 64) sched_yield();
    if ((spins & 255) == 0)
      for (int j = 0; j < p.num_stages; ++j)
        p.stages[static_cast<size_t>(j)].comm->check_progress(op, bytes, deadline_us);
  }
}

// Issues chunks + num_stages - 1 host steps (step s: stage j gets piece s - j, the later
// stages first), joins the stages back into the compute stream, and waits.
void run_pipeline(Pipeline& p, int chunks, const char* op, double bytes) {
  Workspace& ws = workspace();
  const cudaStream_t compute = cuda::stream();
  try {
    const double t0_us = now_us();
    PARM_CUDA_CHECK(cudaEventRecord(ws.start, compute));
    for (int j = 0; j < p.num_stages; ++j)
      PARM_CUDA_CHECK(cudaStreamWaitEvent(p.stages[static_cast<size_t>(j)].stream, ws.start, 0));
    for (int s = 0; s < chunks + p.num_stages - 1; ++s) {
      for (int j = p.num_stages - 1; j >= 0; --j) {
        const int c = s - j;
        if (c < 0 || c >= chunks) continue;
        Stage& st = p.stages[static_cast<size_t>(j)];
        StageEvents& ev = ws.stages[static_cast<size_t>(j)];
        // Stage j-1 recorded piece c at step s-1 and has not been issued yet in step s.
        if (j > 0)
          PARM_CUDA_CHECK(
              cudaStreamWaitEvent(st.stream, ws.stages[static_cast<size_t>(j - 1)].done, 0));
        if (c == 0) PARM_CUDA_CHECK(cudaEventRecord(ev.begin, st.stream));
        st.post(c, st.stream);
        PARM_CUDA_CHECK(cudaEventRecord(ev.done, st.stream));
        if (c == chunks - 1) PARM_CUDA_CHECK(cudaEventRecord(ev.end, st.stream));
      }
    }
    for (int j = 0; j < p.num_stages; ++j)
      PARM_CUDA_CHECK(cudaStreamWaitEvent(compute, ws.stages[static_cast<size_t>(j)].done, 0));
    if (p.copy_len > 0)
      PARM_CUDA_CHECK(cudaMemcpyAsync(p.copy_dst, p.copy_src, p.copy_len * sizeof(float),
                                      cudaMemcpyDeviceToDevice, compute));
    PARM_CUDA_CHECK(cudaEventRecord(ws.finish, compute));
    wait_finish(p, ws, op, bytes, t0_us);
    for (int j = 0; j < p.num_stages; ++j) {
      const StageEvents& ev = ws.stages[static_cast<size_t>(j)];
      float ms = 0.0f;
      PARM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.begin, ev.end));
      p.stages[static_cast<size_t>(j)].busy_us = static_cast<double>(ms) * 1000.0;
    }
  } catch (...) {
    fail_pipeline(p, ws);
    throw;
  }
}

void check_call(const char* op, size_t block, int chunks,
                std::initializer_list<const NcclCommunicator*> comms) {
  PARM_CONFIG_CHECK(chunks >= 1,
                    "{}: chunks = {} (block of {} elements); the number of pipeline pieces "
                    "must be at least 1 (1 = no pipelining)",
                    op, chunks, block);
  PARM_CHECK(!nccl_group_open(),
             "{} inside an NcclGroup: its stages wait for each other's results; call it "
             "outside the group",
             op);
  for (const NcclCommunicator* c : comms) c->check_usable(op);
}

// The EP AllToAll of one piece: block p of `send` goes to EP peer p's block of `recv`, a
// device copy for this rank's own block. Both fused collectives run it.
void ep_piece(NcclCommunicator& ep, size_t block, const Piece& pc, const float* send,
              float* recv, cudaStream_t stream) {
  const int n = ep.size(), me = ep.rank();
  const size_t own = static_cast<size_t>(me) * block + pc.lo;
  PARM_CUDA_CHECK(cudaMemcpyAsync(recv + own, send + own, pc.len * sizeof(float),
                                  cudaMemcpyDeviceToDevice, stream));
  if (n == 1) return;
  NcclGroup group;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const size_t off = static_cast<size_t>(p) * block + pc.lo;
    PARM_NCCL_CHECK(ncclSend(send + off, pc.len, ncclFloat32, p, ep.nccl_comm(), stream));
    PARM_NCCL_CHECK(ncclRecv(recv + off, pc.len, ncclFloat32, p, ep.nccl_comm(), stream));
  }
  group.end();
}

}  // namespace

void nccl_fused_dispatch(NcclCommunicator& ep, NcclCommunicator& esp, const float* in,
                         float* out, size_t block, int chunks) {
  check_call("fused_dispatch", block, chunks, {&ep, &esp});
  const int n_ep = ep.size();
  const int n_esp = esp.size(), me_esp = esp.rank();
  const size_t row = static_cast<size_t>(n_ep) * block;  // one ESP rank's (N_EP, block)
  PARM_CHECK(!fused_detail::overlap(in, row, out, static_cast<size_t>(n_esp) * row),
             "fused_dispatch: in and out overlap (block {})", block);
  // (N_EP, block): where the alltoall delivers, this rank's slot of the allgather output.
  float* mine = out + static_cast<size_t>(me_esp) * row;

  const auto post_alltoall = [&](int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    ep_piece(ep, block, pc, in, mine, stream);
  };
  const auto post_allgather = [&](int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    NcclGroup group;
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp) continue;
      float* theirs = out + static_cast<size_t>(q) * row;
      // Several messages to one peer in a group match in issue order on both sides.
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = static_cast<size_t>(p) * block + pc.lo;
        PARM_NCCL_CHECK(ncclSend(mine + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
        PARM_NCCL_CHECK(ncclRecv(theirs + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
      }
    }
    group.end();
  };
  Pipeline pipeline;
  const int a2a_stage = pipeline.add(ep, post_alltoall);
  const int gather_stage = n_esp > 1 ? pipeline.add(esp, post_allgather) : -1;
  const double block_bytes = static_cast<double>(block * sizeof(float));
  run_pipeline(pipeline, chunks, "fused_dispatch", block_bytes * n_ep * n_esp);

  if (n_ep > 1)
    ep.record(CommOp::kAllToAll, bus_bytes(CommOp::kAllToAll, n_ep, block_bytes),
              pipeline.busy_us(a2a_stage));
  if (n_esp > 1)
    esp.record(CommOp::kAllGather, bus_bytes(CommOp::kAllGather, n_esp, n_ep * block_bytes),
               pipeline.busy_us(gather_stage));
}

void nccl_fused_combine(NcclCommunicator& esp, NcclCommunicator& ep, const float* in,
                        float* out, size_t block, int chunks, const MpGatherPart* mp_part) {
  check_call("fused_combine", block, chunks, {&esp, &ep});
  const int n_ep = ep.size();
  const int n_esp = esp.size(), me_esp = esp.rank();
  const size_t row = static_cast<size_t>(n_ep) * block;  // (N_EP, block)
  PARM_CHECK(!fused_detail::overlap(in, static_cast<size_t>(n_esp) * row, out, row),
             "fused_combine: in and out overlap (block {})", block);

  const fused_detail::MpGather g =
      fused_detail::check_mp_part(mp_part, in, n_esp, out, row, block);
  NcclCommunicator* mp = nullptr;  // set when the MP part moves data (N_MP > 1)
  const int n_mp = g.n, me_mp = g.me;
  const size_t mp_chunk = g.chunk;
  float* full = g.full;  // (outer, N_MP, chunk)
  if (n_mp > 1) {
    mp = dynamic_cast<NcclCommunicator*>(g.mp);
    PARM_CHECK(mp != nullptr,
               "fused_combine over NCCL: the MP group {} must be an NCCL communicator too",
               g.mp->name());
    mp->check_usable("fused_combine");
  }

  Workspace& ws = workspace();
  const cudaStream_t compute = cuda::stream();
  // The reduce_scatter: peers' partial sums of my block arrive in `theirs` (N_ESP, N_EP,
  // block; my own slot unused) and are summed with my own into `reduced` (N_EP, block). On
  // one ESP rank the sum of a single block is the block itself, so the alltoall sends `in`.
  float* theirs = nullptr;
  float* reduced = nullptr;
  const float* a2a_send = in;
  if (n_esp > 1) {
    theirs = ws.theirs.get(static_cast<size_t>(n_esp) * row, compute);
    reduced = ws.reduced.get(row, compute);
    a2a_send = reduced;
  }
  // The MP gather: peers' outputs arrive in `mp_stage` (N_MP, N_EP, block; my slot unused).
  float* mp_stage = mp != nullptr ? ws.mp_stage.get(static_cast<size_t>(n_mp) * row, compute)
                                  : nullptr;
  auto block_of = [&](int q, int p) -> size_t {  // offset of block (q, p) of (N_ESP, N_EP, block)
    return (static_cast<size_t>(q) * static_cast<size_t>(n_ep) + static_cast<size_t>(p)) * block;
  };

  const auto post_exchange = [&](int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    NcclGroup group;
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp) continue;
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = block_of(q, p) + pc.lo;
        PARM_NCCL_CHECK(ncclSend(in + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
        PARM_NCCL_CHECK(ncclRecv(theirs + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
      }
    }
    group.end();
  };
  const auto post_sum_alltoall = [&](int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    if (n_esp > 1) {
      // reduced[p][lo + i] = ((b_0 + b_1) + ...) with b_q = (q == me ? in : theirs)[q][p][lo + i].
      cuda::ordered_block_sum(DType::kF32, theirs + pc.lo, row,
                              in + static_cast<size_t>(me_esp) * row + pc.lo, me_esp, n_esp,
                              static_cast<size_t>(n_ep), block, pc.len, reduced + pc.lo, block,
                              stream);
    }
    ep_piece(ep, block, pc, a2a_send, out, stream);
  };
  // out seen as (outer, chunk) goes to full (outer, N_MP, chunk): element f of MP rank q's
  // out lands at full[f / chunk][q][f % chunk]. Each EP block's piece range travels whole to
  // every MP peer (into mp_stage at the same offsets), then one kernel interleaves it.
  const auto post_mp_gather = [&](int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    NcclGroup group;
    for (int q = 0; q < n_mp; ++q) {
      if (q == me_mp) continue;
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = static_cast<size_t>(p) * block + pc.lo;
        PARM_NCCL_CHECK(ncclSend(out + off, pc.len, ncclFloat32, q, mp->nccl_comm(), stream));
        PARM_NCCL_CHECK(ncclRecv(mp_stage + static_cast<size_t>(q) * row + off, pc.len,
                                 ncclFloat32, q, mp->nccl_comm(), stream));
      }
    }
    group.end();
    cuda::mp_interleave(mp_stage, row, out, me_mp, n_mp, static_cast<size_t>(n_ep), block,
                        pc.lo, pc.len, mp_chunk, full, stream);
  };
  Pipeline pipeline;
  const int exchange_stage = n_esp > 1 ? pipeline.add(esp, post_exchange) : -1;
  const int a2a_stage = pipeline.add(ep, post_sum_alltoall);
  const int gather_stage = mp != nullptr ? pipeline.add(*mp, post_mp_gather) : -1;
  // An MP group of one: full (outer, 1, chunk) is out itself.
  if (mp_part != nullptr && n_mp == 1 && full != out) {
    pipeline.copy_dst = full;
    pipeline.copy_src = out;
    pipeline.copy_len = row;
  }
  const double block_bytes = static_cast<double>(block * sizeof(float));
  run_pipeline(pipeline, chunks, "fused_combine", block_bytes * n_ep * n_esp);

  if (n_esp > 1)
    esp.record(CommOp::kReduceScatter,
               bus_bytes(CommOp::kReduceScatter, n_esp, n_ep * block_bytes),
               pipeline.busy_us(exchange_stage));
  if (n_ep > 1)
    ep.record(CommOp::kAllToAll, bus_bytes(CommOp::kAllToAll, n_ep, block_bytes),
              pipeline.busy_us(a2a_stage));
  if (mp != nullptr)
    mp->record(CommOp::kAllGather, bus_bytes(CommOp::kAllGather, n_mp, row * sizeof(float)),
               pipeline.busy_us(gather_stage));
}

}  // namespace parm
