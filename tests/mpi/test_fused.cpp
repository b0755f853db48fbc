// The fused collectives (src/comm/fused.h) against their unfused parts, for every layout at
// this world size: bit for bit (memcmp), every element against the value its source rank
// sent (payloads are pure functions of the source rank, so every rank can recompute what
// any peer sent and the order the ESP sum must take), and the byte counters against the
// unfused pair's. Block sizes 0, 1, odd and largish; chunk counts 1, 2, 5 and more pieces
// than elements. The same checks run once more with fused_plan::KeepSizeOneStages, which
// keeps the stages of groups of one rank and moves own blocks as messages to self, so every
// stage and message path runs even at world size 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/fused.h"
#include "comm/fused_plan.h"
#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

using test::all_ranks;
using test::world_rank;

constexpr size_t kBlocks[] = {0, 1, 37, 10007};
constexpr int kChunks[] = {1, 2, 5, 64};  // 64 > 37: empty pieces

std::string layout_name(const TopologyOptions& o) {
  return fmt::format("mp={} ep={} esp={}", o.mp, o.ep, o.esp);
}

// ---- payloads: pure functions of (source world rank, position) ----

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Dispatch input of world rank `src`: block p (for EP rank p), element i. Names the source.
float dispatch_val(int src, int p, size_t i) {
  return static_cast<float>(src * 1000 + p * 100 + static_cast<int>(i % 97));
}

enum class Payload {
  kNamed,   // small integers naming the source: exact sums in any order
  kRandom,  // floats of mixed magnitude: the sum depends on its order
};

// Combine input of world rank `src`: block (q, p) of (N_ESP, N_EP, block), element i.
float combine_val(Payload kind, int src, int q, int p, size_t i) {
  if (kind == Payload::kNamed)  // bit `src` says who sent it; sums of <= 8 stay < 2^24
    return static_cast<float>((1 << src) + 256 * (q + 8 * p) + 65536 * static_cast<int>(i % 7));
  const uint64_t h = mix((static_cast<uint64_t>(src) << 56) ^ (static_cast<uint64_t>(q) << 48) ^
                         (static_cast<uint64_t>(p) << 40) ^ i);
  const float unit = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  return std::ldexp(unit, static_cast<int>((h >> 8) % 24) - 12);
}

// ---- what each output element must be ----

// Dispatch out (N_ESP, N_EP, block) on world rank `me`, element (q, p, i): ESP member q
// received block p from EP rank p of its EP group, which had addressed it to q's EP rank.
float expected_dispatch(const Layout& l, int me, int q, int p, size_t i) {
  const int rq = group_members(l, Group::kEsp, me)[static_cast<size_t>(q)];
  const int src = group_members(l, Group::kEp, rq)[static_cast<size_t>(p)];
  return dispatch_val(src, group_coord(l, Group::kEp, rq).rank, i);
}

// Combine out (N_EP, block) on world rank `me`: block p is what EP rank p of my EP group
// reduced: its ESP group's blocks (its ESP rank, my EP rank), summed in ESP-rank order.
std::vector<float> expected_combine(Payload kind, const Layout& l, int me, size_t block) {
  std::vector<float> out(static_cast<size_t>(l.ep) * block);
  const int my_ep = group_coord(l, Group::kEp, me).rank;
  const auto ep_members = group_members(l, Group::kEp, me);
  for (int p = 0; p < l.ep; ++p) {
    const int src = ep_members[static_cast<size_t>(p)];
    const int q = group_coord(l, Group::kEsp, src).rank;
    const auto esp = group_members(l, Group::kEsp, src);
    for (size_t i = 0; i < block; ++i) {
      float acc = combine_val(kind, esp[0], q, my_ep, i);
      for (size_t s = 1; s < esp.size(); ++s) acc += combine_val(kind, esp[s], q, my_ep, i);
      out[p * block + i] = acc;
    }
  }
  return out;
}

// ---- the unfused pairs, as the schedules run them (a group of one is skipped) ----

void unfused_dispatch(Communicator& ep, Communicator& esp, const float* in, float* out,
                      size_t block) {
  const size_t row = static_cast<size_t>(ep.size()) * block;
  std::vector<float> recv(row);
  if (ep.size() > 1)
    ep.alltoall(in, recv.data(), block);
  else
    std::copy(in, in + row, recv.begin());
  if (esp.size() > 1)
    esp.allgather(recv.data(), out, row);
  else
    std::copy(recv.begin(), recv.end(), out);
}

// The MP part as src/moe/dense_mover.cpp's interleaved allgather does it.
void unfused_mp_gather(Communicator& mp, const float* mine, int64_t outer, int64_t chunk,
                       float* full) {
  const int n = mp.size();
  const size_t total = static_cast<size_t>(outer * chunk);
  if (n == 1) {
    std::copy(mine, mine + total, full);
    return;
  }
  if (outer == 1) {
    mp.allgather(mine, full, static_cast<size_t>(chunk));
    return;
  }
  std::vector<float> scratch(total * static_cast<size_t>(n));
  mp.allgather(mine, scratch.data(), total);  // (n, outer, chunk)
  for (int p = 0; p < n; ++p)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(full + (o * n + p) * chunk, scratch.data() + (p * outer + o) * chunk,
                  static_cast<size_t>(chunk) * sizeof(float));
}

void unfused_combine(Communicator& esp, Communicator& ep, const float* in, float* out,
                     size_t block, const MpGatherPart* mp) {
  const size_t row = static_cast<size_t>(ep.size()) * block;
  std::vector<float> reduced(row);
  if (esp.size() > 1)
    esp.reduce_scatter(in, reduced.data(), row);
  else
    std::copy(in, in + row, reduced.begin());
  if (ep.size() > 1)
    ep.alltoall(reduced.data(), out, block);
  else
    std::copy(reduced.begin(), reduced.end(), out);
  if (mp != nullptr) unfused_mp_gather(*mp->mp, out, mp->outer, mp->chunk, mp->full);
}

// ---- counters ----

using Counters = std::map<std::pair<std::string, int>, OpStats>;

Counters snapshot(Topology& topo) {
  Counters c;
  for (int g = 0; g < kNumGroups; ++g) {
    Communicator& comm = topo.comm(static_cast<Group>(g));
    for (int op = 0; op < kNumCommOps; ++op)
      c[{group_name(static_cast<Group>(g)), op}] = comm.stats().op(static_cast<CommOp>(op));
  }
  return c;
}

Counters delta(const Counters& after, const Counters& before) {
  Counters d;
  for (const auto& [key, a] : after) {
    const OpStats& b = before.at(key);
    d[key] = {a.calls - b.calls, a.bus_bytes - b.bus_bytes, 0.0};
  }
  return d;
}

// Every (group, op) moved by the same calls and bus bytes; send/recv untouched.
void expect_same_counts(const Counters& fused, const Counters& unfused) {
  for (const auto& [key, u] : unfused) {
    const OpStats& f = fused.at(key);
    const char* op = comm_op_name(static_cast<CommOp>(key.second));
    EXPECT_EQ(f.calls, u.calls) << key.first << " " << op;
    EXPECT_DOUBLE_EQ(f.bus_bytes, u.bus_bytes) << key.first << " " << op;
  }
}

// The counters docs/spec.md §3's table asks for (a group of one records nothing).
void expect_counts(const Counters& d, const char* group, CommOp op, int n, double bus) {
  const OpStats& s = d.at({group, static_cast<int>(op)});
  EXPECT_EQ(s.calls, n > 1 ? 1 : 0) << group << " " << comm_op_name(op);
  EXPECT_DOUBLE_EQ(s.bus_bytes, n > 1 ? bus : 0.0) << group << " " << comm_op_name(op);
}

// Index of the first element where a and b differ bitwise, or npos.
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  if (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0)
    return std::string::npos;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return std::string::npos;
}

void check_dispatch_every_layout() {
  const int me = world_rank();
  for (const auto& o : test::all_layouts()) {
    auto topo = Topology::create(o);
    const Layout& l = topo->layout();
    Communicator& ep = topo->comm(Group::kEp);
    Communicator& esp = topo->comm(Group::kEsp);
    for (size_t block : kBlocks) {
      const size_t row = static_cast<size_t>(l.ep) * block;
      std::vector<float> in(row);
      for (int p = 0; p < l.ep; ++p)
        for (size_t i = 0; i < block; ++i) in[p * block + i] = dispatch_val(me, p, i);
      std::vector<float> want(static_cast<size_t>(l.esp) * row);
      for (int q = 0; q < l.esp; ++q)
        for (int p = 0; p < l.ep; ++p)
          for (size_t i = 0; i < block; ++i)
            want[(static_cast<size_t>(q) * l.ep + p) * block + i] =
                expected_dispatch(l, me, q, p, i);

      std::vector<float> unfused(want.size(), -1.0f);
      Counters before = snapshot(*topo);
      unfused_dispatch(ep, esp, in.data(), unfused.data(), block);
      const Counters unfused_counts = delta(snapshot(*topo), before);
      const size_t bad_unfused = first_difference(unfused, want);
      EXPECT_EQ(bad_unfused, std::string::npos)
          << layout_name(o) << " block " << block << ": unfused reference is wrong";

      for (int chunks : kChunks) {
        SCOPED_TRACE(testing::Message() << layout_name(o) << " block " << block << " chunks "
                                        << chunks);
        std::vector<float> fused(want.size(), -2.0f);
        before = snapshot(*topo);
        fused_dispatch(ep, esp, in.data(), fused.data(), block, chunks);
        const Counters fused_counts = delta(snapshot(*topo), before);
        const size_t bad = first_difference(fused, unfused);
        EXPECT_EQ(bad, std::string::npos)
            << "fused differs from unfused at element " << bad << " (of " << fused.size()
            << "): " << (bad < fused.size() ? fused[bad] : 0.0f) << " vs "
            << (bad < fused.size() ? unfused[bad] : 0.0f);
        EXPECT_EQ(first_difference(fused, want), std::string::npos)
            << "a row has the wrong origin";
        expect_same_counts(fused_counts, unfused_counts);
        expect_counts(fused_counts, "ep", CommOp::kAllToAll, l.ep, (l.ep - 1) * block * 4.0);
        expect_counts(fused_counts, "esp", CommOp::kAllGather, l.esp,
                      (l.esp - 1) * static_cast<double>(row) * 4.0);
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

TEST(FusedDispatch, EqualsUnfusedBitForBitEveryLayout) { check_dispatch_every_layout(); }

TEST(FusedDispatch, WithSizeOneStagesKeptEqualsUnfusedBitForBitEveryLayout) {
  fused_plan::KeepSizeOneStages keep;
  check_dispatch_every_layout();
}

// One combine case: layout, block, payload kind, optional MP gather with `outer` rows.
void check_combine(Topology& topo, const TopologyOptions& o, size_t block, Payload kind,
                   int64_t outer) {
  const int me = world_rank();
  const Layout& l = topo.layout();
  Communicator& ep = topo.comm(Group::kEp);
  Communicator& esp = topo.comm(Group::kEsp);
  Communicator& mp = topo.comm(Group::kMp);
  const size_t row = static_cast<size_t>(l.ep) * block;
  const bool with_mp = outer > 0;
  const int64_t chunk = with_mp ? static_cast<int64_t>(row) / outer : 0;
  const char* kind_name = kind == Payload::kNamed ? "named" : "random";

  std::vector<float> in(static_cast<size_t>(l.esp) * row);
  for (int q = 0; q < l.esp; ++q)
    for (int p = 0; p < l.ep; ++p)
      for (size_t i = 0; i < block; ++i)
        in[(static_cast<size_t>(q) * l.ep + p) * block + i] = combine_val(kind, me, q, p, i);
  const std::vector<float> want = expected_combine(kind, l, me, block);
  // full (outer, N_MP, chunk): row r of it holds row r of every MP member's out, in MP order.
  std::vector<float> want_full;
  if (with_mp) {
    const auto members = group_members(l, Group::kMp, me);
    want_full.resize(static_cast<size_t>(l.mp) * row);
    for (int m = 0; m < l.mp; ++m) {
      const auto theirs = expected_combine(kind, l, members[static_cast<size_t>(m)], block);
      for (int64_t r = 0; r < outer; ++r)
        std::copy_n(theirs.begin() + r * chunk, chunk,
                    want_full.begin() + (r * l.mp + m) * chunk);
    }
  }

  std::vector<float> unfused(row, -1.0f), unfused_full(want_full.size(), -1.0f);
  MpGatherPart ump{&mp, outer, chunk, unfused_full.data()};
  Counters before = snapshot(topo);
  unfused_combine(esp, ep, in.data(), unfused.data(), block, with_mp ? &ump : nullptr);
  const Counters unfused_counts = delta(snapshot(topo), before);
  EXPECT_EQ(first_difference(unfused, want), std::string::npos)
      << layout_name(o) << " block " << block << " " << kind_name
      << ": unfused reference is not the ESP-rank-order sum";
  if (with_mp) EXPECT_EQ(first_difference(unfused_full, want_full), std::string::npos);

  for (int chunks : kChunks) {
    SCOPED_TRACE(testing::Message() << layout_name(o) << " block " << block << " " << kind_name
                                    << " chunks " << chunks << " mp outer " << outer);
    std::vector<float> fused(row, -2.0f), fused_full(want_full.size(), -2.0f);
    MpGatherPart fmp{&mp, outer, chunk, fused_full.data()};
    before = snapshot(topo);
    fused_combine(esp, ep, in.data(), fused.data(), block, chunks, with_mp ? &fmp : nullptr);
    const Counters fused_counts = delta(snapshot(topo), before);
    const size_t bad = first_difference(fused, unfused);
    EXPECT_EQ(bad, std::string::npos)
        << "fused differs from unfused at element " << bad << " (of " << fused.size() << ")";
    EXPECT_EQ(first_difference(fused, want), std::string::npos)
        << "a row has the wrong origin or the ESP sum the wrong order";
    if (with_mp) {
      EXPECT_EQ(first_difference(fused_full, unfused_full), std::string::npos)
          << "fused MP gather differs from unfused";
      EXPECT_EQ(first_difference(fused_full, want_full), std::string::npos)
          << "MP gather row has the wrong origin";
    }
    expect_same_counts(fused_counts, unfused_counts);
    expect_counts(fused_counts, "esp", CommOp::kReduceScatter, l.esp,
                  (l.esp - 1) * static_cast<double>(row) * 4.0);
    expect_counts(fused_counts, "ep", CommOp::kAllToAll, l.ep, (l.ep - 1) * block * 4.0);
    if (with_mp)
      expect_counts(fused_counts, "mp", CommOp::kAllGather, l.mp,
                    (l.mp - 1) * static_cast<double>(outer * chunk) * 4.0);
  }
}

void check_combine_every_layout() {
  for (const auto& o : test::all_layouts()) {
    auto topo = Topology::create(o);
    for (Payload kind : {Payload::kNamed, Payload::kRandom})
      for (size_t block : kBlocks) check_combine(*topo, o, block, kind, 0);
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

TEST(FusedCombine, EqualsUnfusedBitForBitEveryLayout) { check_combine_every_layout(); }

TEST(FusedCombine, WithSizeOneStagesKeptEqualsUnfusedBitForBitEveryLayout) {
  fused_plan::KeepSizeOneStages keep;
  check_combine_every_layout();
}

void check_combine_with_mp_every_layout() {
  for (const auto& o : test::all_layouts()) {
    auto topo = Topology::create(o);
    for (int64_t outer : {1, 3})
      for (Payload kind : {Payload::kNamed, Payload::kRandom})
        for (size_t block : kBlocks) {
          // (outer, chunk) must tile the (N_EP, block) output: 3 x 37 instead of 37, etc.
          const size_t b = (static_cast<size_t>(o.ep) * block) % outer == 0 ? block : 3 * block;
          check_combine(*topo, o, b, kind, outer);
        }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

TEST(FusedCombine, WithMpGatherEqualsUnfusedBitForBitEveryLayout) {
  check_combine_with_mp_every_layout();
}

TEST(FusedCombine, WithMpGatherAndSizeOneStagesKeptEqualsUnfusedBitForBitEveryLayout) {
  fused_plan::KeepSizeOneStages keep;
  check_combine_with_mp_every_layout();
}

// The reduce_scatter the fused combine must match: block sums in group-rank order, bit for
// bit, on every group (with N_ESP >= 3 a different order changes these sums).
TEST(FusedReduceScatter, SumsInGroupRankOrderOnEveryGroup) {
  const int me = world_rank();
  for (const auto& o : test::all_layouts()) {
    auto topo = Topology::create(o);
    for (int g = 0; g < kNumGroups; ++g) {
      Communicator& c = topo->comm(static_cast<Group>(g));
      const auto members = group_members(topo->layout(), static_cast<Group>(g), me);
      for (size_t count : {size_t{0}, size_t{1}, size_t{37}, size_t{10007}}) {
        std::vector<float> send(count * c.size()), recv(count, -1.0f), want(count);
        for (int d = 0; d < c.size(); ++d)
          for (size_t i = 0; i < count; ++i)
            send[d * count + i] = combine_val(Payload::kRandom, me, d, 0, i);
        for (size_t i = 0; i < count; ++i) {
          want[i] = combine_val(Payload::kRandom, members[0], c.rank(), 0, i);
          for (size_t s = 1; s < members.size(); ++s)
            want[i] += combine_val(Payload::kRandom, members[s], c.rank(), 0, i);
        }
        const OpStats before = c.stats().op(CommOp::kReduceScatter);
        const OpStats a2a_before = c.stats().op(CommOp::kAllToAll);
        c.reduce_scatter(send.data(), recv.data(), count);
        if (members.size() >= 3 && count >= 37) {
          // The data must make the order matter, or this test proves nothing.
          std::vector<float> reversed(count);
          for (size_t i = 0; i < count; ++i) {
            reversed[i] = combine_val(Payload::kRandom, members.back(), c.rank(), 0, i);
            for (size_t s = members.size() - 1; s-- > 0;)
              reversed[i] += combine_val(Payload::kRandom, members[s], c.rank(), 0, i);
          }
          EXPECT_NE(first_difference(reversed, want), std::string::npos)
              << "random payload is insensitive to the summation order";
        }
        EXPECT_EQ(first_difference(recv, want), std::string::npos)
            << layout_name(o) << " group " << group_name(static_cast<Group>(g)) << " count "
            << count;
        EXPECT_EQ(c.stats().op(CommOp::kReduceScatter).calls - before.calls, 1);
        EXPECT_DOUBLE_EQ(c.stats().op(CommOp::kReduceScatter).bus_bytes - before.bus_bytes,
                         (c.size() - 1) * count * 4.0);
        EXPECT_EQ(c.stats().op(CommOp::kAllToAll).calls, a2a_before.calls);
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

TEST(FusedCollectives, RefuseFewerThanOneChunk) {
  TopologyOptions o;
  o.ep = test::world_size();
  auto topo = Topology::create(o);
  Communicator& ep = topo->comm(Group::kEp);
  Communicator& esp = topo->comm(Group::kEsp);
  std::vector<float> in(static_cast<size_t>(ep.size()) * 4), out(in.size());
  for (int chunks : {0, -1}) {
    EXPECT_THROW(fused_dispatch(ep, esp, in.data(), out.data(), 4, chunks), InvalidConfig);
    EXPECT_THROW(fused_combine(esp, ep, in.data(), out.data(), 4, chunks), InvalidConfig);
  }
  try {
    fused_dispatch(ep, esp, in.data(), out.data(), 4, 0);
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("chunks = 0"), std::string::npos) << e.what();
  }
  // Nothing was sent: the communicators are still usable and nothing was counted.
  EXPECT_EQ(ep.stats().op(CommOp::kAllToAll).calls, 0);
  EXPECT_TRUE(all_ranks(!testing::Test::HasFailure()));
}

}  // namespace
}  // namespace parm
