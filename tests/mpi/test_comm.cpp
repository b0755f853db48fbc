// Every collective on every group, with payloads that encode their source rank, at sizes
// 0, 1, odd and large; the byte counters against their definitions; the watchdog.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>

#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

using test::all_ranks;
using test::world_rank;
using test::world_size;

// Exact in fp32 even summed over 8 ranks: < 2^24.
float val(int src, int dst, size_t i) {
  return static_cast<float>(src * 1000 + dst * 100 + static_cast<int>(i % 97));
}

constexpr size_t kSizes[] = {0, 1, 7, 1000, 262147};

// Checks one op's counter delta against the definition in comm.h.
void expect_counted(Communicator& c, CommOp op, const OpStats& before, double bytes) {
  const OpStats& after = c.stats().op(op);
  EXPECT_EQ(after.calls - before.calls, 1) << c.name() << " " << comm_op_name(op);
  EXPECT_DOUBLE_EQ(after.bus_bytes - before.bus_bytes, bus_bytes(op, c.size(), bytes))
      << c.name() << " " << comm_op_name(op);
}

// A few layouts that between them give every group several shapes.
std::vector<TopologyOptions> collective_layouts() {
  std::vector<TopologyOptions> out;
  const int p = world_size();
  for (const auto& o : test::all_layouts()) {
    const bool usual = o.mp == o.esp && o.mp * o.ep == p;           // mp = esp, ep across
    const bool pure_ep = o.mp == 1 && o.esp == 1 && o.ep == p;       // pure expert parallel
    const bool mixed = o.mp == p && o.esp == 1 && (o.ep == 2 || p == 1);
    if (usual || pure_ep || mixed) out.push_back(o);
  }
  return out;
}

// Every group's communicator holds the layout's members in group-rank order.
void expect_communicators_match_layout(const TopologyOptions& o) {
  const int p = world_size(), me = world_rank();
  auto topo = Topology::create(o);
  const Layout& l = topo->layout();
  EXPECT_EQ(topo->num_nodes(), p / o.ranks_per_node);
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    Communicator& c = topo->comm(g);
    const auto members = group_members(l, g, me);
    ASSERT_EQ(c.size(), static_cast<int>(members.size())) << group_name(g);
    ASSERT_EQ(c.rank(), group_coord(l, g, me).rank) << group_name(g);
    std::vector<int32_t> got(members.size());
    const int32_t mine = me;
    c.allgather(&mine, got.data(), 1);
    EXPECT_EQ(std::vector<int>(got.begin(), got.end()), members)
        << "layout mp=" << o.mp << " ep=" << o.ep << " esp=" << o.esp << " pp=" << o.pp
        << " order " << l.order_name() << " group " << group_name(g);
    const auto nodes = emulated_nodes(p, o.ranks_per_node);
    EXPECT_EQ(c.intra_node(), group_is_intra_node(l, g, me, nodes)) << group_name(g);
  }
  EXPECT_EQ(topo->comm(Group::kPp).rank(), stage_of(l, me));
}

TEST(Topology, CommunicatorsMatchLayoutForEveryLayout) {
  const int p = world_size();
  for (auto o : test::all_layouts()) {
    o.ranks_per_node = p % 2 == 0 ? 2 : 1;
    expect_communicators_match_layout(o);
  }
}

// pp stages and orders other than the default: the pp communicator joins one rank per stage,
// and every group follows the order.
TEST(Topology, CommunicatorsFollowPpAndOrder) {
  const int p = world_size();
  int cases = 0;
  for (int pp : {1, 2, 4}) {
    if (p % pp) continue;
    const int stage = p / pp;
    for (auto [mp, ep, esp] : {std::tuple{1, 1, 1}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}, {stage, 1, stage}}) {
      if (stage % mp || stage % (ep * esp)) continue;
      for (const char* order : {"mp-esp-ep-dp-pp", "mp-dp-ep-esp-pp", "pp-mp-esp-ep-dp",
                                "dp-pp-ep-esp-mp"}) {
        try {
          make_layout(p, mp, ep, esp, pp, order);
        } catch (const InvalidConfig&) {
          continue;  // the unit tests check which orders a layout refuses
        }
        expect_communicators_match_layout({.mp = mp, .ep = ep, .esp = esp, .pp = pp,
                                           .order = order, .ranks_per_node = p % 2 == 0 ? 2 : 1,
                                           .timeout_s = 60});
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, p == 1 ? 4 : 8);
}

TEST(Topology, DetectsOneSharedMemoryNode) {
  TopologyOptions o;
  o.mp = world_size();
  auto topo = Topology::create(o);
  EXPECT_EQ(topo->num_nodes(), 1);
  EXPECT_FALSE(topo->nodes_emulated());
  EXPECT_TRUE(topo->comm(Group::kWorld).intra_node());
}

TEST(Collectives, EveryOpEveryGroupEverySize) {
  const int me = world_rank();
  for (const auto& o : collective_layouts()) {
    auto topo = Topology::create(o);
    for (int gi = 0; gi < kNumGroups; ++gi) {
      const Group g = static_cast<Group>(gi);
      Communicator& c = topo->comm(g);
      const int n = c.size(), r = c.rank();
      const auto members = group_members(topo->layout(), g, me);
      for (size_t count : kSizes) {
        SCOPED_TRACE(testing::Message() << "layout mp=" << o.mp << " ep=" << o.ep << " esp="
                                        << o.esp << " group " << group_name(g) << " count "
                                        << count);
        const size_t total = count * static_cast<size_t>(n);
        const double bytes = static_cast<double>(count * sizeof(float));
        std::vector<float> send(std::max<size_t>(total, 1)), recv(std::max<size_t>(total, 1));

        // allreduce (in place)
        for (size_t i = 0; i < count; ++i) recv[i] = val(me, 0, i);
        OpStats before = c.stats().op(CommOp::kAllReduce);
        c.allreduce(recv.data(), count);
        expect_counted(c, CommOp::kAllReduce, before, bytes);
        for (size_t i = 0; i < count; ++i) {
          float want = 0.0f;
          for (int m : members) want += val(m, 0, i);
          ASSERT_EQ(recv[i], want) << "allreduce element " << i;
        }

        // allgather, out of place and in place
        for (int in_place = 0; in_place < 2; ++in_place) {
          std::fill(recv.begin(), recv.end(), -1.0f);
          float* src = in_place ? recv.data() + static_cast<size_t>(r) * count : send.data();
          for (size_t i = 0; i < count; ++i) src[i] = val(me, 0, i);
          before = c.stats().op(CommOp::kAllGather);
          c.allgather(src, recv.data(), count);
          expect_counted(c, CommOp::kAllGather, before, bytes);
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(recv[static_cast<size_t>(p) * count + i], val(members[p], 0, i))
                  << "allgather block " << p << " element " << i << " in_place " << in_place;
        }

        // reduce_scatter: block d of rank s's input is val(s, member d, i)
        for (int d = 0; d < n; ++d)
          for (size_t i = 0; i < count; ++i)
            send[static_cast<size_t>(d) * count + i] = val(me, members[d], i);
        before = c.stats().op(CommOp::kReduceScatter);
        c.reduce_scatter(send.data(), recv.data(), count);
        expect_counted(c, CommOp::kReduceScatter, before, bytes);
        for (size_t i = 0; i < count; ++i) {
          float want = 0.0f;
          for (int m : members) want += val(m, me, i);
          ASSERT_EQ(recv[i], want) << "reduce_scatter element " << i;
        }

        // alltoall: block d goes to member d and says (source, destination)
        for (int d = 0; d < n; ++d)
          for (size_t i = 0; i < count; ++i)
            send[static_cast<size_t>(d) * count + i] = val(me, members[d], i);
        before = c.stats().op(CommOp::kAllToAll);
        c.alltoall(send.data(), recv.data(), count);
        expect_counted(c, CommOp::kAllToAll, before, bytes);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(recv[static_cast<size_t>(p) * count + i], val(members[p], me, i))
                << "alltoall block " << p << " element " << i;

        // alltoallv: uneven blocks, some empty; count(s -> d) = (count + s + 2d) % 5 * ...
        auto vcount = [&](int s, int d) {
          return count == 0 ? size_t{0} : (count + static_cast<size_t>(s + 2 * d)) % 5 * (count / 3 + 1);
        };
        std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
        size_t stot = 0, rtot = 0;
        for (int p = 0; p < n; ++p) {
          sc[p] = vcount(r, p);
          sd[p] = stot;
          stot += sc[p];
          rc[p] = vcount(p, r);
          rd[p] = rtot;
          rtot += rc[p];
        }
        std::vector<float> vs(std::max<size_t>(stot, 1)), vr(std::max<size_t>(rtot, 1), -1.0f);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < sc[p]; ++i) vs[sd[p] + i] = val(me, members[p], i);
        before = c.stats().op(CommOp::kAllToAllv);
        c.alltoallv(vs.data(), sc.data(), sd.data(), vr.data(), rc.data(), rd.data(),
                    DType::kF32);
        double received = 0;
        for (int p = 0; p < n; ++p)
          if (p != r) received += static_cast<double>(rc[p] * sizeof(float));
        EXPECT_EQ(c.stats().op(CommOp::kAllToAllv).calls - before.calls, 1);
        EXPECT_DOUBLE_EQ(c.stats().op(CommOp::kAllToAllv).bus_bytes - before.bus_bytes, received);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < rc[p]; ++i)
            ASSERT_EQ(vr[rd[p] + i], val(members[p], me, i)) << "alltoallv from " << p;

        // broadcast from the group's last rank: every rank ends with the root's payload
        const int root = n - 1;
        for (size_t i = 0; i < count; ++i) recv[i] = val(me, 0, i);
        before = c.stats().op(CommOp::kBroadcast);
        c.broadcast(recv.data(), count, DType::kF32, root);
        expect_counted(c, CommOp::kBroadcast, before, bytes);
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(recv[i], val(members[root], 0, i)) << "broadcast element " << i;

        // send/recv around the ring, non-blocking both ways
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        for (size_t i = 0; i < count; ++i) send[i] = val(me, members[next], i);
        before = c.stats().op(CommOp::kRecv);
        std::vector<RequestPtr> reqs;
        reqs.push_back(c.irecv(recv.data(), count, DType::kF32, prev, 7));
        reqs.push_back(c.isend(send.data(), count, DType::kF32, next, 7));
        wait_all(reqs);
        EXPECT_DOUBLE_EQ(c.stats().op(CommOp::kRecv).bus_bytes - before.bus_bytes, bytes);
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(recv[i], val(members[prev], me, i)) << "ring recv element " << i;

        c.barrier();
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure()));
  }
}

TEST(Collectives, NonBlockingOnTwoGroupsAtOnce) {
  TopologyOptions o;
  o.ep = world_size();
  auto topo = Topology::create(o);
  Communicator& ep = topo->comm(Group::kEp);
  Communicator& world = topo->comm(Group::kWorld);
  const int n = ep.size(), me = world_rank();
  std::vector<float> a(static_cast<size_t>(n) * 33), b(a.size());
  for (int d = 0; d < n; ++d)
    for (size_t i = 0; i < 33; ++i) a[static_cast<size_t>(d) * 33 + i] = val(me, d, i);
  std::vector<float> s(5, 1.0f);
  std::vector<RequestPtr> reqs;
  reqs.push_back(ep.ialltoall(a.data(), b.data(), 33, DType::kF32));
  reqs.push_back(world.iallreduce(s.data(), 5, DType::kF32));
  wait_all(reqs);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < 33; ++i) ASSERT_EQ(b[static_cast<size_t>(p) * 33 + i], val(p, me, i));
  for (float x : s) EXPECT_EQ(x, static_cast<float>(world_size()));
}

TEST(Watchdog, StuckReceiveTimesOutNamingRankGroupOpBytes) {
  TopologyOptions o;
  o.timeout_s = 0.3;
  auto topo = Topology::create(o);
  Communicator& world = topo->comm(Group::kWorld);
  // Nobody ever sends with this tag: the receive can only time out.
  static float sink[16];
  try {
    world.recv(sink, 16, DType::kF32, world.rank(), 4242);
    FAIL() << "receive without a sender completed";
  } catch (const Timeout& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fmt::format("rank {}", world_rank())), std::string::npos) << msg;
    EXPECT_NE(msg.find("group world"), std::string::npos) << msg;
    EXPECT_NE(msg.find("recv of 64 bytes"), std::string::npos) << msg;
  }
  // Ranks leave their timeouts up to a scheduling slice apart on a loaded machine: the
  // closing barrier gets a deadline that only a real hang reaches.
  topo->set_timeout_s(120.0);
  world.barrier();
}

}  // namespace
}  // namespace parm
