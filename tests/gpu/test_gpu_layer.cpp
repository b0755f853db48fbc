// The MoE layer on the GPU against the fp64 oracle (moe/layer_check.h): every schedule,
// fused and not, over every layout of this world size; fp32 at the CPU's tolerance, bf16
// at its stated one (layer_check.h: default_tolerance). One rank: the NCCL communicator;
// several ranks on the one GPU: MPI staging device buffers through host memory. The bytes
// each (group, op) counts must equal the CPU run's (the same step lists move the same data).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "moe/cuda/cuda_backend.h"
#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

using schedule::Kind;

std::map<std::string, double> counted(Topology& topo) {
  std::map<std::string, double> b;
  for (int gi = 0; gi < kNumGroups; ++gi)
    for (int op = 0; op < kNumCommOps; ++op) {
      const OpStats& s =
          topo.host_comm(static_cast<Group>(gi)).stats().op(static_cast<CommOp>(op));
      if (s.calls > 0)
        b[std::string(group_name(static_cast<Group>(gi))) + "." +
          comm_op_name(static_cast<CommOp>(op))] += s.bus_bytes;
    }
  return b;
}

TEST(GpuLayer, EveryScheduleAndLayoutMatchesTheOracle) {
  // Capacity 1.1 drops choices; an uneven T / E exercises partial segments.
  const auto s = MoeShape::of(48, 32, 64, 8, 2, "1.1");
  int checked = 0;
  for (const test::LayerCase& c : test::layer_cases(s))
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      TopologyOptions o = c.layout;
      o.device = Device::kCuda;
      auto topo = Topology::create(o);
      LayerCheckOptions lc;
      lc.shape = s;
      lc.kind = c.kind;
      lc.fuse = c.fuse;
      lc.chunks = 3;
      lc.seed = 11;
      lc.precision = p;
      lc.tolerance = default_tolerance(p);
      const LayerCheckResult r = check_layer(*topo, lc);
      std::string errs;
      for (const auto& e : r.errors) errs += fmt::format(" {}={:.2e}", e.name, e.max_rel);
      EXPECT_TRUE(r.routing_matches) << c.where << " " << precision_name(p);
      EXPECT_TRUE(r.passed) << c.where << " " << precision_name(p) << " on "
                            << topo->comm_backend() << ":" << errs;
      ++checked;
    }
  EXPECT_GT(checked, 0);
}

TEST(GpuLayer, CountsTheSameBytesAsTheCpu) {
  const auto s = MoeShape::of(40, 16, 32, 8, 2, "1.1");
  for (const test::LayerCase& c : test::layer_cases(s)) {
    std::map<std::string, double> bytes[2];
    for (int d = 0; d < 2; ++d) {
      TopologyOptions o = c.layout;
      o.device = d == 0 ? Device::kCpu : Device::kCuda;
      auto topo = Topology::create(o);
      MoeLayer layer(*topo, s, c.kind, c.fuse, 3);
      layer.load_whole(ref::init_params<float>(s, 3));
      auto x = check_input(s, 3, 0);
      auto dout = check_dout(s, 3, 0);
      topo->reset_stats();
      layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim}));
      layer.backward(Tensor::view(dout.data(), {s.tokens, s.model_dim}), 0.5f);
      bytes[d] = counted(*topo);
    }
    EXPECT_EQ(bytes[0], bytes[1]) << c.where;
  }
}

TEST(GpuLayer, ExpertsComputeTheFilledRowsOnly) {
  // f = 8: most slots are empty; the GPU experts must compute exactly the kept choices.
  const auto s = MoeShape::of(32, 16, 32, 4, 2, "8");
  for (const test::LayerCase& c : test::layer_cases(s)) {
    TopologyOptions o = c.layout;
    o.device = Device::kCuda;
    auto topo = Topology::create(o);
    MoeLayer layer(*topo, s, c.kind, c.fuse, 2);
    layer.load_whole(ref::init_params<float>(s, 4));
    auto x = check_input(s, 4, group_coord(topo->layout(), Group::kMp, topo->world_rank()).index);
    layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim}));
    int64_t rows = 0;
    for (int64_t r : layer.expert_rows()) rows += r;
    int64_t kept = 0;
    for (int64_t r : layer.routing().row) kept += r >= 0 ? 1 : 0;
    // Every kept choice is computed once per ESP shard; a gate on the MP group's whole T
    // (baseline, S2) is duplicated on its N_MP ranks, S1's gate runs on disjoint slices.
    const int64_t gate_copies = c.kind == Kind::kS1 || o.mp == 1 ? 1 : o.mp;
    int64_t v[2] = {rows * gate_copies, kept * o.esp};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(v[0], v[1]) << c.where;
  }
}

// The host values of a tensor (any device).
std::vector<float> values(const Tensor& t) {
  const Tensor h = t.to(Device::kCpu);
  return std::vector<float>(h.data(), h.data() + h.numel());
}

double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0.0 ? err / scale : err;
}

// PARM_CUDA_GRAPHS=1: the layer's experts replay CUDA graphs from the third pass on (the same
// buffers and fill counts pass after pass), and every pass gives what a layer without graphs
// gives: output, input gradient and every gradient, each layout, fp32 and bf16.
TEST(GpuLayer, CudaGraphsGiveTheEagerResults) {
  const auto s = MoeShape::of(48, 32, 64, 8, 2, "1.1");
  for (const test::LayerCase& c : test::layer_cases(s))
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      TopologyOptions o = c.layout;
      o.device = Device::kCuda;
      auto topo = Topology::create(o);
      MoeLayer eager(*topo, s, c.kind, c.fuse, 3, p);
      ASSERT_EQ(setenv("PARM_CUDA_GRAPHS", "1", 1), 0);
      MoeLayer graphed(*topo, s, c.kind, c.fuse, 3, p);
      unsetenv("PARM_CUDA_GRAPHS");
      const int group = group_coord(topo->layout(), Group::kMp, topo->world_rank()).index;
      auto x = check_input(s, 5, group);
      auto dout = check_dout(s, 5, group);
      const Tensor xv = Tensor::view(x.data(), {s.tokens, s.model_dim});
      const Tensor dv = Tensor::view(dout.data(), {s.tokens, s.model_dim});
      for (MoeLayer* l : {&eager, &graphed}) {
        l->load_whole(ref::init_params<float>(s, 5));
        l->set_step_timing(false);  // timed phases wait for the GPU and run eagerly
      }
      // Each pass from zero gradients: out, dx, dWg, dW1, db1, dW2, db2.
      auto pass = [&](MoeLayer& l) {
        l.zero_grad();
        std::vector<std::vector<float>> r = {values(l.forward(xv))};
        r.push_back(values(l.backward(dv, 0.5f)));
        const MoeLayerParams& g = l.grads();
        for (const Tensor* t : {&g.wg, &g.experts.w1, &g.experts.b1, &g.experts.w2, &g.experts.b2})
          r.push_back(values(*t));
        return r;
      };
      const double tol = p == Precision::kFp32 ? 1e-5 : 4e-3;
      for (int it = 0; it < 4; ++it) {
        const auto want = pass(eager), got = pass(graphed);
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_LE(max_rel(got[i], want[i]), tol)
              << c.where << " " << precision_name(p) << " pass " << it << " tensor " << i;
      }
      const auto& dev =
          dynamic_cast<moe::CudaBackend&>(graphed.backend()).device_experts();
      EXPECT_FALSE(dev.forward_graphs().capture_failed()) << c.where << dev.graph_failures();
      EXPECT_FALSE(dev.backward_graphs().capture_failed()) << c.where << dev.graph_failures();
      EXPECT_EQ(dev.forward_graphs().replays(), 2) << c.where << " " << precision_name(p);
      EXPECT_EQ(dev.backward_graphs().replays(), 2) << c.where << " " << precision_name(p);
    }
}

TEST(GpuLayer, CudaGraphsSwitchTakesOnlyItsValues) {
  for (const char* v : {"0", "off", ""}) {
    ASSERT_EQ(setenv("PARM_CUDA_GRAPHS", v, 1), 0);
    EXPECT_FALSE(moe::cuda_graphs_from_env()) << v;
  }
  for (const char* v : {"1", "on"}) {
    ASSERT_EQ(setenv("PARM_CUDA_GRAPHS", v, 1), 0);
    EXPECT_TRUE(moe::cuda_graphs_from_env()) << v;
  }
  ASSERT_EQ(setenv("PARM_CUDA_GRAPHS", "yes", 1), 0);
  EXPECT_THROW(moe::cuda_graphs_from_env(), InvalidConfig);
  unsetenv("PARM_CUDA_GRAPHS");
  EXPECT_FALSE(moe::cuda_graphs_from_env());
}

}  // namespace
}  // namespace parm
