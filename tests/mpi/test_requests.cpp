// The request state machine (src/comm/tracked_request.h) on the MPI and the staged
// communicators: a timed-out request stays failed (it rethrows on every later wait and
// test), a staged request whose host operation timed out never writes into its destination,
// and the buffers of a failed request are never handed out again, even when the abandoned
// receive completes later.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/staged_communicator.h"
#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

constexpr int kLateTag = 4343;  // a receive posted with it has no sender until the test sends

// Waits for `r`, which can only time out; returns the Timeout's message.
std::string first_timeout(Request& r) {
  try {
    r.wait();
  } catch (const Timeout& e) {
    return e.what();
  }
  ADD_FAILURE() << "a receive without a sender completed";
  return "";
}

// Expects `call` to throw parm::Timeout whose message is `first` (the same error again).
template <typename F>
void expect_same_timeout(F&& call, const std::string& first, const char* what) {
  try {
    call();
    ADD_FAILURE() << what << " returned normally after the request timed out";
  } catch (const Timeout& e) {
    EXPECT_EQ(std::string(e.what()), first) << what;
  }
}

// A one-group-per-rank topology whose operations time out after 0.3 s; with `staged`, comm(g)
// is a StagedCommunicator over host memcpy (as TopologyOptions::stage_host_buffers makes).
std::unique_ptr<Topology> quick_timeout_topology(bool staged) {
  TopologyOptions o;
  o.timeout_s = 0.3;
  o.stage_host_buffers = staged;
  return Topology::create(o);
}

TEST(Requests, TimedOutMpiReceiveRethrowsOnEveryLaterWaitAndTest) {
  auto topo = quick_timeout_topology(/*staged=*/false);
  Communicator& world = topo->comm(Group::kWorld);
  static float sink[16];
  RequestPtr r = world.irecv(sink, 16, DType::kF32, world.rank(), kLateTag);
  const std::string first = first_timeout(*r);
  EXPECT_NE(first.find("recv of 64 bytes"), std::string::npos) << first;
  expect_same_timeout([&] { r->wait(); }, first, "a second wait()");
  expect_same_timeout([&] { (void)r->test(); }, first, "test()");
  r.reset();
  // The abandoned receive matches this send (to itself), so nothing stays in flight.
  topo->set_timeout_s(120.0);
  const float payload[16] = {};
  world.send(payload, 16, DType::kF32, world.rank(), kLateTag);
  world.barrier();
}

TEST(Requests, TimedOutStagedReceiveNeverWritesItsDestinationNorHandsOutItsBuffer) {
  auto topo = quick_timeout_topology(/*staged=*/true);
  auto& staged = dynamic_cast<StagedCommunicator&>(topo->comm(Group::kWorld));
  Communicator& host = topo->host_comm(Group::kWorld);
  const size_t count = 16, bytes = count * sizeof(float);

  // Warm the staging pool with a buffer that holds 5s: the receive below takes it.
  std::vector<float> warm(count, 5.0f);
  staged.broadcast(warm.data(), count, DType::kF32, 0);

  std::vector<float> dst(count, -1.0f);
  RequestPtr r = staged.irecv(dst.data(), count, DType::kF32, staged.rank(), kLateTag);
  const std::string first = first_timeout(*r);
  expect_same_timeout([&] { r->wait(); }, first, "a second staged wait()");
  expect_same_timeout([&] { (void)r->test(); }, first, "staged test()");
  r.reset();
  size_t written = 0;
  for (size_t i = 0; i < count; ++i) written += dst[i] != -1.0f ? 1 : 0;
  EXPECT_EQ(written, 0u) << "the timed-out staged receive wrote its destination";

  // A buffer taken from the pool now must not be the abandoned receive's staging buffer:
  // the late send below completes that receive, which must not land in it.
  StagedCommunicator::Buffer taken = staged.take(bytes);
  auto* t = reinterpret_cast<float*>(taken.data.get());
  for (size_t i = 0; i < count; ++i) t[i] = 0.0f;
  topo->set_timeout_s(120.0);
  const std::vector<float> late(count, 42.0f);
  host.send(late.data(), count, DType::kF32, host.rank(), kLateTag);
  host.barrier();
  size_t overwritten = 0;
  for (size_t i = 0; i < count; ++i) overwritten += t[i] != 0.0f ? 1 : 0;
  EXPECT_EQ(overwritten, 0u) << "the abandoned receive wrote into a buffer handed out again";
  staged.give_back(std::move(taken));
}

}  // namespace
}  // namespace parm
