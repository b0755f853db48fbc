// The path of several ranks sharing one GPU, on the CPU: every communicator stages its
// buffers through host copies (StagedCommunicator, memcpy standing in for the device
// copies) and the fused collectives stage around the host pipeline (fused_any.cpp). Every
// schedule and layout must give the same results, bit for bit, and count the same bytes
// as the unstaged run.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include <cstring>

#include "comm/staged_communicator.h"
#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

using schedule::Kind;

struct LayerRun {
  Tensor out, dx;
  float l_aux = 0;
  Tensor dwg, dw1;
  std::map<std::string, double> bytes;
};

LayerRun run_layer(const TopologyOptions& o, const MoeShape& s, Kind kind, bool fuse) {
  auto topo = Topology::create(o);
  MoeLayer layer(*topo, s, kind, fuse, 2);
  layer.load_whole(ref::init_params<float>(s, 5));
  const int group = group_coord(topo->layout(), Group::kMp, topo->world_rank()).index;
  auto x = check_input(s, 5, group);
  auto dout = check_dout(s, 5, group);
  LayerRun r;
  topo->reset_stats();
  r.out = layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim})).clone();
  r.l_aux = layer.l_aux();
  r.dx = layer.backward(Tensor::view(dout.data(), {s.tokens, s.model_dim}), 0.5f).clone();
  r.dwg = layer.grads().wg.clone();
  r.dw1 = layer.grads().experts.w1.clone();
  for (int gi = 0; gi < kNumGroups; ++gi)
    for (int op = 0; op < kNumCommOps; ++op) {
      const OpStats& st = topo->host_comm(static_cast<Group>(gi)).stats().op(static_cast<CommOp>(op));
      if (st.calls > 0)
        r.bytes[std::string(group_name(static_cast<Group>(gi))) + "." +
                comm_op_name(static_cast<CommOp>(op))] += st.bus_bytes;
    }
  return r;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
}

TEST(Staged, EveryScheduleAndLayoutMatchesTheUnstagedRun) {
  const auto s = MoeShape::of(24, 8, 16, 4, 2, "1.1");
  int runs = 0;
  for (const test::LayerCase& c : test::layer_cases(s)) {
    TopologyOptions o = c.layout;
    const LayerRun plain = run_layer(o, s, c.kind, c.fuse);
    o.stage_host_buffers = true;
    const LayerRun staged = run_layer(o, s, c.kind, c.fuse);
    EXPECT_TRUE(same_bits(plain.out, staged.out)) << c.where << " out";
    EXPECT_TRUE(same_bits(plain.dx, staged.dx)) << c.where << " dx";
    EXPECT_TRUE(same_bits(plain.dwg, staged.dwg)) << c.where << " dwg";
    EXPECT_TRUE(same_bits(plain.dw1, staged.dw1)) << c.where << " dw1";
    EXPECT_EQ(plain.l_aux, staged.l_aux) << c.where;
    EXPECT_EQ(plain.bytes, staged.bytes) << c.where << ": staging changed the counters";
    ++runs;
  }
  EXPECT_GT(runs, 0);
}

TEST(Staged, OpsThroughHostCopiesEqualTheHostOps) {
  auto topo = test::make_topology(1, test::world_size(), 1);
  Communicator& host = topo->host_comm(Group::kWorld);
  StagedCommunicator staged(host, [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); });
  const int n = host.size(), me = host.rank();
  const size_t count = 5;
  std::vector<float> send(count * n), a(count * n), b(count * n);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(me * 100 + i);
  host.alltoall(send.data(), a.data(), count);
  staged.alltoall(send.data(), b.data(), count);
  EXPECT_EQ(a, b);
  host.allgather(send.data(), a.data(), count);
  staged.allgather(send.data(), b.data(), count);
  EXPECT_EQ(a, b);
  std::vector<float> ra(count), rb(count);
  host.reduce_scatter(send.data(), ra.data(), count);
  staged.reduce_scatter(send.data(), rb.data(), count);
  EXPECT_EQ(ra, rb);
  a = send;
  b = send;
  host.allreduce(a.data(), a.size());
  staged.allreduce(b.data(), b.size());
  EXPECT_EQ(a, b);
  // In-place allgather: send is this rank's block of recv.
  b.assign(count * n, -1.0f);
  for (size_t i = 0; i < count; ++i) b[me * count + i] = send[i];
  staged.allgather(b.data() + me * count, b.data(), count);
  host.allgather(send.data(), a.data(), count);
  EXPECT_EQ(a, b);
  // Point to point around a ring, non-blocking on both sides.
  if (n > 1) {
    std::vector<float> got(count, 0.0f);
    auto r = staged.irecv(got.data(), count, DType::kF32, (me + n - 1) % n, 7);
    auto s = staged.isend(send.data(), count, DType::kF32, (me + 1) % n, 7);
    s->wait();
    r->wait();
    const int from = (me + n - 1) % n;
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(got[i], static_cast<float>(from * 100 + i));
  }
}

}  // namespace
}  // namespace parm
