// calibrate on a device other than the CPU (issue 16), on the CPU: a stand-in BenchDevice
// whose "device memory" is host memory it tracks, over a topology whose communicators stage
// device buffers (stage_host_buffers) and accept only the stand-in's allocations. The profile
// records the device; every collective, product and kernel works on the device's buffers,
// at the precision asked for; every timed call is waited for; nothing is left allocated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cpu/kernels.h"
#include "mpi_test_util.h"
#include "parm/error.h"
#include "perfmodel/calibrate.h"

namespace parm {
namespace {

// The stand-in's allocations (start -> bytes): what counts as device memory.
std::map<const char*, size_t>& allocations() {
  static std::map<const char*, size_t> m;
  return m;
}
MemorySpace stand_in_space_of(const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = allocations().upper_bound(c);
  if (it == allocations().begin()) return MemorySpace::kHost;
  --it;
  return c < it->first + it->second ? MemorySpace::kDevice : MemorySpace::kHost;
}
bool on_device(const void* p) { return stand_in_space_of(p) == MemorySpace::kDevice; }

class StandInDevice final : public perfmodel::BenchDevice {
 public:
  Device device() const override { return Device::kCuda; }
  nlohmann::json describe() const override { return {{"device", "stand-in"}}; }
  void* alloc(size_t bytes) override {
    void* p = std::calloc(bytes > 0 ? bytes : 1, 1);
    allocations()[static_cast<const char*>(p)] = bytes > 0 ? bytes : 1;
    ++allocs;
    return p;
  }
  void release(void* p) noexcept override {
    allocations().erase(static_cast<const char*>(p));
    ++releases;
    std::free(p);
  }
  void upload(void* dst, const float* src, size_t n, Precision p) override {
    if (!on_device(dst)) ++host_operands;
    std::memcpy(dst, src, n * (p == Precision::kBf16 ? 2 : sizeof(float)));
  }
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
            float* c, bool acc, Precision p) override {
    if (!on_device(a) || !on_device(b) || !on_device(c)) ++host_operands;
    ++(p == Precision::kBf16 ? bf16_gemms : fp32_gemms);
    ++queued;
  }
  void copy_rows(const float* src, float* dst, int64_t rows, int64_t cols) override {
    if (!on_device(src) || !on_device(dst)) ++host_operands;
    ++queued;
  }
  void bias_gelu(const float* pre, const float* bias, float* act, int64_t, int64_t) override {
    if (!on_device(pre) || !on_device(bias) || !on_device(act)) ++host_operands;
    ++queued;
  }
  void sync() override {
    ++syncs;
    queued = 0;
  }
  int allocs = 0, releases = 0, syncs = 0, host_operands = 0, fp32_gemms = 0, bf16_gemms = 0;
  int queued = 0;  // calls since the last sync
};

perfmodel::CalibrateOptions tiny(Precision p) {
  perfmodel::CalibrateOptions o;
  o.min_bytes = 1024;  // three sizes: the collective fits need more than two
  o.max_bytes = 16384;
  o.iters = 1;
  o.warmup = 0;
  o.chunks = 2;
  o.gemm_rows = {8, 16};
  o.gemm_model_dims = {8};
  o.gemm_hidden = {8};
  o.gate_experts = {2};
  o.gemm_iters = 1;
  o.compute_window_us = 0.0;  // one call per sample: the counts below
  o.precision = p;
  return o;
}

TopologyOptions staged_world(int world) {
  TopologyOptions o;
  o.mp = o.esp = world;
  o.timeout_s = 60.0;
  o.stage_host_buffers = true;
  o.emulated_space_of = &stand_in_space_of;
  return o;
}

TEST(CalibrateDevice, MeasuresOnTheDevicesBuffersAndRecordsIt) {
  const int world = test::world_size();
  if (world < 2) GTEST_SKIP() << "calibrate needs 2 ranks";
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(p));
    const TopologyOptions to = staged_world(world);
    auto topo = Topology::create(to);
    StandInDevice dev;
    const auto cal = perfmodel::calibrate(*topo, to, tiny(p), dev, [](const std::string&) {});
    EXPECT_EQ(cal.profile.device, Device::kCuda);
    EXPECT_EQ(cal.profile.machine.at("device").at("device"), "stand-in");
    EXPECT_EQ(cal.profile.machine.at("gemm_precision"), precision_name(p));
    EXPECT_EQ(cal.profile.machine.at("comm"), "mpi");
    // The profile names the device it was taken on: read back, a CPU run refuses it.
    const auto back = perfmodel::profile_from_json(perfmodel::profile_to_json(cal.profile), "p");
    EXPECT_EQ(back.device, Device::kCuda);
    EXPECT_THROW(perfmodel::check_profile_device(back, Device::kCpu, "p"), InvalidConfig);
    // Every class product at the precision asked for: 2 row counts x 6 expert products and
    // 2 x 3 gate products, each run twice (1 warm-up, gemm_iters 1); nothing else multiplies
    // (the rendezvous is not measured: calibrate_step_sync).
    const int classes = (2 * 6 + 2 * 3) * 2, chain = 0;
    EXPECT_EQ(dev.bf16_gemms, p == Precision::kBf16 ? classes : 0);
    EXPECT_EQ(dev.fp32_gemms, p == Precision::kBf16 ? chain : chain + classes);
    EXPECT_EQ(dev.host_operands, 0) << "a product or kernel was handed host memory";
    EXPECT_EQ(dev.queued, 0) << "work left queued after the last timed call";
    EXPECT_GE(dev.syncs, static_cast<int>(cal.samples.size()));
    EXPECT_GT(dev.allocs, 0);
    EXPECT_EQ(dev.allocs, dev.releases);
    EXPECT_TRUE(allocations().empty());
    // One latency of a pair for every op of a link (fit.h: pair_latency).
    for (CommOp op : {CommOp::kAllGather, CommOp::kReduceScatter, CommOp::kAllToAll})
      EXPECT_EQ(cal.profile.collective(perfmodel::Link::kIntra, op).alpha_us,
                cal.profile.collective(perfmodel::Link::kIntra, CommOp::kAllReduce).alpha_us)
          << comm_op_name(op);
    for (const char* entry : {"gemm.expert_nn", "memory.copy", "memory.gelu"}) {
      bool seen = false;
      for (const auto& s : cal.samples) seen = seen || s.entry == entry;
      EXPECT_TRUE(seen) << entry;
    }
  }
}

// With a compute window each timed sample repeats the product back to back (the rate ranks
// sharing cores get): the stand-in's products take well under a microsecond, so a 10 s
// window asks for the most repeats (1000) per sample, and every shape runs more than the 2
// calls (warm-up, timed) of one call per sample.
TEST(CalibrateDevice, AComputeWindowRepeatsEachProductPerSample) {
  const int world = test::world_size();
  if (world < 2) GTEST_SKIP() << "calibrate needs 2 ranks";
  const TopologyOptions to = staged_world(world);
  auto topo = Topology::create(to);
  StandInDevice dev;
  perfmodel::CalibrateOptions o = tiny(Precision::kFp32);
  o.compute_window_us = 1e7;
  perfmodel::calibrate(*topo, to, o, dev, [](const std::string&) {});
  const int shapes = 2 * 6 + 2 * 3;
  // Per shape: a warm-up call, a timed call that sizes the repeats, then gemm_iters (1)
  // samples of up to 1000 calls.
  EXPECT_GT(dev.fp32_gemms, shapes * 3);
  EXPECT_LE(dev.fp32_gemms, shapes * 1002);
}

TEST(CalibrateDevice, RefusesATopologyThatMovesAnotherMemory) {
  const int world = test::world_size();
  if (world < 2) GTEST_SKIP() << "calibrate needs 2 ranks";
  TopologyOptions to;
  to.mp = to.esp = world;
  to.timeout_s = 60.0;
  auto topo = Topology::create(to);  // host communicators
  StandInDevice dev;
  try {
    perfmodel::calibrate(*topo, to, tiny(Precision::kFp32), dev, [](const std::string&) {});
    ADD_FAILURE() << "not refused";
  } catch (const InvalidConfig& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("move host memory"), std::string::npos) << msg;
  }
  EXPECT_EQ(dev.allocs, 0);  // refused before any work
}

}  // namespace
}  // namespace parm
