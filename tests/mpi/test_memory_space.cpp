// Memory spaces: every communicator refuses buffers outside its space with a parm::Error
// naming the rank, group, op and both spaces; the fused collectives refuse a pair of groups
// of different backends; the optimizer's gradient reduction (host tensors) uses the host
// communicators. On the CPU the staged communicators of stage_host_buffers are the device
// communicators; TopologyOptions::emulated_space_of = host_space_of makes every buffer count
// as host memory, so a host buffer handed to them is refused as on a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/fused_any.h"
#include "comm/mpi_communicator.h"
#include "model/param.h"
#include "mpi_test_util.h"
#include "parm/error.h"
#include "train/optimizer.h"

namespace parm {
namespace {

std::unique_ptr<Topology> strict_staged_topology(int mp = 1, int ep = 1, int esp = 1) {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  o.timeout_s = 60.0;
  o.stage_host_buffers = true;
  o.emulated_space_of = &host_space_of;  // every buffer is host memory: comm(g) refuses it
  return Topology::create(o);
}

void expect_refusal(const Error& e, const char* group, const char* op, const char* want) {
  const std::string msg = e.what();
  EXPECT_NE(msg.find(fmt::format("rank {}", test::world_rank())), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("group {}", group)), std::string::npos) << msg;
  EXPECT_NE(msg.find(op), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("moves {} memory", want)), std::string::npos) << msg;
}

TEST(MemorySpace, HostBufferHandedToADeviceCommunicatorIsRefused) {
  auto topo = strict_staged_topology();
  std::vector<float> buf(8, 1.0f), out(8 * static_cast<size_t>(test::world_size()));
  Communicator& dev = topo->comm(Group::kWorld);
  EXPECT_EQ(dev.memory_space(), MemorySpace::kDevice);
  try {
    dev.allreduce(buf.data(), buf.size());
    FAIL() << "a device communicator took a host buffer";
  } catch (const Error& e) {
    expect_refusal(e, "world", "allreduce", "device");
  }
  try {
    dev.allgather(buf.data(), out.data(), buf.size());
    FAIL() << "a device communicator took host buffers";
  } catch (const Error& e) {
    expect_refusal(e, "world", "allgather", "device");
  }
  // Nothing was issued, so every rank is still in step; the host communicator takes them.
  topo->host_comm(Group::kWorld).allreduce(buf.data(), buf.size());
  EXPECT_EQ(buf[0], static_cast<float>(test::world_size()));
}

MemorySpace all_device(const void*) { return MemorySpace::kDevice; }

TEST(MemorySpace, DeviceBufferHandedToAHostCommunicatorIsRefused) {
  MPI_Comm self;
  MPI_Comm_dup(MPI_COMM_SELF, &self);  // the communicator frees it
  MpiCommunicator host(self, "edp", /*intra_node=*/true, 60.0, &all_device);
  float x[4] = {1, 2, 3, 4};
  try {
    host.broadcast(x, 4, DType::kF32, 0);
    FAIL() << "a host communicator took a device buffer";
  } catch (const Error& e) {
    expect_refusal(e, "edp", "broadcast", "host");
  }
  host.barrier();  // no buffer: allowed
}

TEST(MemorySpace, FusedCollectiveOverGroupsOfDifferentBackendsIsRefused) {
  TopologyOptions o;
  o.ep = test::world_size();
  o.timeout_s = 60.0;
  o.stage_host_buffers = true;
  auto topo = Topology::create(o);
  const size_t block = 2;
  std::vector<float> in(block * static_cast<size_t>(o.ep), 1.0f), out(in.size());
  // ep staged (device memory), esp MPI (host memory): neither pipeline fits both.
  try {
    fused_dispatch_any(topo->comm(Group::kEp), topo->host_comm(Group::kEsp), in.data(),
                       out.data(), block, 1);
    FAIL() << "a fused dispatch over a staged and an MPI group ran";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("group ep (staged communicator"), std::string::npos) << msg;
    EXPECT_NE(msg.find("group esp (mpi communicator"), std::string::npos) << msg;
  }
  try {
    fused_combine_any(topo->host_comm(Group::kEsp), topo->comm(Group::kEp), out.data(),
                      in.data(), block, 1);
    FAIL() << "a fused combine over an MPI and a staged group ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must share a backend"), std::string::npos)
        << e.what();
  }
}

// Gradients are host tensors: reduce_gradients sums them over the host communicators, so it
// works when comm(g) is a device communicator (NCCL on a GPU run; here the strict staged one).
TEST(MemorySpace, ReduceGradientsSumsHostGradientsOverTheHostCommunicators) {
  const int p = test::world_size();
  auto topo = strict_staged_topology(/*mp=*/p % 2 == 0 ? 2 : 1);  // dp > 1 at 3 ranks too
  const int me = test::world_rank();
  model::Param dense, expert;
  dense.grad = Tensor({3});
  dense.grad_reduce = Group::kDp;
  expert.grad = Tensor({2});
  expert.grad_reduce = Group::kEdp;
  for (int i = 0; i < 3; ++i) dense.grad.data()[i] = static_cast<float>(me + i);
  for (int i = 0; i < 2; ++i) expert.grad.data()[i] = static_cast<float>(2 * me + i);
  train::reduce_gradients(*topo, {&dense, &expert});
  // Expected: the same sums over each group's members, by their world ranks.
  const Layout& lay = topo->layout();
  for (int i = 0; i < 3; ++i) {
    float want = 0;
    for (int r : group_members(lay, Group::kDp, me)) want += static_cast<float>(r + i);
    EXPECT_EQ(dense.grad.data()[i], want) << "dense element " << i;
  }
  for (int i = 0; i < 2; ++i) {
    float want = 0;
    for (int r : group_members(lay, Group::kEdp, me)) want += static_cast<float>(2 * r + i);
    EXPECT_EQ(expert.grad.data()[i], want) << "expert element " << i;
  }
}

}  // namespace
}  // namespace parm
