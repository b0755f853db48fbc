#include "comm/row_exchange.h"

#include <algorithm>

#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

constexpr int64_t kPackBelowElems =
    RowExchange::kPackBelowBytes / static_cast<int64_t>(sizeof(float));

bool packs(int64_t elems) { return elems > 0 && elems < kPackBelowElems; }

// Calls f(rows, elems) for each run of routed rows [lo, hi) of `s`, counting its routed rows
// in segment order (segment i's first fill[i] rows, then segment i + 1's).
template <typename F>
void for_rows(const Segments& s, int64_t lo, int64_t hi, int64_t row_elems, F&& f) {
  int64_t at = 0;  // routed rows before segment i
  for (int64_t i = 0; i < s.count && at < hi; ++i) {
    const int64_t fill = s.fill_of(i), a = std::max(lo, at), b = std::min(hi, at + fill);
    if (a < b) f(s.rows(i, row_elems) + (a - at) * row_elems, (b - a) * row_elems);
    at += fill;
  }
}

}  // namespace

int64_t Segments::fill_of(int64_t i) const {
  const int64_t f = fill[i];
  PARM_CHECK(f >= 0 && f <= slots, "segment {} holds {} routed rows, outside [0, {}]", i, f,
             slots);
  return f;
}

int64_t Segments::routed_rows() const {
  int64_t r = 0;
  for (int64_t i = 0; i < count; ++i) r += fill[i];
  return r;
}

void RowExchange::reset(int n) {
  // Grown only: groups of different sizes share the lists, and a shrink would free the
  // inner lists' storage (an allocation on every later call).
  if (sends_.size() < static_cast<size_t>(n)) {
    sends_.resize(static_cast<size_t>(n));
    recvs_.resize(static_cast<size_t>(n));
  }
  for (auto& v : sends_) v.clear();  // capacity kept
  for (auto& v : recvs_) v.clear();
  local_.clear();
}

void RowExchange::reserve(Tensor& t, int64_t elems, const Communicator& c) {
  if (t.numel() >= elems) return;
  t = Tensor({elems}, c.memory_space() == MemorySpace::kDevice ? Device::kCuda : Device::kCpu);
}

int64_t RowExchange::ranges_per_peer(CommOp op, int64_t src_segments, int64_t dst_segments,
                                     int n) {
  switch (op) {
    case CommOp::kAllToAllv: return src_segments / n;
    case CommOp::kAllGather: return src_segments;
    case CommOp::kReduceScatter: return dst_segments;
    case CommOp::kAllReduce: return src_segments;
    default: break;
  }
  throw Error(fmt::format("row exchange: no row form of {}", comm_op_name(op)));
}

void RowExchange::reserve_packing(const Communicator& c, int64_t ranges_per_peer) {
  reserve(pack_send_, (c.size() - 1) * ranges_per_peer * kPackBelowElems, c);
  reserve(pack_recv_, (c.size() - 1) * ranges_per_peer * kPackBelowElems, c);
}

double RowExchange::exchange(Communicator& c, int64_t ranges_per_peer, RowOps& ops) {
  const int n = c.size(), me = c.rank();
  // A peer's small ranges travel packed when there are two or more (one would save nothing).
  auto packed_elems = [](const std::vector<Range>& list) {
    int64_t elems = 0, num = 0;
    for (const Range& r : list)
      if (packs(r.elems)) elems += r.elems, ++num;
    return num >= 2 ? elems : int64_t{0};
  };
  // The packing buffers hold `ranges_per_peer` ranges per peer at their largest packed size:
  // a bound fixed by the call's segments, so no routing grows them after the first call.
  reserve_packing(c, ranges_per_peer);
  int64_t send_off = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me || packed_elems(sends_[static_cast<size_t>(p)]) == 0) continue;
    for (const Range& r : sends_[static_cast<size_t>(p)])
      if (packs(r.elems)) {
        ops.copy(pack_send_.data() + send_off, r.data, r.elems);
        send_off += r.elems;
      }
  }
  ops.sync();
  double received = 0.0;
  send_off = 0;
  int64_t recv_off = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const auto& recvs = recvs_[static_cast<size_t>(p)];
    const auto& sends = sends_[static_cast<size_t>(p)];
    const int64_t pack_in = packed_elems(recvs), pack_out = packed_elems(sends);
    auto post_recv = [&](float* data, int64_t elems) {
      requests_.push_back(c.irecv_uncounted(data, static_cast<size_t>(elems), DType::kF32, p,
                                            kRowExchangeTag));
      received += static_cast<double>(elems) * sizeof(float);
    };
    auto post_send = [&](const float* data, int64_t elems) {
      requests_.push_back(c.isend_uncounted(data, static_cast<size_t>(elems), DType::kF32, p,
                                            kRowExchangeTag));
      ++messages_sent_;
    };
    // The packed message first, then the direct ranges in list order (same on both sides).
    if (pack_in > 0) post_recv(pack_recv_.data() + recv_off, pack_in);
    for (const Range& r : recvs)
      if (r.elems > 0 && !(pack_in > 0 && packs(r.elems))) post_recv(r.data, r.elems);
    if (pack_out > 0) post_send(pack_send_.data() + send_off, pack_out);
    for (const Range& r : sends)
      if (r.elems > 0 && !(pack_out > 0 && packs(r.elems))) post_send(r.data, r.elems);
    recv_off += pack_in;
    send_off += pack_out;
  }
  // This rank's own part is copied while the messages travel (it feeds none of them).
  for (const Copy& k : local_) ops.copy(k.dst, k.src, k.elems);
  wait_all(requests_);  // clears the list, keeps its capacity
  recv_off = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me || packed_elems(recvs_[static_cast<size_t>(p)]) == 0) continue;
    for (const Range& r : recvs_[static_cast<size_t>(p)])
      if (packs(r.elems)) {
        ops.copy(r.data, pack_recv_.data() + recv_off, r.elems);
        recv_off += r.elems;
      }
  }
  return received;
}

void RowExchange::run(Communicator& c, CommOp op, int64_t ranges_per_peer, double start_us,
                      RowOps& ops) {
  const double received = exchange(c, ranges_per_peer, ops);
  c.record(op, received, now_us() - start_us);
}

void RowExchange::append(std::vector<Range>& list, float* data, int64_t elems, bool joins) {
  if (!joins || list.empty()) {
    list.push_back({data, elems});
    return;
  }
  Range& last = list.back();
  PARM_CHECK(last.data + last.elems == data,
             "row exchange: a segment said to be back to back starts {} floats after the end "
             "of the one before it (a layout whose first[] is not the prefix sum of its fills)",
             data - (last.data + last.elems));
  last.elems += elems;
}

void RowExchange::pair(int p, int me, const Segments& src, int64_t s, const Segments& dst,
                       int64_t d, bool follows, int64_t row_elems) {
  const size_t peer = static_cast<size_t>(p);
  if (p == me) {
    PARM_CHECK_EQ(src.fill_of(s), dst.fill_of(d));
    local_.push_back({dst.rows(d, row_elems), src.rows(s, row_elems), src.fill_of(s) * row_elems});
    return;
  }
  const bool joins = follows && src.back_to_back && dst.back_to_back;
  append(sends_[peer], src.rows(s, row_elems), src.fill_of(s) * row_elems, joins);
  append(recvs_[peer], dst.rows(d, row_elems), dst.fill_of(d) * row_elems, joins);
}

void RowExchange::alltoall(Communicator& c, const Segments& src, const Segments& dst,
                           int64_t row_elems, RowOps& ops) {
  const double t0 = now_us();
  const int n = c.size(), me = c.rank();
  PARM_CHECK(src.count == dst.count && src.count % n == 0,
             "row alltoall on {} (rank {}): {} source and {} destination segments for {} ranks",
             c.name(), c.world_rank(), src.count, dst.count, n);
  const int64_t per = src.count / n;
  reset(n);
  for (int p = 0; p < n; ++p)
    for (int64_t i = p * per; i < (p + 1) * per; ++i)
      pair(p, me, src, i, dst, i, i > p * per, row_elems);
  run(c, CommOp::kAllToAllv, ranges_per_peer(CommOp::kAllToAllv, src.count, dst.count, n), t0,
      ops);
}

void RowExchange::allgather(Communicator& c, const Segments& src, const Segments& dst,
                            int64_t outer, int64_t row_elems, RowOps& ops) {
  const double t0 = now_us();
  const int n = c.size(), me = c.rank();
  PARM_CHECK(outer >= 1 && src.count % outer == 0 && dst.count == src.count * n,
             "row allgather on {} (rank {}): {} source segments ({} outer), {} destination, "
             "{} ranks",
             c.name(), c.world_rank(), src.count, outer, dst.count, n);
  const int64_t inner = src.count / outer;
  reset(n);
  for (int p = 0; p < n; ++p)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        pair(p, me, src, o * inner + i, dst, (o * n + p) * inner + i, i > 0, row_elems);
      }
  run(c, CommOp::kAllGather, ranges_per_peer(CommOp::kAllGather, src.count, dst.count, n), t0,
      ops);
}

void RowExchange::keep(Communicator& c, const Segments& src, const Segments& dst,
                       int64_t outer, int64_t row_elems, RowOps& ops) {
  const int n = c.size(), me = c.rank();
  PARM_CHECK(outer >= 1 && dst.count % outer == 0 && src.count == dst.count * n,
             "row keep on {} (rank {}): {} source segments, {} destination ({} outer), {} ranks",
             c.name(), c.world_rank(), src.count, dst.count, outer, n);
  const int64_t inner = dst.count / outer;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t d = o * inner + i, s = (o * n + me) * inner + i;
      PARM_CHECK_EQ(src.fill_of(s), dst.fill_of(d));
      ops.copy(dst.rows(d, row_elems), src.rows(s, row_elems),
               dst.fill_of(d) * row_elems);
    }
}

void RowExchange::reduce_scatter(Communicator& c, const Segments& src, const Segments& dst,
                                 float* scratch, int64_t row_elems, RowOps& ops) {
  const double t0 = now_us();
  const int n = c.size(), me = c.rank();
  const int64_t S = dst.count;
  PARM_CHECK(src.count == S * n, "row reduce_scatter on {} (rank {}): {} source segments, {} "
             "destination, {} ranks", c.name(), c.world_rank(), src.count, S, n);
  const int64_t mine = dst.routed_rows() * row_elems;  // one peer's region of scratch
  auto region = [&](int p) { return scratch + (p < me ? p : p - 1) * mine; };
  reset(n);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    // The received rows land back to back in the scratch; the sent ones are one range where
    // the source is back to back (the same on every rank, so both sides join alike).
    int64_t off = 0;
    for (int64_t i = 0; i < S; ++i) {
      const bool joins = i > 0 && src.back_to_back;
      append(sends_[p], src.rows(p * S + i, row_elems), src.fill_of(p * S + i) * row_elems,
             joins);
      append(recvs_[p], region(p) + off, dst.fill_of(i) * row_elems, joins);
      off += dst.fill_of(i) * row_elems;
    }
  }
  run(c, CommOp::kReduceScatter, ranges_per_peer(CommOp::kReduceScatter, src.count, S, n), t0,
      ops);
  int64_t off = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t len = dst.fill_of(i) * row_elems;
    PARM_CHECK_EQ(src.fill_of(me * S + i), dst.fill_of(i));
    for (int p = 0; p < n; ++p) {
      const float* part = p == me ? src.rows(me * S + i, row_elems) : region(p) + off;
      if (p == 0)
        ops.copy(dst.rows(i, row_elems), part, len);
      else
        ops.add(dst.rows(i, row_elems), part, len);
    }
    off += len;
  }
}

void RowExchange::allreduce(Communicator& c, const Segments& buf, float* scratch,
                            int64_t row_elems, RowOps& ops) {
  const double t0 = now_us();
  const int n = c.size(), me = c.rank();
  const int64_t R = buf.routed_rows();
  auto first = [&](int q) { return q * R / n; };  // rank q's rows: [first(q), first(q + 1))
  const int64_t mine = (first(me + 1) - first(me)) * row_elems;
  // Scratch region q: rank q's part of my rows (region me: my own, kept before the sum).
  auto region = [&](int q) { return scratch + q * mine; };
  // Lists rank q's rows of buf on `to`: one range per segment they touch, or one in all
  // where buf is back to back (every rank's view of it is, so both sides join alike).
  auto list_rows = [&](std::vector<Range>& to, int q) {
    bool later = false;
    for_rows(buf, first(q), first(q + 1), row_elems, [&](float* rows, int64_t elems) {
      append(to, rows, elems, later && buf.back_to_back);
      later = true;
    });
  };
  int64_t off = 0;
  for_rows(buf, first(me), first(me + 1), row_elems, [&](float* rows, int64_t elems) {
    ops.copy(region(me) + off, rows, elems);
    off += elems;
  });
  // Reduce-scatter: every peer's part of my rows into its region.
  reset(n);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    list_rows(sends_[static_cast<size_t>(q)], q);
    // The same cuts as the sender's ranges (messages pair one to one).
    off = 0;
    bool later = false;
    for_rows(buf, first(me), first(me + 1), row_elems, [&](float*, int64_t elems) {
      append(recvs_[static_cast<size_t>(q)], region(q) + off, elems, later && buf.back_to_back);
      off += elems;
      later = true;
    });
  }
  double received = exchange(c, ranges_per_peer(CommOp::kAllReduce, buf.count, buf.count, n), ops);
  off = 0;
  for_rows(buf, first(me), first(me + 1), row_elems, [&](float* rows, int64_t elems) {
    ops.copy(rows, region(0) + off, elems);
    for (int q = 1; q < n; ++q) ops.add(rows, region(q) + off, elems);
    off += elems;
  });
  // Allgather: my sums to every peer, theirs into my buffer.
  reset(n);
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    list_rows(sends_[static_cast<size_t>(q)], me);
    list_rows(recvs_[static_cast<size_t>(q)], q);
  }
  received += exchange(c, ranges_per_peer(CommOp::kAllReduce, buf.count, buf.count, n), ops);
  c.record(CommOp::kAllReduce, received, now_us() - t0);
}

}  // namespace parm
