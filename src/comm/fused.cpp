// The fused collectives of SPEC §4 as a software pipeline of non-blocking point-to-point
// messages on two (or three) communicators.
//
// Pieces: piece c of `chunks` is the same contiguous range [lo, lo + len) of every `block`
// (the first block % chunks pieces are one element longer; pieces may be empty).
//
// Stages: each part of the operation is a pipeline stage; a part on a group of one rank
// moves nothing and is dropped (the ep alltoall stage always stays: on one rank it is the
// local copy). In step s, stage j works on piece s - j, and every request of a step is
// waited for before the next step is posted (chunks + num_stages - 1 steps):
//   dispatch  stage 0: ep alltoall of piece s        (inter-node)
//             stage 1: esp allgather of piece s-1    (intra-node)
//   combine   stage 0: esp exchange of piece s       (intra-node; the reduce_scatter inputs)
//             stage 1: esp sum + ep alltoall of piece s-1   (inter-node)
//             stage 2: mp allgather of piece s-2     (intra-node; S2 only)
// so the inter-node link and the intra-node links are busy at once. The combine's order is
// forced by its data flow (a piece must be reduced before it crosses EP and crossed before
// MP gathers it); the ESP sum of piece s-1 runs after piece s's ESP messages are posted, so
// it overlaps their transfer.
//
// Bit-identity with the unfused parts: every element is moved, never combined, except in
// the ESP sum, which starts from block 0 and adds blocks 1, 2, ... in ESP-rank order, as
// MpiCommunicator::ireduce_scatter does.
//
// Tags: kFusedTagBase + 4 * (piece % kTagPieces) + part, with part 0 = ep, 1 = esp, 2 = mp,
// so no two pieces or parts share a tag (below MPI's guaranteed MPI_TAG_UB of 32767). Tags
// wrap after kTagPieces pieces; that is safe because steps are synchronous: no peer gets
// more than a step ahead of this rank on a communicator they both use in that step.
// Several messages of one piece between the same pair (one per EP block) share a tag and
// match in posting order (MPI's non-overtaking rule).
//
// Counters: the point-to-point messages are uncounted; at the end each part records one
// call of its collective with the bus bytes that collective records. Time: each part
// records the wall time of the steps in which it had a piece in flight (including its local
// copies and sums). With chunks = 1 these partition the fused op's wall time; with more
// chunks they overlap, which is the point, so their sum exceeds the wall time.
//
// Steady state: nothing here allocates once a call with the same sizes has run on this
// thread. The request list and the combine's staging buffers live in a per-thread workspace
// kept between calls, and the stages are std::functions over std::cref of the caller's
// lambdas (a reference is stored in place, never on the heap).
#include "comm/fused.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

constexpr int kTagPieces = 4096;
enum Part { kEpPart = 0, kEspPart = 1, kMpPart = 2 };
static_assert(kFusedTagBase + 4 * (kTagPieces - 1) + kMpPart <= 32767,
              "fused tags must stay below the MPI_TAG_UB every MPI guarantees");

int tag_of(int piece, Part part) { return kFusedTagBase + 4 * (piece % kTagPieces) + part; }

using Requests = std::vector<RequestPtr>;  // one step's requests

using fused_detail::Piece;
using fused_detail::piece_of;

// Posts the exchange of one contiguous range with one peer.
void post_pair(Communicator& c, int peer, const float* send, float* recv, size_t len, int tag,
               Requests& reqs) {
  reqs.push_back(c.irecv_uncounted(recv, len, DType::kF32, peer, tag));
  reqs.push_back(c.isend_uncounted(send, len, DType::kF32, peer, tag));
}

// The EP AllToAll of one piece: block p of `send` goes to EP peer p's block of `recv` (a
// local copy for this rank's own block). Both fused collectives run it.
void post_ep_piece(Communicator& ep, size_t block, const Piece& pc, const float* send,
                   float* recv, int tag, Requests& reqs);

void copy(float* dst, const float* src, size_t len) {
  if (len > 0) std::memcpy(dst, src, len * sizeof(float));
}

void post_ep_piece(Communicator& ep, size_t block, const Piece& pc, const float* send,
                   float* recv, int tag, Requests& reqs) {
  for (int p = 0; p < ep.size(); ++p) {
    const size_t off = static_cast<size_t>(p) * block + pc.lo;
    if (p == ep.rank())
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
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

struct Stage {
  std::function<void(int piece, Requests& reqs)> post;  // std::cref of the caller's lambda
  double busy_us = 0.0;
};

// At most three stages (combine with the MP part); a fixed array, so building one is free.
struct Pipeline {
  std::array<Stage, 3> stages;
  int num_stages = 0;

  // Appends a stage running `post`, which must outlive the pipeline; returns its index.
  template <typename Post> int add(const Post& post) {
    PARM_CHECK(num_stages < static_cast<int>(stages.size()), "fused pipeline: too many stages");
    stages[static_cast<size_t>(num_stages)].post = std::cref(post);
    return num_stages++;
  }
  template <typename Post> int add(const Post&& post) = delete;  // would dangle
  double busy_us(int stage) const { return stages[static_cast<size_t>(stage)].busy_us; }
};

// Step s posts piece s - j of stage j, then waits for the whole step.
void run_pipeline(Pipeline& p, int chunks) {
  Workspace& ws = workspace();
  try {
    for (int s = 0; s < chunks + p.num_stages - 1; ++s) {
      const double t0 = now_us();
      for (int j = 0; j < p.num_stages; ++j) {
        const int c = s - j;
        if (c >= 0 && c < chunks) p.stages[static_cast<size_t>(j)].post(c, ws.reqs);
      }
      wait_all(ws.reqs);
      const double dt = now_us() - t0;
      for (int j = 0; j < p.num_stages; ++j) {
        const int c = s - j;
        if (c >= 0 && c < chunks) p.stages[static_cast<size_t>(j)].busy_us += dt;
      }
    }
  } catch (...) {
    // A step failed (a Timeout, an MPI error): drop what it posted (each request waits, up
    // to its deadline) and never hand the staging buffers out again, since messages that
    // did not complete may still land in them. The job aborts after this anyway.
    ws.reqs.clear();
    ws.theirs.abandon();
    ws.reduced.abandon();
    throw;
  }
}

void check_chunks(int chunks, const char* op, size_t block) {
  PARM_CONFIG_CHECK(chunks >= 1,
                    "{}: chunks = {} (block of {} elements); the number of pipeline pieces "
                    "must be at least 1 (1 = no pipelining)",
                    op, chunks, block);
}

}  // namespace

void fused_dispatch(Communicator& ep, Communicator& esp, const float* in, float* out,
                    size_t block, int chunks) {
  check_chunks(chunks, "fused_dispatch", block);
  const int n_ep = ep.size();
  const int n_esp = esp.size(), me_esp = esp.rank();
  const size_t row = static_cast<size_t>(n_ep) * block;  // one ESP rank's (N_EP, block)
  PARM_CHECK(!fused_detail::overlap(in, row, out, static_cast<size_t>(n_esp) * row),
             "fused_dispatch: in and out overlap (block {})", block);
  // (N_EP, block): where the alltoall delivers, this rank's slot of the allgather output.
  float* mine = out + static_cast<size_t>(me_esp) * row;

  const auto post_alltoall = [&](int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    post_ep_piece(ep, block, pc, in, mine, tag_of(c, kEpPart), reqs);
  };
  const auto post_allgather = [&](int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp) continue;
      float* theirs = out + static_cast<size_t>(q) * row;
      for (int p = 0; p < n_ep; ++p) {
        const size_t off = static_cast<size_t>(p) * block + pc.lo;
        post_pair(esp, q, mine + off, theirs + off, pc.len, tag_of(c, kEspPart), reqs);
      }
    }
  };
  Pipeline pipeline;
  const int a2a_stage = pipeline.add(post_alltoall);
  const int gather_stage = n_esp > 1 ? pipeline.add(post_allgather) : -1;
  run_pipeline(pipeline, chunks);

  const double block_bytes = static_cast<double>(block * sizeof(float));
  if (n_ep > 1)
    ep.record(CommOp::kAllToAll, bus_bytes(CommOp::kAllToAll, n_ep, block_bytes),
              pipeline.busy_us(a2a_stage));
  if (n_esp > 1)
    esp.record(CommOp::kAllGather, bus_bytes(CommOp::kAllGather, n_esp, n_ep * block_bytes),
               pipeline.busy_us(gather_stage));
}

void fused_combine(Communicator& esp, Communicator& ep, const float* in, float* out,
                   size_t block, int chunks, const MpGatherPart* mp_part) {
  check_chunks(chunks, "fused_combine", block);
  const int n_ep = ep.size();
  const int n_esp = esp.size(), me_esp = esp.rank();
  const size_t row = static_cast<size_t>(n_ep) * block;  // (N_EP, block)
  PARM_CHECK(!fused_detail::overlap(in, static_cast<size_t>(n_esp) * row, out, row),
             "fused_combine: in and out overlap (block {})", block);

  const fused_detail::MpGather g =
      fused_detail::check_mp_part(mp_part, in, n_esp, out, row, block);
  Communicator* mp = g.mp;
  const int n_mp = g.n, me_mp = g.me;
  const size_t mp_chunk = g.chunk;
  float* full = g.full;  // (outer, N_MP, chunk)

  // The reduce_scatter: peers' partial sums of my block arrive in `theirs` (N_ESP, N_EP,
  // block; my own slot unused) and are summed into `reduced` (N_EP, block). On one ESP rank
  // the sum of a single block is the block itself, so the alltoall sends `in` directly.
  // Both live in this thread's workspace, reused from call to call.
  float* theirs = nullptr;
  float* reduced = nullptr;
  const float* a2a_send = in;
  if (n_esp > 1) {
    theirs = workspace().theirs.get(static_cast<size_t>(n_esp) * row);
    reduced = workspace().reduced.get(row);
    a2a_send = reduced;
  }
  auto block_of = [&](int q, int p) -> size_t {  // offset of block (q, p) of (N_ESP, N_EP, block)
    return (static_cast<size_t>(q) * static_cast<size_t>(n_ep) + static_cast<size_t>(p)) * block;
  };

  const auto post_exchange = [&](int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    for (int q = 0; q < n_esp; ++q) {
      if (q == me_esp) continue;
      for (int p = 0; p < n_ep; ++p)
        post_pair(esp, q, in + block_of(q, p) + pc.lo, theirs + block_of(q, p) + pc.lo, pc.len,
                  tag_of(c, kEspPart), reqs);
    }
  };
  const auto post_sum_alltoall = [&](int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    if (n_esp > 1) {
      // ((b0 + b1) + b2) + ...: ESP-rank order, exactly as MpiCommunicator::ireduce_scatter.
      for (int p = 0; p < n_ep; ++p) {
        float* dst = reduced + static_cast<size_t>(p) * block + pc.lo;
        for (int q = 0; q < n_esp; ++q) {
          const float* src = (q == me_esp ? in : theirs) + block_of(q, p) + pc.lo;
          if (q == 0) {
            copy(dst, src, pc.len);
          } else {
            for (size_t i = 0; i < pc.len; ++i) dst[i] += src[i];
          }
        }
      }
    }
    post_ep_piece(ep, block, pc, a2a_send, out, tag_of(c, kEpPart), reqs);
  };
  // out seen as (outer, chunk) goes to full (outer, N_MP, chunk): element f of MP rank q's
  // out lands at full[f / chunk][q][f % chunk], as the unfused S2 gather interleaves it.
  // A piece's range of each EP block is cut where it crosses a row of `chunk`.
  const auto post_mp_gather = [&](int c, Requests& reqs) {
    const Piece pc = piece_of(block, chunks, c);
    if (pc.len == 0) return;
    for (int p = 0; p < n_ep; ++p) {
      const size_t end = static_cast<size_t>(p) * block + pc.lo + pc.len;
      for (size_t x = static_cast<size_t>(p) * block + pc.lo; x < end;) {
        const size_t o = x / mp_chunk;
        const size_t y = std::min(end, (o + 1) * mp_chunk);
        for (int q = 0; q < n_mp; ++q) {
          float* dst = full + (o * static_cast<size_t>(n_mp) + static_cast<size_t>(q)) *
                                  mp_chunk + (x - o * mp_chunk);
          if (q == me_mp)
            copy(dst, out + x, y - x);
          else
            post_pair(*mp, q, out + x, dst, y - x, tag_of(c, kMpPart), reqs);
        }
        x = y;
      }
    }
  };
  const bool mp_active = mp != nullptr && n_mp > 1;
  Pipeline pipeline;
  const int exchange_stage = n_esp > 1 ? pipeline.add(post_exchange) : -1;
  const int a2a_stage = pipeline.add(post_sum_alltoall);
  const int gather_stage = mp_active ? pipeline.add(post_mp_gather) : -1;
  run_pipeline(pipeline, chunks);
  // An MP group of one: full (outer, 1, chunk) is out itself.
  if (mp != nullptr && n_mp == 1 && full != out) copy(full, out, row);

  const double block_bytes = static_cast<double>(block * sizeof(float));
  if (n_esp > 1)
    esp.record(CommOp::kReduceScatter,
               bus_bytes(CommOp::kReduceScatter, n_esp, n_ep * block_bytes),
               pipeline.busy_us(exchange_stage));
  if (n_ep > 1)
    ep.record(CommOp::kAllToAll, bus_bytes(CommOp::kAllToAll, n_ep, block_bytes),
              pipeline.busy_us(a2a_stage));
  if (mp_active)
    mp->record(CommOp::kAllGather, bus_bytes(CommOp::kAllGather, n_mp, row * sizeof(float)),
               pipeline.busy_us(gather_stage));
}

namespace fused_detail {

Piece piece_of(size_t block, int chunks, int c) {
  const size_t w = static_cast<size_t>(chunks), i = static_cast<size_t>(c);
  const size_t base = block / w, extra = block % w;
  return {base * i + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

bool overlap(const float* a, size_t a_len, const float* b, size_t b_len) {
  if (a_len == 0 || b_len == 0) return false;
  return a < b + b_len && b < a + a_len;
}

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

}  // namespace fused_detail
}  // namespace parm
