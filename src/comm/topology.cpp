#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "comm/mpi_check.h"
#include "comm/mpi_communicator.h"
#include "parm/topology.h"

namespace parm {

std::unique_ptr<Topology> Topology::create(const TopologyOptions& o) {
  // The job's world, or this process alone (self_only).
  MPI_Comm base = o.self_only ? MPI_COMM_SELF : MPI_COMM_WORLD;
  int world = 0, rank = 0;
  PARM_MPI_CHECK(MPI_Comm_size(base, &world));
  PARM_MPI_CHECK(MPI_Comm_rank(base, &rank));
  std::unique_ptr<Topology> t(new Topology());
  t->layout_ = make_layout(world, o.mp, o.ep, o.esp);
  t->world_rank_ = rank;

  // Host names: for node names, and (without emulation) to order the detected nodes.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  PARM_MPI_CHECK(MPI_Get_processor_name(host, &host_len));
  std::vector<char> hosts(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  PARM_MPI_CHECK(MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts.data(),
                               MPI_MAX_PROCESSOR_NAME, MPI_CHAR, base));

  if (o.ranks_per_node > 0) {
    t->emulated_ = true;
    t->node_of_rank_ = emulated_nodes(world, o.ranks_per_node);
  } else {
    // A node = the ranks that share memory; named by its lowest world rank, then renumbered
    // 0, 1, ... in order of that rank.
    MPI_Comm shared;
    PARM_MPI_CHECK(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank,
                                       MPI_INFO_NULL, &shared));
    int leader = rank;
    PARM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, shared));
    PARM_MPI_CHECK(MPI_Comm_free(&shared));
    std::vector<int> leaders(static_cast<size_t>(world));
    PARM_MPI_CHECK(
        MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, base));
    std::vector<int> sorted = leaders;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    t->node_of_rank_.resize(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      t->node_of_rank_[static_cast<size_t>(r)] = static_cast<int>(
          std::lower_bound(sorted.begin(), sorted.end(), leaders[static_cast<size_t>(r)]) -
          sorted.begin());
  }
  t->node_names_.assign(static_cast<size_t>(t->num_nodes()), "");
  for (int r = world - 1; r >= 0; --r)
    t->node_names_[static_cast<size_t>(t->node_of_rank_[static_cast<size_t>(r)])] =
        std::string(&hosts[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);

  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    const GroupCoord c = group_coord(t->layout_, g, rank);
    MPI_Comm comm;
    PARM_MPI_CHECK(MPI_Comm_split(base, c.index, c.rank, &comm));
    t->comms_[static_cast<size_t>(gi)] = std::make_unique<MpiCommunicator>(
        comm, group_name(g), group_is_intra_node(t->layout_, g, rank, t->node_of_rank_),
        o.timeout_s);
  }
  return t;
}

Topology::~Topology() = default;

int Topology::num_nodes() const {
  return node_of_rank_.empty()
             ? 1
             : *std::max_element(node_of_rank_.begin(), node_of_rank_.end()) + 1;
}

void Topology::set_timeout_s(double s) {
  for (auto& c : comms_) static_cast<MpiCommunicator&>(*c).set_timeout_s(s);
}

void Topology::reset_stats() {
  for (auto& c : comms_) c->stats().reset();
}

}  // namespace parm
