// The dropless row exchanges (src/comm/row_exchange.h) on their own: which rows arrive where,
// how many messages carry them, and the all-reduce's rank-order sums and bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "comm/row_exchange.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

class HostRowOps : public RowOps {
 public:
  void copy(float* dst, const float* src, int64_t n) override {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  }
  void add(float* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void sync() override {}
};

constexpr float kUnrouted = -7.0f;

std::unique_ptr<Topology> world_topology() {
  return Topology::create({.mp = 1, .ep = test::world_size(), .esp = 1, .timeout_s = 60.0});
}

// Rows rank r routes to segment i (1 .. slots, so every range is non-empty).
int32_t fill_of(int r, int64_t i, int64_t slots) {
  return static_cast<int32_t>(1 + (3 * r + 5 * i) % slots);
}

// Rows destination segment i of rank `me` receives in an alltoall of `per` segments per peer:
// peer i / per's source segment me * per + i % per.
int32_t alltoall_in_fill(int me, int64_t i, int64_t per, int64_t slots) {
  return fill_of(static_cast<int>(i / per), me * per + i % per, slots);
}

// Element c of row j of segment i on rank r: names its source.
float payload(int r, int64_t i, int64_t j, int64_t c) {
  return static_cast<float>(r * 10000 + i * 100 + j * 10) + 0.5f * static_cast<float>(c % 2);
}

// alltoall: every routed row arrives at its place with its source's payload; the unrouted rows
// stay untouched; ranges under kPackBelowBytes travel as one message per peer, larger ones one
// each; the bytes counted are the routed rows received.
TEST(RowExchange, AlltoallSmallRangesTravelAsOneMessagePerPeer) {
  auto topo = world_topology();
  Communicator& c = topo->comm(Group::kWorld);
  const int n = c.size(), me = c.rank();
  const int64_t per = 3, slots = 4, count = per * n;
  const int64_t big = RowExchange::kPackBelowBytes / static_cast<int64_t>(sizeof(float));
  for (const int64_t row_elems : {int64_t{2}, big}) {
    std::vector<int32_t> src_fill(static_cast<size_t>(count)), dst_fill(src_fill.size());
    for (int64_t i = 0; i < count; ++i) {
      src_fill[static_cast<size_t>(i)] = fill_of(me, i, slots);
      // Destination part p holds peer p's source part `me`.
      dst_fill[static_cast<size_t>(i)] = alltoall_in_fill(me, i, per, slots);
    }
    std::vector<float> src(static_cast<size_t>(count * slots * row_elems), kUnrouted);
    std::vector<float> dst(src.size(), kUnrouted);
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < src_fill[static_cast<size_t>(i)]; ++j)
        for (int64_t e = 0; e < row_elems; ++e)
          src[static_cast<size_t>((i * slots + j) * row_elems + e)] = payload(me, i, j, e);
    RowExchange x;
    HostRowOps ops;
    c.stats().reset();
    x.alltoall(c, {src.data(), slots, src_fill.data(), count},
               {dst.data(), slots, dst_fill.data(), count}, row_elems, ops);
    double routed_in = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int p = static_cast<int>(i / per);
      for (int64_t j = 0; j < slots; ++j)
        for (int64_t e = 0; e < row_elems; ++e) {
          const float want = j < dst_fill[static_cast<size_t>(i)]
                                 ? payload(p, me * per + i % per, j, e) : kUnrouted;
          ASSERT_EQ(dst[static_cast<size_t>((i * slots + j) * row_elems + e)], want)
              << "rank " << me << " row_elems " << row_elems << " segment " << i << " row " << j;
        }
      if (p != me) routed_in += dst_fill[static_cast<size_t>(i)];
    }
    const bool packed = row_elems * static_cast<int64_t>(sizeof(float)) <
                        RowExchange::kPackBelowBytes;
    EXPECT_EQ(x.messages_sent(), packed ? n - 1 : (n - 1) * per) << "row_elems " << row_elems;
    EXPECT_EQ(c.stats().op(CommOp::kAllToAllv).bus_bytes, routed_in * row_elems * 4.0);
    EXPECT_EQ(c.stats().op(CommOp::kAllToAllv).calls, 1);
  }
}

// The packed layout (segments back to back at the prefix sums of their fills): with
// Segments::back_to_back a peer's whole part of an alltoall, an allgather or a
// reduce-scatter is one message (ranges too large to pack: (n - 1) x per without the flag),
// and the rows arrive exactly as they do without it.
TEST(RowExchange, BackToBackSegmentsTravelAsOneMessagePerPeer) {
  auto topo = world_topology();
  Communicator& c = topo->comm(Group::kWorld);
  const int n = c.size(), me = c.rank();
  const int64_t per = 3, slots = 4, count = per * n;
  const int64_t row_elems = RowExchange::kPackBelowBytes / static_cast<int64_t>(sizeof(float));
  struct Packed {  // one packed buffer: fills, starts, rows
    std::vector<int32_t> fill;
    std::vector<int64_t> first;
    std::vector<float> rows;
    Segments view(int64_t slots, bool b2b) {
      Segments s{rows.data(), slots, fill.data(), static_cast<int64_t>(fill.size()),
                 first.data()};
      s.back_to_back = b2b;
      return s;
    }
  };
  auto make = [&](std::vector<int32_t> fill) {
    Packed b{std::move(fill), {}, {}};
    b.first.resize(b.fill.size());
    int64_t at = 0;
    for (size_t i = 0; i < b.fill.size(); ++i) b.first[i] = at, at += b.fill[i];
    b.rows.assign(static_cast<size_t>(at * row_elems), kUnrouted);
    return b;
  };
  // Segment i of rank r, filled with its payload.
  auto source = [&](int r, int64_t num) {
    std::vector<int32_t> f(static_cast<size_t>(num));
    for (int64_t i = 0; i < num; ++i) f[static_cast<size_t>(i)] = fill_of(r, i, slots);
    Packed b = make(f);
    for (int64_t i = 0; i < num; ++i)
      for (int64_t j = 0; j < f[static_cast<size_t>(i)]; ++j)
        for (int64_t e = 0; e < row_elems; ++e)
          b.rows[static_cast<size_t>((b.first[static_cast<size_t>(i)] + j) * row_elems + e)] =
              payload(r, i, j, e);
    return b;
  };
  for (const bool b2b : {false, true}) {
    const int64_t want_messages = b2b ? n - 1 : (n - 1) * per;
    // alltoall: destination part p = peer p's source part `me`.
    {
      Packed src = source(me, count);
      std::vector<int32_t> df(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        df[static_cast<size_t>(i)] = alltoall_in_fill(me, i, per, slots);
      Packed dst = make(df);
      RowExchange x;
      // This rank's own part is copied while the messages travel: after all are posted.
      struct Watch final : HostRowOps {
        const RowExchange* x = nullptr;
        std::vector<int64_t> posted;  // messages posted at each copy
        void copy(float* d, const float* s, int64_t n) override {
          posted.push_back(x->messages_sent());
          HostRowOps::copy(d, s, n);
        }
      } ops;
      ops.x = &x;
      x.alltoall(c, src.view(slots, b2b), dst.view(slots, b2b), row_elems, ops);
      EXPECT_EQ(x.messages_sent(), want_messages) << "alltoall, back_to_back " << b2b;
      ASSERT_EQ(ops.posted.size(), static_cast<size_t>(per)) << "alltoall: local copies";
      for (int64_t posted : ops.posted)
        EXPECT_EQ(posted, want_messages) << "alltoall: a local copy before the messages left";
      for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < df[static_cast<size_t>(i)]; ++j)
          ASSERT_EQ(dst.rows[static_cast<size_t>((dst.first[static_cast<size_t>(i)] + j) *
                                                 row_elems + 1)],
                    payload(static_cast<int>(i / per), me * per + i % per, j, 1))
              << "alltoall rank " << me << " segment " << i << " row " << j;
    }
    // allgather: destination segment (p, i) = peer p's segment i.
    {
      Packed src = source(me, per);
      std::vector<int32_t> df(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        df[static_cast<size_t>(i)] = fill_of(static_cast<int>(i / per), i % per, slots);
      Packed dst = make(df);
      RowExchange x;
      HostRowOps ops;
      x.allgather(c, src.view(slots, b2b), dst.view(slots, b2b), 1, row_elems, ops);
      EXPECT_EQ(x.messages_sent(), want_messages) << "allgather, back_to_back " << b2b;
      for (int64_t i = 0; i < count; ++i)
        for (int64_t j = 0; j < df[static_cast<size_t>(i)]; ++j)
          ASSERT_EQ(dst.rows[static_cast<size_t>((dst.first[static_cast<size_t>(i)] + j) *
                                                 row_elems + 1)],
                    payload(static_cast<int>(i / per), i % per, j, 1))
              << "allgather rank " << me << " segment " << i << " row " << j;
    }
    // reduce_scatter: my segment i = sum over ranks of their segment (me, i); the same fills
    // on every rank for the segments that meet.
    {
      std::vector<int32_t> sf(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) sf[static_cast<size_t>(i)] = fill_of(0, i, slots);
      Packed src = make(sf);
      for (size_t k = 0; k < src.rows.size(); ++k)
        src.rows[k] = static_cast<float>(me + 1) * static_cast<float>(k % 97);
      Packed dst = make(std::vector<int32_t>(sf.begin() + me * per, sf.begin() + (me + 1) * per));
      std::vector<float> scratch(static_cast<size_t>((n - 1) * dst.first.back() * row_elems +
                                                     (n - 1) * dst.fill.back() * row_elems));
      RowExchange x;
      HostRowOps ops;
      x.reduce_scatter(c, src.view(slots, b2b), dst.view(slots, b2b), scratch.data(), row_elems,
                       ops);
      EXPECT_EQ(x.messages_sent(), want_messages) << "reduce_scatter, back_to_back " << b2b;
      const int64_t at = src.first[static_cast<size_t>(me * per)] * row_elems;
      for (size_t k = 0; k < dst.rows.size(); ++k)
        ASSERT_EQ(dst.rows[k], static_cast<float>(n * (n + 1) / 2) *
                                   static_cast<float>((static_cast<int64_t>(k) + at) % 97))
            << "reduce_scatter rank " << me << " element " << k;
    }
  }
}

// allreduce: every rank ends with the same bits, the rank-order sum ((b0 + b1) + b2) + ...
// of the routed rows (values whose sum depends on the order), unrouted rows untouched, and
// rank q counts R + (n - 2) x its rows [q R / n, (q + 1) R / n) received.
TEST(RowExchange, AllreduceIsTheRankOrderSumOnEveryRank) {
  auto topo = world_topology();
  Communicator& c = topo->comm(Group::kWorld);
  const int n = c.size(), me = c.rank();
  const int64_t count = 5, slots = 6;
  const int64_t big = RowExchange::kPackBelowBytes / static_cast<int64_t>(sizeof(float));
  // The same fills on every rank (as the layer's ESP groups have).
  std::vector<int32_t> fill(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) fill[static_cast<size_t>(i)] = fill_of(0, i, slots) - 1;
  auto value = [](int r, int64_t i, int64_t j, int64_t e) {
    // Big and small terms of both signs: a different order rounds differently.
    const float big_term = (r % 2 == 0 ? 1.0f : -1.0f) * 3.0e7f;
    return big_term * static_cast<float>(r + 1) + 0.37f * static_cast<float>(r * 31 + i * 7 + j * 3 + e);
  };
  for (const int64_t row_elems : {int64_t{3}, big}) {
    std::vector<float> buf(static_cast<size_t>(count * slots * row_elems), kUnrouted);
    std::vector<float> want(buf.size(), kUnrouted);
    int64_t R = 0;
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < fill[static_cast<size_t>(i)]; ++j, ++R)
        for (int64_t e = 0; e < row_elems; ++e) {
          const auto at = static_cast<size_t>((i * slots + j) * row_elems + e);
          buf[at] = value(me, i, j, e);
          float sum = value(0, i, j, e);
          for (int r = 1; r < n; ++r) sum += value(r, i, j, e);
          want[at] = sum;
        }
    std::vector<float> scratch(static_cast<size_t>(n * R * row_elems));
    RowExchange x;
    HostRowOps ops;
    c.stats().reset();
    x.allreduce(c, {buf.data(), slots, fill.data(), count}, scratch.data(), row_elems, ops);
    EXPECT_EQ(std::memcmp(buf.data(), want.data(), buf.size() * sizeof(float)), 0)
        << "rank " << me << " row_elems " << row_elems << ": not the rank-order sum";
    const int64_t mine = (me + 1) * R / n - me * R / n;
    EXPECT_EQ(c.stats().op(CommOp::kAllReduce).bus_bytes,
              static_cast<double>((n > 1 ? R + (n - 2) * mine : 0) * row_elems * 4))
        << "rank " << me << " row_elems " << row_elems;
    EXPECT_EQ(c.stats().op(CommOp::kAllReduce).calls, 1);
  }
}

}  // namespace
}  // namespace parm
