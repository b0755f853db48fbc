#include "comm/row_exchange.h"

#include "parm/error.h"
#include "parm/timer.h"

namespace parm {
namespace {

float* seg_rows(const Segments& s, int64_t i, int64_t row_elems) {
  return s.data + (s.first != nullptr ? s.first[i] : i * s.slots) * row_elems;
}

int64_t fill_of(const Segments& s, int64_t i) {
  const int64_t f = s.fill[i];
  PARM_CHECK(f >= 0 && f <= s.slots, "segment {} holds {} routed rows, outside [0, {}]", i, f,
             s.slots);
  return f;
}

}  // namespace

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
}

void RowExchange::run(Communicator& c, CommOp op, double start_us, RowOps& ops) {
  ops.sync();
  const int n = c.size(), me = c.rank();
  double received = 0.0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (const Range& r : recvs_[static_cast<size_t>(p)]) {
      if (r.elems == 0) continue;
      requests_.push_back(c.irecv_uncounted(r.data, static_cast<size_t>(r.elems), DType::kF32,
                                            p, kRowExchangeTag));
      received += static_cast<double>(r.elems) * sizeof(float);
    }
    for (const Range& r : sends_[static_cast<size_t>(p)]) {
      if (r.elems == 0) continue;
      requests_.push_back(c.isend_uncounted(r.data, static_cast<size_t>(r.elems), DType::kF32,
                                            p, kRowExchangeTag));
    }
  }
  wait_all(requests_);  // clears the list, keeps its capacity
  c.record(op, received, now_us() - start_us);
}

void RowExchange::pair(int p, int me, const Segments& src, int64_t s, const Segments& dst,
                       int64_t d, int64_t row_elems, RowOps& ops) {
  const size_t peer = static_cast<size_t>(p);
  if (p == me) {
    PARM_CHECK_EQ(fill_of(src, s), fill_of(dst, d));
    ops.copy(seg_rows(dst, d, row_elems), seg_rows(src, s, row_elems),
             fill_of(src, s) * row_elems);
    return;
  }
  sends_[peer].push_back({seg_rows(src, s, row_elems), fill_of(src, s) * row_elems});
  recvs_[peer].push_back({seg_rows(dst, d, row_elems), fill_of(dst, d) * row_elems});
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
    for (int64_t i = p * per; i < (p + 1) * per; ++i) pair(p, me, src, i, dst, i, row_elems, ops);
  run(c, CommOp::kAllToAllv, t0, ops);
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
        pair(p, me, src, o * inner + i, dst, (o * n + p) * inner + i, row_elems, ops);
      }
  run(c, CommOp::kAllGather, t0, ops);
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
      PARM_CHECK_EQ(fill_of(src, s), fill_of(dst, d));
      ops.copy(seg_rows(dst, d, row_elems), seg_rows(src, s, row_elems),
               fill_of(dst, d) * row_elems);
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
    int64_t off = 0;
    for (int64_t i = 0; i < S; ++i) {
      sends_[p].push_back({seg_rows(src, p * S + i, row_elems), fill_of(src, p * S + i) * row_elems});
      recvs_[p].push_back({region(p) + off, fill_of(dst, i) * row_elems});
      off += fill_of(dst, i) * row_elems;
    }
  }
  run(c, CommOp::kReduceScatter, t0, ops);
  int64_t off = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t len = fill_of(dst, i) * row_elems;
    PARM_CHECK_EQ(fill_of(src, me * S + i), fill_of(dst, i));
    for (int p = 0; p < n; ++p) {
      const float* part = p == me ? seg_rows(src, me * S + i, row_elems) : region(p) + off;
      if (p == 0)
        ops.copy(seg_rows(dst, i, row_elems), part, len);
      else
        ops.add(seg_rows(dst, i, row_elems), part, len);
    }
    off += len;
  }
}

void RowExchange::allreduce(Communicator& c, const Segments& buf, float* scratch,
                            int64_t row_elems, RowOps& ops) {
  const double t0 = now_us();
  const int n = c.size(), me = c.rank();
  const int64_t all = buf.routed_rows() * row_elems;  // one rank's region of scratch
  reset(n);
  int64_t off = 0;
  for (int64_t i = 0; i < buf.count; ++i) {
    const int64_t len = fill_of(buf, i) * row_elems;
    ops.copy(scratch + me * all + off, seg_rows(buf, i, row_elems), len);  // my own part
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      sends_[p].push_back({scratch + me * all + off, len});
      recvs_[p].push_back({scratch + p * all + off, len});
    }
    off += len;
  }
  run(c, CommOp::kAllReduce, t0, ops);
  off = 0;
  for (int64_t i = 0; i < buf.count; ++i) {
    const int64_t len = fill_of(buf, i) * row_elems;
    float* d = seg_rows(buf, i, row_elems);
    ops.copy(d, scratch + off, len);  // rank 0's part
    for (int p = 1; p < n; ++p) ops.add(d, scratch + p * all + off, len);
    off += len;
  }
}

}  // namespace parm
