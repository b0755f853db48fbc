// The request state machine and memory spaces on a GPU: the NCCL communicator refuses host
// buffers, the host communicator of a cuda run refuses device buffers, the default staged
// communicator tells them apart with CUDA's pointer attributes, a fused collective over an
// NCCL and an MPI group is refused (it would run one backend's pipeline on the other's
// buffers), and a request issued inside an unended NcclGroup refuses a wait without failing.
//
// Needs MPI initialised (the GPU test binary's main) and skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/cuda/nccl_communicator.h"
#include "comm/fused_any.h"
#include "comm/mpi_communicator.h"
#include "comm/staged_communicator.h"
#include "parm/device.h"
#include "parm/error.h"

namespace parm {
namespace {

struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n), p(static_cast<float*>(device_alloc(n * sizeof(float)))) {}
  ~DeviceFloats() { device_free(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  size_t n;
  float* p;
};

std::unique_ptr<MpiCommunicator> self_host(const char* name, SpaceOfFn space_of) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_SELF, &c);  // the MpiCommunicator frees it
  return std::make_unique<MpiCommunicator>(c, name, /*intra_node=*/true, 60.0, space_of);
}

void expect_refused(const std::function<void()>& call, const char* wants) {
  try {
    call();
    ADD_FAILURE() << "a buffer of the wrong space was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("moves {} memory", wants)),
              std::string::npos)
        << e.what();
  }
}

class NcclRequests : public testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible";
  }
};

TEST_F(NcclRequests, EachCommunicatorRefusesBuffersOfTheOtherSpace) {
  auto host = self_host("ep", &cuda_space_of);
  NcclCommunicator nccl(*host);
  StagedCommunicator staged(*host);
  std::vector<float> h(8, 1.0f);
  DeviceFloats d(8);
  EXPECT_EQ(cuda_space_of(h.data()), MemorySpace::kHost);
  EXPECT_EQ(cuda_space_of(d.p), MemorySpace::kDevice);
  expect_refused([&] { nccl.allreduce(h.data(), h.size()); }, "device");
  expect_refused([&] { staged.allreduce(h.data(), h.size()); }, "device");
  expect_refused([&] { host->allreduce(d.p, d.n); }, "host");
  // The right spaces pass.
  nccl.allreduce(d.p, d.n);
  staged.allreduce(d.p, d.n);
  host->allreduce(h.data(), h.size());
  EXPECT_EQ(h[0], 1.0f);
}

TEST_F(NcclRequests, FusedCollectiveOverAnNcclAndAnMpiGroupIsRefused) {
  auto ep_host = self_host("ep", &cuda_space_of);
  auto esp_host = self_host("esp", &cuda_space_of);
  NcclCommunicator ep(*ep_host);
  const size_t block = 4;
  DeviceFloats in(block), out(block);
  try {
    fused_dispatch_any(ep, *esp_host, in.p, out.p, block, 1);
    FAIL() << "a fused dispatch over an NCCL and an MPI group ran";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("group ep (nccl communicator"), std::string::npos) << msg;
    EXPECT_NE(msg.find("group esp (mpi communicator"), std::string::npos) << msg;
  }
}

TEST_F(NcclRequests, WaitInsideAnOpenGroupIsRefusedWithoutFailingTheRequest) {
  auto host = self_host("edp", &cuda_space_of);
  NcclCommunicator nccl(*host);
  DeviceFloats a(4), b(4);
  RequestPtr recv, send;
  {
    NcclGroup group;
    recv = nccl.irecv(b.p, 4, DType::kF32, 0, 0);
    send = nccl.isend(a.p, 4, DType::kF32, 0, 0);
    EXPECT_THROW(recv->wait(), Error);
    group.end();
  }
  recv->wait();  // still pending, not failed: completes once the group went out
  send->wait();
  EXPECT_TRUE(recv->test());
}

}  // namespace
}  // namespace parm
