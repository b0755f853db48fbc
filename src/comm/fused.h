// Fused collectives (docs/spec.md §4): two (or three) collectives computed as one pipelined
// operation. The data is cut into `chunks` pieces, and each part is a pipeline stage (the
// stages, their order and counters are described once, in fused_plan.h); in step s stage j
// works on piece s - j, so the inter-node exchange of one piece and the intra-node
// forwarding of its neighbour are in flight together, on two communicators, and both kinds
// of link work at once (chunks + num_stages - 1 steps; num_stages is 2, or 3 with the MP
// gather, less the stages dropped on groups of one rank). The result is bit-identical to
// running the parts one after the other, and the byte counters record exactly what the
// parts would record (one call each, same bus bytes, under the parts' (group, op)).
//
// Layouts (elements; `block` = elements one EP rank sends to one EP peer):
//   dispatch in   (N_EP, block)          block p goes to EP peer p
//   dispatch out  (N_ESP, N_EP, block)   = esp.allgather(ep.alltoall(in))
//   combine in    (N_ESP, N_EP, block)   partial sums of the ESP shards
//   combine out   (N_EP, block)          = ep.alltoall(esp.reduce_scatter(in))
// A group of size 1 makes its part a no-op (a local copy where needed; the test-only
// fused_plan::KeepSizeOneStages runs it anyway, as messages to self).
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/fused_plan.h"
#include "parm/comm.h"

namespace parm {

// The MP AllGather that S2 fuses into its combine: `out` (combine out, seen as
// (outer, chunk)) is gathered over `mp` into `full` (outer, N_MP, chunk), interleaved
// exactly as the unfused S2 step does.
struct MpGatherPart {
  Communicator* mp = nullptr;
  int64_t outer = 1;
  int64_t chunk = 0;
  float* full = nullptr;
};

// esp.allgather(ep.alltoall(in)). `in` and `out` must not overlap.
void fused_dispatch(Communicator& ep, Communicator& esp, const float* in, float* out,
                    size_t block, int chunks);

// ep.alltoall(esp.reduce_scatter(in)) [then the MP AllGather of `mp_part`]. The ESP sum is
// taken in ESP-rank order, as Communicator::reduce_scatter takes it.
void fused_combine(Communicator& esp, Communicator& ep, const float* in, float* out,
                   size_t block, int chunks, const MpGatherPart* mp_part = nullptr);

// ---- shared by the implementations of the fused collectives (fused.cpp, the NCCL one) ----
namespace fused_detail {

// Piece c of `chunks` of a block of `block` elements: [lo, lo + len); the first
// block % chunks pieces are one element longer (pieces may be empty).
struct Piece {
  size_t lo = 0;
  size_t len = 0;
};
Piece piece_of(size_t block, int chunks, int c);

// The host pipelines' tag of piece `piece`'s messages on the stage of `part` (see fused.cpp).
int tag_of(int piece, fused_plan::Role part);

// True when [a, a + a_len) and [b, b + b_len) share an element (empty ranges share none).
bool overlap(const float* a, size_t a_len, const float* b, size_t b_len);

// A fused combine's MP part after its checks: the group (null when there is no part), its
// size and my rank (1 and 0 without one), the chunk and the gathered output.
struct MpGather {
  Communicator* mp = nullptr;
  int n = 1, me = 0;
  size_t chunk = 0;
  float* full = nullptr;  // (outer, N_MP, chunk)
};

// The group sizes of a fused call, my ESP rank, and one ESP rank's (N_EP, block) row.
struct CallGroups {
  int n_ep = 1, n_esp = 1, me_esp = 0;
  size_t row = 0;
};

// A fused dispatch call after the checks both implementations make (chunks >= 1, in and out
// apart): its groups, the stages it runs, and my slot of out (N_EP, block).
struct DispatchCall : CallGroups {
  fused_plan::Plan plan;
  float* mine = nullptr;
};
DispatchCall dispatch_call(const Communicator& ep, const Communicator& esp, const float* in,
                           float* out, size_t block, int chunks);

// A fused combine call after the same checks and those of its MP part.
struct CombineCall : CallGroups {
  MpGather mp;
  fused_plan::Plan plan;
};
CombineCall combine_call(const Communicator& esp, const Communicator& ep, const float* in,
                         const float* out, size_t block, int chunks,
                         const MpGatherPart* mp_part);

}  // namespace fused_detail
}  // namespace parm
