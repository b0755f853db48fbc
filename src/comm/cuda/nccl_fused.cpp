// The fused collectives of docs/spec.md §4 over NCCL: the pipeline described in
// src/comm/fused_plan.h (the one src/comm/fused.cpp runs in host steps), with each stage on
// the CUDA stream of its communicator.
//
// Pieces: as fused.cpp, piece c of `chunks` is the same contiguous range [lo, lo + len) of
// every block (the first block % chunks pieces one element longer; pieces may be empty).
//
// Stages: those of the plan, each on its communicator's side stream. Stage j of piece c
// waits (cudaStreamWaitEvent) for stage j-1 of piece c; nothing else orders them, so stage
// j-1 moves piece c+1 while stage j moves piece c. The order of every record and wait on
// the streams is fused_plan::for_each_stream_op: one `done` event per stage re-recorded
// after each piece, timing events around the first and last piece, and the compute stream
// joining each stage on its `done`, the last record on that stage's stream, so the timing
// events have completed once the join has (reading them never waits).
//
// The combine's MP stage: each EP block's piece range travels whole to every MP peer (into
// a staging buffer at the same offsets), then one kernel interleaves it into `full`.
//
// KeepSizeOneStages (test-only, fused_plan.h): the stages of groups of one rank run too,
// and own blocks travel as NCCL send/recv to self inside the stage's group (the dispatch's
// EP AllToAll then delivers into a staging row; the ESP sum and the MP interleave read every
// block, their own included, from what was exchanged). Same results, same counters.
//
// Issue order: every rank issues the same NCCL groups in the same order (the same loop), so
// two communicators' operations in flight on two streams cannot deadlock on a rank order.
//
// Bit-identity: elements are only moved, except in the ESP sum, which adds blocks 0, 1, ...
// in ESP-rank order (nccl_kernels.h), as NcclCommunicator::ireduce_scatter and
// MpiCommunicator::ireduce_scatter do.
//
// Counters: as fused.cpp (fused_plan::record); a part's time is the GPU time from its first
// piece starting to its last piece ending (timing events on its stream).
//
// Steady state: the events and the staging buffers live in a per-thread workspace kept
// between calls (device buffers only grow), and the pipeline calls the caller's post lambda
// directly, so a call allocates nothing once warmed up.
#include <sched.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <initializer_list>

#include "comm/cuda/nccl_communicator.h"
#include "comm/cuda/nccl_kernels.h"
#include "comm/fused_plan.h"
#include "kernels/cuda/runtime.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

using fused_detail::Piece;
using fused_detail::piece_of;
using fused_plan::kMaxStages;
using fused_plan::kNumRoles;
using fused_plan::Role;
using fused_plan::StreamOp;
using fused_plan::StreamOpKind;
using fused_plan::Work;

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
  GrowOnlyDeviceBuffer delivered;  // fused dispatch's alltoall output with self messages

  void abandon_buffers() {
    theirs.abandon();
    reduced.abandon();
    mp_stage.abandon();
    delivered.abandon();
  }
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

// The communicator of each active stage of `plan` (comms by Role).
using StageComms = std::array<NcclCommunicator*, kMaxStages>;
StageComms stage_comms(const fused_plan::Plan& plan,
                       const std::array<NcclCommunicator*, kNumRoles>& comms) {
  StageComms out{};
  for (int j = 0; j < plan.num_stages; ++j) {
    NcclCommunicator* c = comms[static_cast<size_t>(plan.stage(j).group)];
    PARM_CHECK(c != nullptr, "fused {}: stage {} has no NCCL communicator", plan.desc->name,
               plan.stage(j).name);
    out[static_cast<size_t>(j)] = c;
  }
  return out;
}

// Waits for the finish event with the watchdog of every communicator involved.
void wait_finish(const StageComms& comms, int num_stages, Workspace& ws, const char* op,
                 double bytes, double t0_us) {
  double timeout_s = 0.0;
  for (int j = 0; j < num_stages; ++j)
    timeout_s = std::max(timeout_s, comms[static_cast<size_t>(j)]->timeout_s());
  const double deadline_us = t0_us + timeout_s * 1e6;
  for (int spins = 0;; ++spins) {
    const cudaError_t status = cudaEventQuery(ws.finish);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();
      throw CommError(fmt::format("{}: {} of {} bytes: CUDA error while waiting: {} ({})",
                                  comms[0]->where(), op, static_cast<int64_t>(bytes),
                                  cudaGetErrorName(status), cudaGetErrorString(status)));
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    if (spins > 64) sched_yield();
    if ((spins & 255) == 0)
      for (int j = 0; j < num_stages; ++j)
        comms[static_cast<size_t>(j)]->check_progress(op, bytes, deadline_us);
  }
}

// Issues the plan's stages on their streams in the order of fused_plan::for_each_stream_op
// (post(work, piece, stream) queues one piece of a stage), queues `copy_len` floats from
// copy_src to copy_dst on the compute stream after the join, waits, and returns each
// stage's GPU busy time. On any failure every communicator of the plan is aborted (its
// peers time out on their own) and the staging buffers are never handed out again.
template <typename Post>
std::array<double, kMaxStages> run_pipeline(
    const fused_plan::Plan& plan, const std::array<NcclCommunicator*, kNumRoles>& by_role,
    int chunks, const Post& post, const char* op, double bytes, float* copy_dst = nullptr,
    const float* copy_src = nullptr, size_t copy_len = 0) {
  Workspace& ws = workspace();
  const cudaStream_t compute = cuda::stream();
  const StageComms comms = stage_comms(plan, by_role);
  std::array<cudaStream_t, kMaxStages> streams{};
  std::array<double, kMaxStages> busy_us{};
  try {
    for (int j = 0; j < plan.num_stages; ++j)
      streams[static_cast<size_t>(j)] = comms[static_cast<size_t>(j)]->side_stream();
    const double t0_us = now_us();
    PARM_CUDA_CHECK(cudaEventRecord(ws.start, compute));
    fused_plan::for_each_stream_op(plan.num_stages, chunks, [&](const StreamOp& o) {
      const cudaStream_t stream = streams[static_cast<size_t>(o.stage)];
      StageEvents& ev = ws.stages[static_cast<size_t>(o.stage)];
      switch (o.kind) {
        case StreamOpKind::kWaitStart:
          PARM_CUDA_CHECK(cudaStreamWaitEvent(stream, ws.start, 0));
          return;
        case StreamOpKind::kWaitPrevious:
          PARM_CUDA_CHECK(
              cudaStreamWaitEvent(stream, ws.stages[static_cast<size_t>(o.stage - 1)].done, 0));
          return;
        case StreamOpKind::kRecordBegin:
          PARM_CUDA_CHECK(cudaEventRecord(ev.begin, stream));
          return;
        case StreamOpKind::kPost: post(plan.stage(o.stage).work, o.piece, stream); return;
        case StreamOpKind::kRecordEnd:
          PARM_CUDA_CHECK(cudaEventRecord(ev.end, stream));
          return;
        case StreamOpKind::kRecordDone:
          PARM_CUDA_CHECK(cudaEventRecord(ev.done, stream));
          return;
        case StreamOpKind::kJoin:
          PARM_CUDA_CHECK(cudaStreamWaitEvent(compute, ev.done, 0));
          return;
      }
    });
    if (copy_len > 0)
      PARM_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, copy_len * sizeof(float),
                                      cudaMemcpyDeviceToDevice, compute));
    PARM_CUDA_CHECK(cudaEventRecord(ws.finish, compute));
    wait_finish(comms, plan.num_stages, ws, op, bytes, t0_us);
    for (int j = 0; j < plan.num_stages; ++j) {
      const StageEvents& ev = ws.stages[static_cast<size_t>(j)];
      float ms = 0.0f;
      PARM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.begin, ev.end));
      busy_us[static_cast<size_t>(j)] = static_cast<double>(ms) * 1000.0;
    }
  } catch (...) {
    for (int j = 0; j < plan.num_stages; ++j)
      if (comms[static_cast<size_t>(j)] != nullptr) comms[static_cast<size_t>(j)]->abort();
    ws.abandon_buffers();
    throw;
  }
  return busy_us;
}

// The checks of an NCCL call beyond those of fused_detail::dispatch_call / combine_call.
void check_nccl_call(const char* op, std::initializer_list<const NcclCommunicator*> comms) {
  PARM_CHECK(!nccl_group_open(),
             "{} inside an NcclGroup: its stages wait for each other's results; call it "
             "outside the group",
             op);
  for (const NcclCommunicator* c : comms) c->check_usable(op);
}

// The EP AllToAll of one piece: block p of `send` goes to EP peer p's block of `recv`, a
// device copy for this rank's own block (with `self`, a send/recv to itself in the group).
// Both fused collectives run it.
void ep_piece(NcclCommunicator& ep, size_t block, const Piece& pc, const float* send,
              float* recv, bool self, cudaStream_t stream) {
  const int n = ep.size(), me = ep.rank();
  if (!self) {
    const size_t own = static_cast<size_t>(me) * block + pc.lo;
    PARM_CUDA_CHECK(cudaMemcpyAsync(recv + own, send + own, pc.len * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
    if (n == 1) return;
  }
  NcclGroup group;
  for (int p = 0; p < n; ++p) {
    if (p == me && !self) continue;
    const size_t off = static_cast<size_t>(p) * block + pc.lo;
    PARM_NCCL_CHECK(ncclSend(send + off, pc.len, ncclFloat32, p, ep.nccl_comm(), stream));
    PARM_NCCL_CHECK(ncclRecv(recv + off, pc.len, ncclFloat32, p, ep.nccl_comm(), stream));
  }
  group.end();
}

[[noreturn]] void throw_foreign_work(const char* op, Work work) {
  throw Error(
      fmt::format("{}: stage work {} is not this pipeline's", op, static_cast<int>(work)));
}

}  // namespace

void nccl_fused_dispatch(NcclCommunicator& ep, NcclCommunicator& esp, const float* in,
                         float* out, size_t block, int chunks) {
  const fused_detail::DispatchCall call =
      fused_detail::dispatch_call(ep, esp, in, out, block, chunks);
  check_nccl_call("fused_dispatch", {&ep, &esp});
  const int n_ep = call.n_ep, n_esp = call.n_esp, me_esp = call.me_esp;
  const size_t row = call.row;
  const fused_plan::Plan& plan = call.plan;
  const bool self = plan.self_messages;
  // Where the alltoall delivers: my slot of out, or with self messages a staging row the
  // allgather sends from, to every member.
  float* delivered = self ? workspace().delivered.get(row, cuda::stream()) : call.mine;

  const auto post = [&](Work work, int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    switch (work) {
      case Work::kEpAlltoall: ep_piece(ep, block, pc, in, delivered, self, stream); return;
      case Work::kEspAllgather: {
        NcclGroup group;
        for (int q = 0; q < n_esp; ++q) {
          if (q == me_esp && !self) continue;
          float* theirs = out + static_cast<size_t>(q) * row;
          // Several messages to one peer in a group match in issue order on both sides.
          for (int p = 0; p < n_ep; ++p) {
            const size_t off = static_cast<size_t>(p) * block + pc.lo;
            PARM_NCCL_CHECK(
                ncclSend(delivered + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
            PARM_NCCL_CHECK(
                ncclRecv(theirs + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
          }
        }
        group.end();
        return;
      }
      default: throw_foreign_work("fused_dispatch", work);
    }
  };
  const double block_bytes = static_cast<double>(block * sizeof(float));
  const auto busy_us = run_pipeline(plan, {&ep, &esp, nullptr}, chunks, post, "fused_dispatch",
                                    block_bytes * n_ep * n_esp);
  fused_plan::record(plan, {&ep, &esp, nullptr}, block, busy_us);
}

void nccl_fused_combine(NcclCommunicator& esp, NcclCommunicator& ep, const float* in,
                        float* out, size_t block, int chunks, const MpGatherPart* mp_part) {
  const fused_detail::CombineCall call =
      fused_detail::combine_call(esp, ep, in, out, block, chunks, mp_part);
  check_nccl_call("fused_combine", {&esp, &ep});
  const int n_ep = call.n_ep, n_esp = call.n_esp, me_esp = call.me_esp;
  const size_t row = call.row;  // (N_EP, block)
  const int n_mp = call.mp.n, me_mp = call.mp.me;
  const size_t mp_chunk = call.mp.chunk;
  float* full = call.mp.full;  // (outer, N_MP, chunk)
  const fused_plan::Plan& plan = call.plan;
  const bool self = plan.self_messages;
  NcclCommunicator* mp = nullptr;  // set when the MP stage runs
  if (plan.runs(Role::kMp)) {
    mp = dynamic_cast<NcclCommunicator*>(call.mp.mp);
    PARM_CHECK(mp != nullptr,
               "fused_combine over NCCL: the MP group {} must be an NCCL communicator too",
               call.mp.mp->name());
    mp->check_usable("fused_combine");
  }

  Workspace& ws = workspace();
  const cudaStream_t compute = cuda::stream();
  // The reduce_scatter: peers' partial sums of my block arrive in `theirs` (N_ESP, N_EP,
  // block; my own slot unused unless it travels to myself) and are summed into `reduced`
  // (N_EP, block). Without an ESP stage (one ESP rank) the sum of a single block is the
  // block itself, so the alltoall sends `in`.
  const bool esp_stage = plan.runs(Role::kEsp);
  float* theirs = nullptr;
  float* reduced = nullptr;
  const float* a2a_send = in;
  if (esp_stage) {
    theirs = ws.theirs.get(static_cast<size_t>(n_esp) * row, compute);
    reduced = ws.reduced.get(row, compute);
    a2a_send = reduced;
  }
  // The MP gather: outputs arrive in `mp_stage` (N_MP, N_EP, block; my slot unused unless
  // mine travels to myself).
  float* mp_stage = mp != nullptr ? ws.mp_stage.get(static_cast<size_t>(n_mp) * row, compute)
                                  : nullptr;
  auto block_of = [&](int q, int p) -> size_t {  // offset of block (q, p) of (N_ESP, N_EP, block)
    return (static_cast<size_t>(q) * static_cast<size_t>(n_ep) + static_cast<size_t>(p)) * block;
  };

  const auto post_exchange = [&](const Piece& pc, cudaStream_t stream) {
    NcclGroup group;
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp && !self) continue;
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = block_of(q, p) + pc.lo;
        PARM_NCCL_CHECK(ncclSend(in + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
        PARM_NCCL_CHECK(ncclRecv(theirs + off, pc.len, ncclFloat32, q, esp.nccl_comm(), stream));
      }
    }
    group.end();
  };
  const auto post_sum_alltoall = [&](const Piece& pc, cudaStream_t stream) {
    if (esp_stage) {
      // reduced[p][lo + i] = ((b_0 + b_1) + ...), b_q = (q == me ? in : theirs)[q][p][lo + i]
      // (every b_q from `theirs` when mine travelled to myself).
      cuda::ordered_block_sum(DType::kF32, theirs + pc.lo, row,
                              in + static_cast<size_t>(me_esp) * row + pc.lo,
                              self ? -1 : me_esp, n_esp, static_cast<size_t>(n_ep), block,
                              pc.len, reduced + pc.lo, block, stream);
    }
    ep_piece(ep, block, pc, a2a_send, out, self, stream);
  };
  // out seen as (outer, chunk) goes to full (outer, N_MP, chunk): element f of MP rank q's
  // out lands at full[f / chunk][q][f % chunk]. Each EP block's piece range travels whole to
  // every MP peer (into mp_stage at the same offsets), then one kernel interleaves it.
  const auto post_mp_gather = [&](const Piece& pc, cudaStream_t stream) {
    NcclGroup group;
    for (int q = 0; q < n_mp; ++q) {
      if (q == me_mp && !self) continue;
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = static_cast<size_t>(p) * block + pc.lo;
        PARM_NCCL_CHECK(ncclSend(out + off, pc.len, ncclFloat32, q, mp->nccl_comm(), stream));
        PARM_NCCL_CHECK(ncclRecv(mp_stage + static_cast<size_t>(q) * row + off, pc.len,
                                 ncclFloat32, q, mp->nccl_comm(), stream));
      }
    }
    group.end();
    cuda::mp_interleave(mp_stage, row, out, self ? -1 : me_mp, n_mp,
                        static_cast<size_t>(n_ep), block, pc.lo, pc.len, mp_chunk, full,
                        stream);
  };
  const auto post = [&](Work work, int c, cudaStream_t stream) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    switch (work) {
      case Work::kEspExchange: post_exchange(pc, stream); return;
      case Work::kEspSumEpAlltoall: post_sum_alltoall(pc, stream); return;
      case Work::kMpGather: post_mp_gather(pc, stream); return;
      default: throw_foreign_work("fused_combine", work);
    }
  };
  // An MP group of one without its stage: full (outer, 1, chunk) is out itself, copied after
  // the stages joined.
  const bool copy_full = mp_part != nullptr && mp == nullptr && full != out;
  const double block_bytes = static_cast<double>(block * sizeof(float));
  const auto busy_us =
      run_pipeline(plan, {&ep, &esp, mp}, chunks, post, "fused_combine",
                   block_bytes * n_ep * n_esp, copy_full ? full : nullptr, out,
                   copy_full ? row : 0);
  fused_plan::record(plan, {&ep, &esp, mp}, block, busy_us);
}

}  // namespace parm
