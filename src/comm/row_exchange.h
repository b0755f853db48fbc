// The variable-size exchanges of dropless routing (docs/dropless.md): collectives over
// buffers of rows cut into segments (one per expert, or per expert and block), where only
// the first fill[i] rows of segment i hold routed tokens. Only those rows travel: nothing
// is padded to a maximum, and the counts (already known on both sides: they travel ahead
// as metadata, or are the counts of an earlier buffer) size every message.
//
// Built, like the fused collectives, from uncounted point-to-point messages under the
// communicator's watchdog; each call records one call of its collective (group, op) with
// the bytes this rank received from others (self-copies excluded), so the byte counters
// show exactly the routed rows. The reductions sum in group-rank order ((b0 + b1) + b2 ...),
// as Communicator::reduce_scatter does. Local copies and sums go through RowOps, so the
// buffers may live on any device the communicator moves.
//
// Messages: a call lists, per peer, the ranges of routed rows it sends and receives (one per
// segment, or per part of a segment). Where both buffers of a call are back to back (the
// packed layout: `Segments::back_to_back`, the same on every rank), consecutive segments
// that go to consecutive segments on the peer are one range: a peer's whole part is then one
// message, without a copy. Ranges under kPackBelowBytes travel coalesced: packed into one
// message per peer (a local copy on each side), where the per-message cost would exceed the
// copy's; larger ranges go directly, without a copy. Both sides see the same range sizes in
// the same order (the merge rule reads only the segment indices and the layouts' flags, never
// the addresses), so they cut the same messages.
//
// Steady state: the request list, the range lists, the packing buffers (sized by the number
// of ranges a call lists, not by the routing) and the caller's scratch are kept between
// calls; nothing allocates once every call of a step list has run.
#pragma once

#include <cstdint>
#include <vector>

#include "parm/comm.h"
#include "parm/tensor.h"

namespace parm {

// Point-to-point tag of the row exchanges (reserved, below the metadata tag).
constexpr int kRowExchangeTag = kFusedTagBase - 2;

// A segmented buffer: `count` segments of `slots` rows of `row_elems` floats; segment i's
// first fill[i] rows are routed (0 <= fill[i] <= slots). With `first`, segment i starts at
// row first[i] instead of i * slots (a view that cuts each segment's routed rows in parts).
struct Segments {
  float* data = nullptr;
  int64_t slots = 0;
  const int32_t* fill = nullptr;
  int64_t count = 0;
  const int64_t* first = nullptr;
  // Segment i + 1 starts right where segment i's routed rows end (first[i + 1] = first[i] +
  // fill[i]: the packed layout, and any part view of it). A property of the layout, the same
  // on every rank for the same buffer, so both sides of a message may rely on it.
  bool back_to_back = false;
  int64_t routed_rows() const;
  // Segment i's routed rows, checked to lie in [0, slots].
  int64_t fill_of(int64_t i) const;
  // Where segment i's rows start (rows of row_elems floats).
  float* rows(int64_t i, int64_t row_elems) const {
    return data + (first != nullptr ? first[i] : i * slots) * row_elems;
  }
};

// The local data movement, on the buffers' device.
class RowOps {
 public:
  virtual ~RowOps() = default;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;  // dst = src
  virtual void add(float* dst, const float* src, int64_t n) = 0;   // dst += src
  // Waits for the copies queued so far (a device's copies may be asynchronous): called
  // before messages read what they wrote.
  virtual void sync() = 0;
};

class RowExchange {
 public:
  // dst part p = src part p of peer p; src and dst have the same count, in c.size() parts.
  void alltoall(Communicator& c, const Segments& src, const Segments& dst, int64_t row_elems,
                RowOps& ops);
  // dst = (outer, n, inner) segments, dst segment (o, p, i) = src segment (o, i) of peer p;
  // src has outer * inner segments.
  void allgather(Communicator& c, const Segments& src, const Segments& dst, int64_t outer,
                 int64_t row_elems, RowOps& ops);
  // dst = this rank's part of src (outer, n, inner) segments: dst (o, i) = src (o, me, i).
  static void keep(Communicator& c, const Segments& src, const Segments& dst, int64_t outer,
                   int64_t row_elems, RowOps& ops);
  // dst = sum over peers p (in rank order) of peer p's src part `me`; src has n parts of
  // dst.count segments. `scratch` holds at least (n - 1) * dst.routed_rows() rows.
  void reduce_scatter(Communicator& c, const Segments& src, const Segments& dst,
                      float* scratch, int64_t row_elems, RowOps& ops);
  // buf = sum over peers (in rank order) of their buf (every rank has the same fills);
  // `scratch` holds at least n * buf.routed_rows() rows. A reduce-scatter then an allgather
  // of the routed rows: group rank q sums rows [q R / n, (q + 1) R / n) of the R routed rows
  // (in segment order) in rank order and sends the sum to every peer, so every rank holds
  // the same bits whatever the message timing; rank q receives R + (n - 2) x its rows.
  void allreduce(Communicator& c, const Segments& buf, float* scratch, int64_t row_elems,
                 RowOps& ops);

  // Ranges smaller than this are packed into one message per peer.
  static constexpr int64_t kPackBelowBytes = 32 * 1024;
  // The most ranges per peer a call of `op` (kAllToAllv, kAllGather, kReduceScatter,
  // kAllReduce: the calls above) lists, for src / dst buffers of these segment counts on n
  // ranks: one per segment of a peer's part.
  static int64_t ranges_per_peer(CommOp op, int64_t src_segments, int64_t dst_segments, int n);
  // Sizes the packing buffers (grown, never shrunk) for calls on c listing up to
  // ranges_per_peer ranges per peer, as a call does at its first run: (n - 1) x ranges x
  // kPackBelowBytes per side. Lets the owner hold them from construction on.
  void reserve_packing(const Communicator& c, int64_t ranges_per_peer);
  // Bytes of the packing buffers.
  int64_t held_bytes() const { return pack_send_.bytes() + pack_recv_.bytes(); }
  // Point-to-point messages this object has posted (sends), for tests.
  int64_t messages_sent() const { return messages_sent_; }

 private:
  struct Range {
    float* data;
    int64_t elems;
  };
  // Appends a range to `list`, or extends its last range when `joins` (the caller's rule, the
  // same on both sides of the message); checks that a joined range really continues the last.
  static void append(std::vector<Range>& list, float* data, int64_t elems, bool joins);
  // Posts the messages of the listed ranges (sends_[p], recvs_[p]) to / from every peer but
  // this rank (small ranges packed), makes the listed local copies (this rank's own part)
  // while they travel, waits, unpacks, and returns the bytes received. No list holds more
  // than `ranges_per_peer` ranges, whatever the routing.
  double exchange(Communicator& c, int64_t ranges_per_peer, RowOps& ops);
  // exchange(), then records one call of `op` with the bytes received.
  void run(Communicator& c, CommOp op, int64_t ranges_per_peer, double start_us, RowOps& ops);
  void reset(int n);
  // Grows `t` (never shrinks) to at least `elems` floats in the communicator's space.
  static void reserve(Tensor& t, int64_t elems, const Communicator& c);
  // Source segment s goes to destination segment d on peer p: listed for run(), as a message
  // or, when p is this rank (`me`), as a local copy. `follows`: the pair listed before for p was
  // (s - 1, d - 1); with both layouts back to back the two are then one range.
  void pair(int p, int me, const Segments& src, int64_t s, const Segments& dst, int64_t d,
            bool follows, int64_t row_elems);

  struct Copy {
    float* dst;
    const float* src;
    int64_t elems;
  };
  std::vector<std::vector<Range>> sends_, recvs_;  // by peer
  std::vector<Copy> local_;                        // this rank's own part
  std::vector<RequestPtr> requests_;
  Tensor pack_send_, pack_recv_;  // packed small ranges, all peers back to back
  int64_t messages_sent_ = 0;
};

}  // namespace parm
