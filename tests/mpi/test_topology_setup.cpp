// Topology::create is bounded like every operation: when a rank does not take part, the
// others throw parm::Timeout naming their rank and the setup step after the deadline,
// instead of blocking in MPI's setup calls for ever.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "mpi_test_util.h"
#include "parm/error.h"

namespace parm {
namespace {

constexpr int kTimedOutTag = 4344;

TEST(TopologySetup, ARankThatDoesNotTakePartTimesOutTheOthers) {
  const int p = test::world_size(), me = test::world_rank();
  if (p < 2) GTEST_SKIP() << "needs 2 or more ranks (one stays out)";
  if (me != 0) {
    TopologyOptions o;
    o.timeout_s = 0.3;
    try {
      auto topo = Topology::create(o);
      ADD_FAILURE() << "the topology was made without rank 0";
    } catch (const Timeout& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(fmt::format("rank {} (topology setup)", me)), std::string::npos) << msg;
      EXPECT_NE(msg.find("entry barrier of the world"), std::string::npos) << msg;
    }
    // Tell rank 0 (point to point: it does not disturb the order of collectives on the world),
    // then wait, inside MPI, until it has matched the abandoned barrier.
    int flag = 1;
    MPI_Send(&flag, 1, MPI_INT, 0, kTimedOutTag, MPI_COMM_WORLD);
    MPI_Recv(&flag, 1, MPI_INT, 0, kTimedOutTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    int flag = 0;
    for (int r = 1; r < p; ++r)
      MPI_Recv(&flag, 1, MPI_INT, r, kTimedOutTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    // Only now join the others' abandoned first step (the world's entry barrier: an
    // MPI_Ibarrier, which only a non-blocking barrier matches), so every rank has issued the
    // same collectives on the world in the same order again.
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    for (int r = 1; r < p; ++r) MPI_Send(&flag, 1, MPI_INT, r, kTimedOutTag, MPI_COMM_WORLD);
  }
  // Everyone can make a topology again.
  auto topo = test::make_topology(1, 1, 1, 120.0);
  topo->comm(Group::kWorld).barrier();
}

}  // namespace
}  // namespace parm
