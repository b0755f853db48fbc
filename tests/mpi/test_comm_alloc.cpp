// The communicator's steady state makes no C++ heap allocation: after one warm-up call, the
// same call with the same sizes, repeated, never reaches operator new (counted by
// alloc_counter.h). Every operation the MoE layer uses, on every group of several layouts,
// the fused collectives with and without their MP part, reduce_scatters in flight together,
// and a mixed sequence of them as one training step issues it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "alloc_counter.h"
#include "comm/fused.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

using test::all_ranks;
using test::world_rank;
using test::world_size;

constexpr int kRepeats = 3;
constexpr size_t kCount = 37;  // elements per rank block: odd, several cache lines

// Exact in fp32 even summed over 8 ranks: < 2^24.
float val(int src, int dst, size_t i) {
  return static_cast<float>(src * 1000 + dst * 100 + static_cast<int>(i % 97));
}

std::string layout_name(const TopologyOptions& o) {
  return fmt::format("mp={} ep={} esp={}", o.mp, o.ep, o.esp);
}

// operator new calls made by kRepeats calls of `op` after one warm-up call.
int64_t steady_state_allocations(const std::function<void()>& op) {
  op();
  const int64_t before = test::heap_allocations();
  for (int i = 0; i < kRepeats; ++i) op();
  return test::heap_allocations() - before;
}

// Layouts that between them give every group (dp, edp included) sizes 1 and > 1: mp = esp
// with every ep, pure expert parallel, and all-MP.
std::vector<TopologyOptions> alloc_layouts() {
  std::vector<TopologyOptions> out;
  const int p = world_size();
  for (const auto& o : test::all_layouts()) {
    const bool mp_is_esp = o.mp == o.esp;
    const bool pure_ep = o.mp == 1 && o.esp == 1 && o.ep == p;
    const bool all_mp = o.mp == p && o.esp == 1 && o.ep == 1;
    if (mp_is_esp || pure_ep || all_mp) out.push_back(o);
  }
  return out;
}

// Buffers for every op on one group of n ranks, sized once so that the ops allocate nothing
// themselves.
struct Buffers {
  explicit Buffers(int n, int rank)
      : send(kCount * static_cast<size_t>(n)), recv(send.size()), send2(send.size()),
        recv2(send.size()), small(kCount), small2(kCount), in_place(send.size()) {
    for (size_t i = 0; i < send.size(); ++i) {
      send[i] = val(rank, 0, i);
      send2[i] = val(rank, 1, i);
    }
    for (size_t i = 0; i < kCount; ++i) small[i] = val(rank, 2, i);
    requests.reserve(8);
  }
  std::vector<float> send, recv, send2, recv2;  // (n, kCount)
  std::vector<float> small, small2;             // (kCount)
  std::vector<float> in_place;                  // (n, kCount)
  std::vector<RequestPtr> requests;
};

TEST(CommAlloc, EveryOpEveryGroupAllocatesNothingAfterWarmUp) {
  for (const auto& o : alloc_layouts()) {
    auto topo = Topology::create(o);
    for (int gi = 0; gi < kNumGroups; ++gi) {
      const Group g = static_cast<Group>(gi);
      Communicator& c = topo->comm(g);
      const int n = c.size(), r = c.rank();
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      Buffers b(n, world_rank());
      const DType f32 = DType::kF32;
      float* mine = b.in_place.data() + static_cast<size_t>(r) * kCount;
      const std::vector<std::pair<const char*, std::function<void()>>> ops = {
          {"allreduce", [&] { c.allreduce(b.small.data(), kCount); }},
          {"allreduce max", [&] { c.allreduce(b.small.data(), kCount, ReduceOp::kMax); }},
          {"iallreduce", [&] { c.iallreduce(b.small.data(), kCount, f32)->wait(); }},
          {"allgather", [&] { c.allgather(b.small.data(), b.recv.data(), kCount); }},
          {"allgather in place", [&] { c.allgather(mine, b.in_place.data(), kCount); }},
          {"iallgather",
           [&] { c.iallgather(b.small.data(), b.recv.data(), kCount, f32)->wait(); }},
          {"reduce_scatter", [&] { c.reduce_scatter(b.send.data(), b.small2.data(), kCount); }},
          {"ireduce_scatter",
           [&] { c.ireduce_scatter(b.send.data(), b.small2.data(), kCount, f32)->wait(); }},
          {"alltoall", [&] { c.alltoall(b.send.data(), b.recv.data(), kCount); }},
          {"ialltoall",
           [&] { c.ialltoall(b.send.data(), b.recv.data(), kCount, f32)->wait(); }},
          {"isend/irecv ring",
           [&] {
             b.requests.push_back(c.irecv(b.recv.data(), kCount, f32, prev, 7));
             b.requests.push_back(c.isend(b.send.data(), kCount, f32, next, 7));
             wait_all(b.requests);
           }},
          {"isend/irecv uncounted ring",
           [&] {
             b.requests.push_back(c.irecv_uncounted(b.recv.data(), kCount, f32, prev, 8));
             b.requests.push_back(c.isend_uncounted(b.send.data(), kCount, f32, next, 8));
             wait_all(b.requests);
           }},
          {"send/recv ring",
           [&] {
             RequestPtr rr = c.irecv(b.recv.data(), kCount, f32, prev, 9);
             c.send(b.send.data(), kCount, f32, next, 9);
             rr->wait();
           }},
          {"barrier", [&] { c.barrier(); }},
          {"ibarrier", [&] { c.ibarrier()->wait(); }},
          {"wait_all of every kind at once",
           [&] {
             b.requests.push_back(c.iallreduce(b.small.data(), kCount, f32));
             b.requests.push_back(c.ireduce_scatter(b.send2.data(), b.small2.data(), kCount, f32));
             b.requests.push_back(c.ialltoall(b.send.data(), b.recv.data(), kCount, f32));
             b.requests.push_back(c.irecv_uncounted(b.recv2.data(), kCount, f32, prev, 10));
             b.requests.push_back(c.isend_uncounted(b.send2.data(), kCount, f32, next, 10));
             b.requests.push_back(c.ibarrier());
             wait_all(b.requests);
           }},
          {"test() polling",
           [&] {
             RequestPtr q = c.ibarrier();
             while (!q->test()) {
             }
           }},
      };
      for (const auto& [name, op] : ops) {
        const int64_t allocated = steady_state_allocations(op);
        EXPECT_EQ(allocated, 0) << layout_name(o) << " group " << group_name(g) << " (size "
                                << n << "): " << name << " allocated " << allocated
                                << " times in " << kRepeats << " steady-state calls";
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

// Two reduce_scatters in flight at once on one communicator need two scratch buffers; after
// the warm-up both come from the pool, and neither result borrows the other's blocks.
TEST(CommAlloc, TwoReduceScattersInFlightAllocateNothingAndStayApart) {
  const int me = world_rank();
  for (const auto& o : alloc_layouts()) {
    auto topo = Topology::create(o);
    for (int gi = 0; gi < kNumGroups; ++gi) {
      const Group g = static_cast<Group>(gi);
      Communicator& c = topo->comm(g);
      const int n = c.size();
      const auto members = group_members(topo->layout(), g, me);
      // Different sizes, so a pool that hands out one buffer for both would be caught by
      // the results, and one that cannot fit the larger into the smaller by the counter.
      const size_t count_a = kCount, count_b = 3 * kCount;
      std::vector<float> send_a(count_a * static_cast<size_t>(n));
      std::vector<float> send_b(count_b * static_cast<size_t>(n));
      for (int d = 0; d < n; ++d) {
        for (size_t i = 0; i < count_a; ++i) send_a[d * count_a + i] = val(me, members[d], i);
        for (size_t i = 0; i < count_b; ++i)
          send_b[d * count_b + i] = -val(me, members[d], i + 1);
      }
      std::vector<float> recv_a(count_a), recv_b(count_b);
      std::vector<RequestPtr> reqs;
      auto both = [&] {
        reqs.push_back(c.ireduce_scatter(send_a.data(), recv_a.data(), count_a, DType::kF32));
        reqs.push_back(c.ireduce_scatter(send_b.data(), recv_b.data(), count_b, DType::kF32));
        wait_all(reqs);
      };
      // The reverse issue order too: the larger request first.
      auto both_reversed = [&] {
        reqs.push_back(c.ireduce_scatter(send_b.data(), recv_b.data(), count_b, DType::kF32));
        reqs.push_back(c.ireduce_scatter(send_a.data(), recv_a.data(), count_a, DType::kF32));
        wait_all(reqs);
      };
      const std::string where = layout_name(o) + " group " + group_name(g);
      EXPECT_EQ(steady_state_allocations(both), 0) << where;
      EXPECT_EQ(steady_state_allocations(both_reversed), 0) << where;
      const int my_rank = c.rank();
      for (size_t i = 0; i < count_a; ++i) {
        float want = 0.0f;
        for (int m : members) want += val(m, members[my_rank], i);
        ASSERT_EQ(recv_a[i], want) << where << " first reduce_scatter element " << i;
      }
      for (size_t i = 0; i < count_b; ++i) {
        float want = 0.0f;
        for (int m : members) want += -val(m, members[my_rank], i + 1);
        ASSERT_EQ(recv_b[i], want) << where << " second reduce_scatter element " << i;
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

TEST(CommAlloc, FusedDispatchAndCombineAllocateNothingAfterWarmUp) {
  const int me = world_rank();
  for (const auto& o : test::all_layouts()) {
    auto topo = Topology::create(o);
    const Layout& l = topo->layout();
    Communicator& ep = topo->comm(Group::kEp);
    Communicator& esp = topo->comm(Group::kEsp);
    Communicator& mp = topo->comm(Group::kMp);
    const size_t block = 3 * kCount;  // divisible by outer = 3
    const size_t row = static_cast<size_t>(l.ep) * block;
    std::vector<float> in(static_cast<size_t>(l.esp) * row), out(row);
    std::vector<float> dispatched(static_cast<size_t>(l.esp) * row);
    std::vector<float> full(static_cast<size_t>(l.mp) * row);
    for (size_t i = 0; i < in.size(); ++i) in[i] = val(me, 0, i);
    const int64_t outer = 3;
    MpGatherPart mp_part{&mp, outer, static_cast<int64_t>(row) / outer, full.data()};
    for (int chunks : {1, 3}) {
      const std::vector<std::pair<const char*, std::function<void()>>> ops = {
          {"fused_dispatch",
           [&] { fused_dispatch(ep, esp, in.data(), dispatched.data(), block, chunks); }},
          {"fused_combine", [&] { fused_combine(esp, ep, in.data(), out.data(), block, chunks); }},
          {"fused_combine with mp gather",
           [&] { fused_combine(esp, ep, in.data(), out.data(), block, chunks, &mp_part); }},
      };
      for (const auto& [name, op] : ops) {
        const int64_t allocated = steady_state_allocations(op);
        EXPECT_EQ(allocated, 0) << layout_name(o) << " chunks " << chunks << ": " << name
                                << " allocated " << allocated << " times in " << kRepeats
                                << " steady-state calls";
      }
    }
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

// One MoE training step's communication in order (several groups, sizes and pooled
// scratch buffers interleaved): repeated, it allocates nothing after the first step.
TEST(CommAlloc, MixedStepSequenceAllocatesNothingAfterFirstStep) {
  const int me = world_rank();
  for (const auto& o : alloc_layouts()) {
    auto topo = Topology::create(o);
    const Layout& l = topo->layout();
    Communicator& ep = topo->comm(Group::kEp);
    Communicator& esp = topo->comm(Group::kEsp);
    Communicator& mp = topo->comm(Group::kMp);
    Communicator& dp = topo->comm(Group::kDp);
    Communicator& edp = topo->comm(Group::kEdp);
    const size_t block = 2 * kCount;
    const size_t row = static_cast<size_t>(l.ep) * block;
    std::vector<float> a(static_cast<size_t>(l.esp) * row), b(a.size());
    std::vector<float> full(static_cast<size_t>(l.mp) * row), out(row);
    std::vector<float> grads(5 * kCount);                                 // dp allreduce
    std::vector<float> expert_grads(kCount * static_cast<size_t>(l.edp));  // edp reduce_scatter
    std::vector<float> expert_shard(kCount);
    for (size_t i = 0; i < a.size(); ++i) a[i] = val(me, 1, i);
    MpGatherPart mp_part{&mp, 1, static_cast<int64_t>(row), full.data()};
    std::vector<RequestPtr> reqs;
    auto step = [&] {
      mp.allreduce(grads.data(), kCount);
      fused_dispatch(ep, esp, a.data(), b.data(), block, 2);
      esp.reduce_scatter(b.data(), out.data(), row);
      ep.alltoall(a.data(), b.data(), block);
      fused_combine(esp, ep, a.data(), out.data(), block, 2, &mp_part);
      mp.allgather(out.data(), full.data(), row);
      reqs.push_back(dp.iallreduce(grads.data(), 5 * kCount, DType::kF32));
      reqs.push_back(
          edp.ireduce_scatter(expert_grads.data(), expert_shard.data(), kCount, DType::kF32));
      reqs.push_back(esp.ireduce_scatter(a.data(), b.data(), row, DType::kF32));
      wait_all(reqs);
      mp.barrier();
    };
    EXPECT_EQ(steady_state_allocations(step), 0) << layout_name(o);
    EXPECT_TRUE(all_ranks(!testing::Test::HasFailure())) << layout_name(o);
  }
}

}  // namespace
}  // namespace parm
