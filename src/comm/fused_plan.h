// The one description of each fused collective's pipeline (docs/spec.md §4): its stages in order,
// each stage's group, the link it is meant to keep busy, the work it does for one piece and
// the constituent collective it records. Three readers: the host lock-step pipeline over
// MPI (fused.cpp), the CUDA streams/events pipeline over NCCL (cuda/nccl_fused.cpp) and the
// cost model (perfmodel/model.cpp), which prices the stages in this order.
//
// Pipelines (N_EP, N_ESP, N_MP: group sizes; block: elements one EP rank sends to one peer;
// row = N_EP * block). Stage: group, work per piece, link class, recorded collective (count):
//   dispatch    0: ep   alltoall of the piece                inter  ep alltoall (block)
//               1: esp  allgather of the piece               intra  esp allgather (row)
//   combine     0: esp  exchange of the reduce_scatter input intra  esp reduce_scatter (row)
//               1: ep   esp sum (rank order) + ep alltoall   inter  ep alltoall (block)
//   combine+mp  0, 1 as combine, then
//               2: mp   gather of the piece, interleaved     intra  mp allgather (row)
// Each order is forced by the data flow (a piece is exchanged before it is summed, summed
// before it crosses EP, crossed before MP gathers it); neighbouring stages sit on different
// link classes, so both kinds of link are busy at once.
//
// Steps: with K stages and W = chunks pieces, step s (0 <= s < W + K - 1) runs piece s - j
// on stage j where 0 <= s - j < W (num_steps, piece_at).
//
// Dropped stages: a stage on a group of one rank moves nothing and is dropped, except the
// one that carries the EP AllToAll (on one EP rank it is the local copy). The test-only
// KeepSizeOneStages keeps every stage and sends each rank's own blocks to itself as messages
// (self send/recv), so the whole multi-stage path runs on a single rank or GPU.
//
// Counters: each stage on a group of more than one rank records one call of its constituent
// collective with that collective's bus bytes, whether or not the stage was kept (record).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "parm/comm.h"
#include "parm/timer.h"

namespace parm::fused_plan {

// W, the pieces a fused collective is pipelined over, where the caller names none (layer,
// training config, CLI flags, calibration, simulation grids).
constexpr int kDefaultChunks = 4;

enum class Pipeline : uint8_t { kDispatch, kCombine, kCombineMp };
// Which communicator of the call a stage runs on; the value is also the tag part of the host
// pipeline's messages.
enum class Role : uint8_t { kEp = 0, kEsp = 1, kMp = 2 };
constexpr int kNumRoles = 3;
constexpr int kMaxStages = 3;

enum class LinkClass : uint8_t { kIntraNode, kInterNode };

// What a stage does for one piece [lo, lo + len) of every block.
enum class Work : uint8_t {
  kEpAlltoall,        // block p of the piece to EP peer p (own block: local copy)
  kEspAllgather,      // this rank's (N_EP, piece) to every ESP peer
  kEspExchange,       // block (q, p) of the piece to ESP peer q (the reduce_scatter inputs)
  kEspSumEpAlltoall,  // sum of the ESP blocks in ESP-rank order, then kEpAlltoall of it
  kMpGather,          // the combine output's piece to every MP peer, interleaved into full
};

// The per-rank count of the recorded collective: `block` or `row` elements.
enum class Count : uint8_t { kBlock, kRow };

struct Stage {
  Role group;
  Work work;
  LinkClass link;
  CommOp records;
  Count count;
  const char* name;  // "ep alltoall", ...
};

// A stage on a group of one rank moves nothing and is dropped, except the one on EP: it
// carries the EP AllToAll, whose local copy remains.
constexpr bool kept_at_size_one(const Stage& s) { return s.group == Role::kEp; }

struct Description {
  Pipeline pipeline;
  const char* name;  // "dispatch", "combine", "combine+mp"
  std::array<Stage, kMaxStages> stages;
  int num_stages;

  // Index of the stage on `role`, or -1.
  int stage_of(Role role) const;
};
const Description& describe(Pipeline pipeline);

constexpr int num_steps(int num_stages, int chunks) { return chunks + num_stages - 1; }
// The piece stage `stage` works on in step `step`, or -1 when it is idle.
constexpr int piece_at(int step, int stage, int chunks) {
  const int c = step - stage;
  return c >= 0 && c < chunks ? c : -1;
}

// The stages one call runs: the description's, less those dropped for its group sizes.
struct Plan {
  const Description* desc = nullptr;
  std::array<int, kMaxStages> index{};  // description stage of active stage j
  int num_stages = 0;
  bool self_messages = false;  // KeepSizeOneStages: own blocks travel as messages to self

  const Stage& stage(int j) const {
    return desc->stages[static_cast<size_t>(index[static_cast<size_t>(j)])];
  }
  bool runs(Role role) const;
};
// sizes: N_EP, N_ESP, N_MP by Role (N_MP is ignored without an MP stage). The test-only
// KeepSizeOneStages of this thread decides whether size-one stages are kept.
Plan make_plan(Pipeline pipeline, const std::array<int, kNumRoles>& sizes);

// The size bus_bytes takes for stage s's recorded collective in a call of `block` elements
// per EP peer: its Count's elements (block, or row = n_ep * block) in bytes.
double stage_bytes(const Stage& s, int n_ep, size_t block);
// That collective's bus bytes on a group of group_size ranks.
double stage_bus_bytes(const Stage& s, int group_size, int n_ep, size_t block);
// Stage s unfused: its recorded collective alone on c (the stage's group), send -> recv with
// the Count's elements (alltoall: per peer; allgather: sent; reduce_scatter: received). A
// pipeline's stages run so one after the other, each reading the previous one's output, give
// the fused call's result.
void run_unfused_stage(const Stage& s, Communicator& c, const float* send, float* recv,
                       int n_ep, size_t block);

// Records the constituent collectives of a finished call: one call per stage whose group
// has more than one rank, its bus bytes from its Count (row = N_EP * block), and busy_us[j]
// of active stage j as its time. comms by Role (null where the pipeline has no such stage).
void record(const Plan& plan, const std::array<Communicator*, kNumRoles>& comms, size_t block,
            const std::array<double, kMaxStages>& busy_us);

// The host pipelines' lock-step (fused.cpp, fused_rows.cpp): step s calls
// post(work, piece, reqs) for piece s - j of each active stage j, in stage order, then waits
// for all of the step's requests (wait_all clears `reqs`, keeping its capacity). Returns each
// active stage's busy time: the wall time of the steps in which it had a piece.
template <typename Post>
std::array<double, kMaxStages> run_lock_step(const Plan& plan, int chunks,
                                             std::vector<RequestPtr>& reqs, const Post& post) {
  std::array<double, kMaxStages> busy_us{};
  for (int s = 0; s < num_steps(plan.num_stages, chunks); ++s) {
    const double t0 = now_us();
    for (int j = 0; j < plan.num_stages; ++j) {
      const int c = piece_at(s, j, chunks);
      if (c >= 0) post(plan.stage(j).work, c, reqs);
    }
    wait_all(reqs);
    const double dt = now_us() - t0;
    for (int j = 0; j < plan.num_stages; ++j)
      if (piece_at(s, j, chunks) >= 0) busy_us[static_cast<size_t>(j)] += dt;
  }
  return busy_us;
}

// ---- the CUDA executor's stream order (cuda/nccl_fused.cpp), here as data so that a CPU
// test can check it ----
//
// Each stage runs on its own stream; one `done` event per stage is re-recorded after every
// piece, and the timing events `begin` / `end` bracket its first and last piece. In a host
// step the later stages are issued first, so a stage's wait on its predecessor's `done`
// binds to the record of the piece it needs (a wait binds to the record current at the
// call). At the end the compute stream joins every stage on its `done`, which is the LAST
// record on that stream (`end` precedes it): once the join completes, so have `begin` and
// `end`, and the elapsed time between them may be read without waiting for anything else.
enum class StreamOpKind : uint8_t {
  kWaitStart,     // the stage stream waits for the compute stream's work before the call
  kWaitPrevious,  // ... for `done` of stage - 1 (piece `piece`)
  kRecordBegin,   // timing event before the stage's first piece
  kPost,          // the stage's work on piece `piece`
  kRecordEnd,     // timing event after its last piece
  kRecordDone,    // `done` after piece `piece`
  kJoin,          // the compute stream waits for the stage's `done`
};
struct StreamOp {
  StreamOpKind kind;
  int stage;
  int piece;  // -1 for kWaitStart
};

// Calls visit(StreamOp) in issue order for a pipeline of num_stages stages and chunks pieces.
template <typename Visit> void for_each_stream_op(int num_stages, int chunks, Visit&& visit) {
  for (int j = 0; j < num_stages; ++j) visit(StreamOp{StreamOpKind::kWaitStart, j, -1});
  for (int s = 0; s < num_steps(num_stages, chunks); ++s) {
    for (int j = num_stages - 1; j >= 0; --j) {
      const int c = piece_at(s, j, chunks);
      if (c < 0) continue;
      // Stage j-1 recorded piece c in step s-1 and is issued after this in step s.
      if (j > 0) visit(StreamOp{StreamOpKind::kWaitPrevious, j, c});
      if (c == 0) visit(StreamOp{StreamOpKind::kRecordBegin, j, c});
      visit(StreamOp{StreamOpKind::kPost, j, c});
      if (c == chunks - 1) visit(StreamOp{StreamOpKind::kRecordEnd, j, c});
      visit(StreamOp{StreamOpKind::kRecordDone, j, c});
    }
  }
  for (int j = 0; j < num_stages; ++j) visit(StreamOp{StreamOpKind::kJoin, j, chunks - 1});
}

// Test-only: while one is alive on this thread, the fused collectives (both executors) keep
// the stages of groups of one rank and move own blocks by send/recv to self. Results and
// counters are those of the default; only the path differs. Nests.
class KeepSizeOneStages {
 public:
  KeepSizeOneStages();
  ~KeepSizeOneStages();
  KeepSizeOneStages(const KeepSizeOneStages&) = delete;
  KeepSizeOneStages& operator=(const KeepSizeOneStages&) = delete;

 private:
  bool previous_;
};

}  // namespace parm::fused_plan
