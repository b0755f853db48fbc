// The fused collectives of docs/spec.md §4 as a software pipeline of non-blocking point-to-point
// messages on two (or three) communicators.
//
// Pieces: piece c of `chunks` is the same contiguous range [lo, lo + len) of every `block`
// (the first block % chunks pieces are one element longer; pieces may be empty).
//
// Stages (their order, groups and counters: the description in fused_plan.h): in step s,
// stage j works on piece s - j, and every request of a step is waited for before the next
// step is posted (chunks + num_stages - 1 steps). Within a step the stages are posted in
// order, so the combine's ESP sum of piece s-1 runs after piece s's ESP messages are posted
// and overlaps their transfer.
//
// KeepSizeOneStages (test-only, fused_plan.h): stages on groups of one rank run too, and a
// rank's own blocks travel as messages to itself instead of local copies; the dispatch then
// delivers its EP AllToAll into a staging row (so the ESP AllGather's message to self has a
// source other than its destination) and the combine's ESP sum reads every block, its own
// included, from the exchanged copies. Same results, same counters.
//
// Bit-identity with the unfused parts: every element is moved, never combined, except in
// the ESP sum, which starts from block 0 and adds blocks 1, 2, ... in ESP-rank order, as
// MpiCommunicator::ireduce_scatter does.
//
// Tags: kFusedTagBase + 4 * (piece % kTagPieces) + part, with part the stage's group
// (fused_plan::Role: 0 = ep, 1 = esp, 2 = mp), so no two pieces or parts share a tag (below
// MPI's guaranteed MPI_TAG_UB of 32767). Tags wrap after kTagPieces pieces; that is safe
// because steps are synchronous: no peer gets more than a step ahead of this rank on a
// communicator they both use in that step.
// Several messages of one piece between the same pair (one per EP block) share a tag and
// match in posting order (MPI's non-overtaking rule).
//
// Counters: the point-to-point messages are uncounted; at the end each part records one
// call of its collective with the bus bytes that collective records (fused_plan::record).
// Time: each part records the wall time of the steps in which it had a piece in flight
// (including its local copies and sums). With chunks = 1 these partition the fused op's
// wall time; with more chunks they overlap, which is the point, so their sum exceeds it.
//
// Steady state: nothing here allocates once a call with the same sizes has run on this
// thread. The request list and the staging buffers live in a per-thread workspace kept
// between calls, and the pipeline calls the caller's post lambda directly.
#include "comm/fused.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/fused_plan.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

using fused_detail::Piece;
using fused_detail::piece_of;
using fused_plan::Role;
using fused_plan::Work;

using fused_detail::tag_of;

using Requests = std::vector<RequestPtr>;  // one step's requests

// Posts the exchange of one contiguous range with one peer.
void post_pair(Communicator& c, int peer, const float* send, float* recv, size_t len, int tag,
               Requests& reqs) {
  reqs.push_back(c.irecv_uncounted(recv, len, DType::kF32, peer, tag));
  reqs.push_back(c.isend_uncounted(send, len, DType::kF32, peer, tag));
}

void copy(float* dst, const float* src, size_t len) {
  if (len > 0) std::memcpy(dst, src, len * sizeof(float));
}

// The EP AllToAll of one piece: block p of `send` goes to EP peer p's block of `recv` (a
// local copy for this rank's own block, or a message to itself with `self`). Both fused
// collectives run it.
void post_ep_piece(Communicator& ep, size_t block, const Piece& pc, const float* send,
                   float* recv, int tag, bool self, Requests& reqs) {
  for (int p = 0; p < ep.size(); ++p) {
    const size_t off = static_cast<size_t>(p) * block + pc.lo;
    if (p == ep.rank() && !self)
      copy(recv + off, send + off, pc.len);
    else
      post_pair(ep, p, send + off, recv + off, pc.len, tag, reqs);
  }
}

// A buffer that only grows: get(n) reuses the storage once it has held n elements.
class GrowOnlyBuffer {
 public:
  float* get(size_t n) {
    if (n > capacity_) {
      data_ = std::make_unique_for_overwrite<float[]>(n);
      capacity_ = n;
    }
    return data_.get();
  }
  // Forgets the storage without freeing it (messages may still be arriving in it).
  void abandon() {
    (void)data_.release();
    capacity_ = 0;
  }

 private:
  std::unique_ptr<float[]> data_;
  size_t capacity_ = 0;
};

// What the fused collectives keep between calls on one thread.
struct Workspace {
  Requests reqs;  // one step's requests; cleared by wait_all, capacity kept
  GrowOnlyBuffer theirs, reduced;  // fused_combine's staging
  GrowOnlyBuffer delivered;        // fused_dispatch's alltoall output with self messages
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// Runs the plan's stages in lock-step (fused_plan::run_lock_step) on this thread's request
// list. Returns each stage's busy time.
template <typename Post>
std::array<double, fused_plan::kMaxStages> run_pipeline(const fused_plan::Plan& plan, int chunks,
                                                        const Post& post) {
  Workspace& ws = workspace();
  try {
    return fused_plan::run_lock_step(plan, chunks, ws.reqs, post);
  } catch (...) {
    // A step failed (a Timeout, an MPI error): drop what it posted (each request waits, up
    // to its deadline) and never hand the staging buffers out again, since messages that
    // did not complete may still land in them. The job aborts after this anyway.
    ws.reqs.clear();
    ws.theirs.abandon();
    ws.reduced.abandon();
    ws.delivered.abandon();
    throw;
  }
}

}  // namespace

void fused_dispatch(Communicator& ep, Communicator& esp, const float* in, float* out,
                    size_t block, int chunks) {
  const fused_detail::DispatchCall call =
      fused_detail::dispatch_call(ep, esp, in, out, block, chunks);
  const int n_ep = call.n_ep, n_esp = call.n_esp, me_esp = call.me_esp;
  const size_t row = call.row;
  const fused_plan::Plan& plan = call.plan;
  const bool self = plan.self_messages;
  // Where the alltoall delivers: my slot of out, or with self messages a staging row the
  // allgather sends from, to every member.
  float* delivered = self ? workspace().delivered.get(row) : call.mine;

  const auto post = [&](Work work, int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    switch (work) {
      case Work::kEpAlltoall:
        post_ep_piece(ep, block, pc, in, delivered, tag_of(c, Role::kEp), self, reqs);
        return;
      case Work::kEspAllgather:
        for (int q = 0; q < n_esp; ++q) {
          if (q == me_esp && !self) continue;
          float* theirs = out + static_cast<size_t>(q) * row;
          for (int p = 0; p < n_ep; ++p) {
            const size_t off = static_cast<size_t>(p) * block + pc.lo;
            post_pair(esp, q, delivered + off, theirs + off, pc.len, tag_of(c, Role::kEsp),
                      reqs);
          }
        }
        return;
      default: break;
    }
    throw Error(fmt::format("fused_dispatch: stage work {} is not the dispatch's",
                            static_cast<int>(work)));
  };
  const auto busy_us = run_pipeline(plan, chunks, post);
  fused_plan::record(plan, {&ep, &esp, nullptr}, block, busy_us);
}

void fused_combine(Communicator& esp, Communicator& ep, const float* in, float* out,
                   size_t block, int chunks, const MpGatherPart* mp_part) {
  const fused_detail::CombineCall call =
      fused_detail::combine_call(esp, ep, in, out, block, chunks, mp_part);
  const int n_ep = call.n_ep, n_esp = call.n_esp, me_esp = call.me_esp;
  const size_t row = call.row;  // (N_EP, block)
  Communicator* mp = call.mp.mp;
  const int n_mp = call.mp.n, me_mp = call.mp.me;
  const size_t mp_chunk = call.mp.chunk;
  float* full = call.mp.full;  // (outer, N_MP, chunk)
  const fused_plan::Plan& plan = call.plan;
  const bool self = plan.self_messages;

  // The reduce_scatter: peers' partial sums of my block arrive in `theirs` (N_ESP, N_EP,
  // block; my own slot unused unless it travels to myself) and are summed into `reduced`
  // (N_EP, block). Without an ESP stage (one ESP rank) the sum of a single block is the
  // block itself, so the alltoall sends `in` directly. Both live in this thread's workspace,
  // reused from call to call.
  const bool esp_stage = plan.runs(Role::kEsp);
  float* theirs = nullptr;
  float* reduced = nullptr;
  const float* a2a_send = in;
  if (esp_stage) {
    theirs = workspace().theirs.get(static_cast<size_t>(n_esp) * row);
    reduced = workspace().reduced.get(row);
    a2a_send = reduced;
  }
  auto block_of = [&](int q, int p) -> size_t {  // offset of block (q, p) of (N_ESP, N_EP, block)
    return (static_cast<size_t>(q) * static_cast<size_t>(n_ep) + static_cast<size_t>(p)) * block;
  };

  const auto post_exchange = [&](const Piece& pc, int c, Requests& reqs) {
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp && !self) continue;
      for (int p = 0; p < n_ep; ++p)
        post_pair(esp, q, in + block_of(q, p) + pc.lo, theirs + block_of(q, p) + pc.lo, pc.len,
                  tag_of(c, Role::kEsp), reqs);
    }
  };
  const auto post_sum_alltoall = [&](const Piece& pc, int c, Requests& reqs) {
    if (esp_stage) {
      // ((b0 + b1) + b2) + ...: ESP-rank order, exactly as MpiCommunicator::ireduce_scatter.
      for (int p = 0; p < n_ep; ++p) {
        float* dst = reduced + static_cast<size_t>(p) * block + pc.lo;
        for (int q = 0; q < n_esp; ++q) {
          const float* src = (q == me_esp && !self ? in : theirs) + block_of(q, p) + pc.lo;
          if (q == 0) {
            copy(dst, src, pc.len);
          } else {
            for (size_t i = 0; i < pc.len; ++i) dst[i] += src[i];
          }
        }
      }
    }
    post_ep_piece(ep, block, pc, a2a_send, out, tag_of(c, Role::kEp), self, reqs);
  };
  // out seen as (outer, chunk) goes to full (outer, N_MP, chunk): element f of MP rank q's
  // out lands at full[f / chunk][q][f % chunk], as the unfused S2 gather interleaves it.
  // A piece's range of each EP block is cut where it crosses a row of `chunk`. (full == out
  // only on one MP rank, where the gather is the identity: nothing to move then.)
  const auto post_mp_gather = [&](const Piece& pc, int c, Requests& reqs) {
    for (int p = 0; p < n_ep; ++p) {
      const size_t end = static_cast<size_t>(p) * block + pc.lo + pc.len;
      for (size_t x = static_cast<size_t>(p) * block + pc.lo; x < end;) {
        const size_t o = x / mp_chunk;
        const size_t y = std::min(end, (o + 1) * mp_chunk);
        for (int q = 0; q < n_mp; ++q) {
          float* dst = full + (o * static_cast<size_t>(n_mp) + static_cast<size_t>(q)) *
                                  mp_chunk + (x - o * mp_chunk);
          if (q != me_mp || (self && full != out))
            post_pair(*mp, q, out + x, dst, y - x, tag_of(c, Role::kMp), reqs);
          else if (full != out)
            copy(dst, out + x, y - x);
        }
        x = y;
      }
    }
  };
  const auto post = [&](Work work, int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    switch (work) {
      case Work::kEspExchange: post_exchange(pc, c, reqs); return;
      case Work::kEspSumEpAlltoall: post_sum_alltoall(pc, c, reqs); return;
      case Work::kMpGather: post_mp_gather(pc, c, reqs); return;
      default: break;
    }
    throw Error(fmt::format("fused_combine: stage work {} is not the combine's",
                            static_cast<int>(work)));
  };
  const auto busy_us = run_pipeline(plan, chunks, post);
  // An MP group of one without its stage: full (outer, 1, chunk) is out itself.
  if (mp != nullptr && !plan.runs(Role::kMp) && full != out) copy(full, out, row);
  fused_plan::record(plan, {&ep, &esp, mp}, block, busy_us);
}

namespace fused_detail {

namespace {
constexpr int kTagPieces = 4096;
static_assert(kFusedTagBase + 4 * (kTagPieces - 1) + static_cast<int>(Role::kMp) <= 32767,
              "fused tags must stay below the MPI_TAG_UB every MPI guarantees");
}  // namespace

int tag_of(int piece, fused_plan::Role part) {
  return kFusedTagBase + 4 * (piece % kTagPieces) + static_cast<int>(part);
}

Piece piece_of(size_t block, int chunks, int c) {
  const size_t w = static_cast<size_t>(chunks), i = static_cast<size_t>(c);
  const size_t base = block / w, extra = block % w;
  return {base * i + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

bool overlap(const float* a, size_t a_len, const float* b, size_t b_len) {
  if (a_len == 0 || b_len == 0) return false;
  return a < b + b_len && b < a + a_len;
}

namespace {

void check_chunks(int chunks, const char* op, size_t block) {
  PARM_CONFIG_CHECK(chunks >= 1,
                    "{}: chunks = {} (block of {} elements); the number of pipeline pieces "
                    "must be at least 1 (1 = no pipelining)",
                    op, chunks, block);
}

// Checks `part` against the combine's in (N_ESP rows of `row` elements) and out (`row`).
MpGather check_mp_part(const MpGatherPart* part, const float* in, int n_esp, const float* out,
                       size_t row, size_t block) {
  MpGather g;
  if (part == nullptr) return g;
  PARM_CHECK(part->mp != nullptr, "fused_combine: MpGatherPart without a communicator");
  g.mp = part->mp;
  g.n = part->mp->size();
  g.me = part->mp->rank();
  PARM_CHECK(part->outer >= 1 && part->chunk >= 0,
             "fused_combine: MP gather outer {} must be >= 1 and chunk {} >= 0", part->outer,
             part->chunk);
  PARM_CHECK_EQ(static_cast<size_t>(part->outer * part->chunk), row);
  g.chunk = static_cast<size_t>(part->chunk);
  g.full = part->full;
  PARM_CHECK(row == 0 || g.full != nullptr, "fused_combine: MP gather output is null");
  // (On one MP rank `full` may be `out` itself.)
  const size_t full_len = static_cast<size_t>(g.n) * row;
  PARM_CHECK((g.n == 1 && g.full == out) ||
                 (!overlap(g.full, full_len, out, row) &&
                  !overlap(g.full, full_len, in, static_cast<size_t>(n_esp) * row)),
             "fused_combine: the MP gather output overlaps in or out (block {})", block);
  return g;
}

CallGroups call_groups(const char* op, const Communicator& ep, const Communicator& esp,
                       size_t block, int chunks) {
  check_chunks(chunks, op, block);
  CallGroups g;
  g.n_ep = ep.size();
  g.n_esp = esp.size();
  g.me_esp = esp.rank();
  g.row = static_cast<size_t>(g.n_ep) * block;
  return g;
}

}  // namespace

DispatchCall dispatch_call(const Communicator& ep, const Communicator& esp, const float* in,
                           float* out, size_t block, int chunks) {
  DispatchCall call;
  static_cast<CallGroups&>(call) = call_groups("fused_dispatch", ep, esp, block, chunks);
  PARM_CHECK(!overlap(in, call.row, out, static_cast<size_t>(call.n_esp) * call.row),
             "fused_dispatch: in and out overlap (block {})", block);
  call.plan = fused_plan::make_plan(fused_plan::Pipeline::kDispatch, {call.n_ep, call.n_esp, 1});
  call.mine = out + static_cast<size_t>(call.me_esp) * call.row;
  return call;
}

CombineCall combine_call(const Communicator& esp, const Communicator& ep, const float* in,
                         const float* out, size_t block, int chunks,
                         const MpGatherPart* mp_part) {
  CombineCall call;
  static_cast<CallGroups&>(call) = call_groups("fused_combine", ep, esp, block, chunks);
  PARM_CHECK(!overlap(in, static_cast<size_t>(call.n_esp) * call.row, out, call.row),
             "fused_combine: in and out overlap (block {})", block);
  call.mp = check_mp_part(mp_part, in, call.n_esp, out, call.row, block);
  call.plan = fused_plan::make_plan(call.mp.mp != nullptr ? fused_plan::Pipeline::kCombineMp
                                                          : fused_plan::Pipeline::kCombine,
                                    {call.n_ep, call.n_esp, call.mp.n});
  return call;
}

}  // namespace fused_detail
}  // namespace parm
