// The fused collectives (fused.h, docs/spec.md §4) for dropless routing: the same pipelines (the
// stages, their order, groups and recorded collectives of fused_plan.h) over segmented
// buffers (row_exchange.h), where only each segment's routed rows travel.
//
// Pieces: piece c of `chunks` of a segment holding `fill` routed rows is its rows
// fused_detail::piece_of(fill, chunks, c); both sides know every fill (they travel ahead as
// metadata, or are those of an earlier buffer), so each message is sized on both sides and
// every step carries about 1/chunks of every exchange, whatever the routing.
//
// Bit-identical to the unfused row exchanges (RowExchange): rows are moved, never combined,
// except in the ESP sum, which adds the ESP ranks' rows in rank order, starting from rank 0's,
// as RowExchange::reduce_scatter does.
//
// Counters: the messages are uncounted; each stage on a group of more than one rank records
// one call of its collective (the EP stages as kAllToAllv) with the bytes this rank received
// from others, which is what the unfused row exchanges record. Time: as fused.h.
//
// Steady state: the request list and the scratch offsets are kept between calls; nothing
// allocates once a call with as many segments has run.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/row_exchange.h"
#include "parm/comm.h"

namespace parm {

class FusedRows {
 public:
  // dst (N_ESP, N_EP, per) segments = esp.allgather(ep.alltoall(src (N_EP, per) segments)):
  // src part p goes to EP peer p, into its ESP slot, and from there to every ESP peer. dst's
  // fill counts must already be those that arrive.
  void dispatch(Communicator& ep, Communicator& esp, const Segments& src, const Segments& dst,
                int64_t row_elems, int chunks, RowOps& ops);

  // S2's MP AllGather joined to the combine: the combine's result (its segments the outer
  // ones) gathered over `mp` into `full`, a view of (outer, N_MP) parts (RowMover::segments'
  // split view: part (e, q) holds MP rank q's rows of segment e).
  struct MpPart {
    Communicator* mp = nullptr;
    Segments full;
  };
  // dst (N_EP, per) = ep.alltoall(esp.reduce_scatter(src (N_ESP, N_EP, per))) [then the MP
  // gather of dst into mp->full]. The ESP peers' rows of this rank's part are received into
  // `scratch` and summed there: it holds at least N_ESP x (routed rows of src part me) rows.
  void combine(Communicator& esp, Communicator& ep, const Segments& src, const Segments& dst,
               float* scratch, int64_t row_elems, int chunks, RowOps& ops,
               const MpPart* mp = nullptr);

 private:
  std::vector<RequestPtr> reqs_;  // one step's requests
  std::vector<int64_t> first_;    // the scratch regions' segment offsets (rows)
};

}  // namespace parm
