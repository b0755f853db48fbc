#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "comm/mpi_check.h"
#include "comm/mpi_communicator.h"
#include "comm/staged_communicator.h"
#include "parm/error.h"
#include "parm/topology.h"

#ifdef PARM_HAVE_CUDA
#include "comm/cuda/nccl_communicator.h"
#endif

namespace parm {

const char* comm_backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::kMpi: return "mpi";
    case CommBackend::kNccl: return "nccl";
    default: return "auto";
  }
}

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "auto") return CommBackend::kAuto;
  if (name == "mpi") return CommBackend::kMpi;
  if (name == "nccl") return CommBackend::kNccl;
  throw InvalidConfig(
      fmt::format("unknown communicator '{}': valid values are auto, mpi, nccl", name));
}

namespace {

// Collective: true on every rank when NCCL can move this job's device buffers (each rank
// of a node has a GPU of its own).
bool gpus_for_every_rank(MPI_Comm base, int rank) {
  MPI_Comm shared;
  PARM_MPI_CHECK(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  int on_node = 1;
  PARM_MPI_CHECK(MPI_Comm_size(shared, &on_node));
  PARM_MPI_CHECK(MPI_Comm_free(&shared));
  int ok = on_node <= cuda_device_count() ? 1 : 0;
  PARM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, base));
  return ok == 1;
}

}  // namespace

std::unique_ptr<Topology> Topology::create(const TopologyOptions& o) {
  PARM_CONFIG_CHECK(o.device == Device::kCuda || o.comm == CommBackend::kAuto ||
                        o.comm == CommBackend::kMpi,
                    "--comm {} moves device buffers and needs --device cuda",
                    comm_backend_name(o.comm));
  if (o.device == Device::kCuda) check_device(o.device);
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
    t->host_comms_[static_cast<size_t>(gi)] = std::make_unique<MpiCommunicator>(
        comm, group_name(g), group_is_intra_node(t->layout_, g, rank, t->node_of_rank_),
        o.timeout_s);
    t->comms_[static_cast<size_t>(gi)] = t->host_comms_[static_cast<size_t>(gi)].get();
  }
  t->device_ = o.device;
  if (o.device != Device::kCuda) {
    if (o.stage_host_buffers)
      for (int gi = 0; gi < kNumGroups; ++gi) {
        t->device_comms_[static_cast<size_t>(gi)] = std::make_unique<StagedCommunicator>(
            *t->host_comms_[static_cast<size_t>(gi)],
            [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); });
        t->comms_[static_cast<size_t>(gi)] = t->device_comms_[static_cast<size_t>(gi)].get();
      }
    return t;
  }

  const bool nccl_fits = gpus_for_every_rank(base, rank);
  PARM_CONFIG_CHECK(o.comm != CommBackend::kNccl || nccl_fits,
                    "--comm nccl needs a GPU of its own for every rank (NCCL refuses two ranks "
                    "on one GPU): this node has {} GPU(s) for its ranks; use --comm mpi (device "
                    "buffers staged through host memory) or fewer ranks per node",
                    cuda_device_count());
  t->nccl_ = o.comm == CommBackend::kNccl || (o.comm == CommBackend::kAuto && nccl_fits);
  for (int gi = 0; gi < kNumGroups; ++gi) {
    auto& host = *t->host_comms_[static_cast<size_t>(gi)];
#ifdef PARM_HAVE_CUDA
    if (t->nccl_)
      t->device_comms_[static_cast<size_t>(gi)] =
          make_nccl_communicator(static_cast<MpiCommunicator&>(host));
    else
#endif
      t->device_comms_[static_cast<size_t>(gi)] = std::make_unique<StagedCommunicator>(host);
    t->comms_[static_cast<size_t>(gi)] = t->device_comms_[static_cast<size_t>(gi)].get();
  }
  return t;
}

Topology::~Topology() {
  for (auto& c : device_comms_) c.reset();  // before the host communicators they use
}

int Topology::num_nodes() const {
  return node_of_rank_.empty()
             ? 1
             : *std::max_element(node_of_rank_.begin(), node_of_rank_.end()) + 1;
}

void Topology::set_timeout_s(double s) {
  for (auto& c : host_comms_) static_cast<MpiCommunicator&>(*c).set_timeout_s(s);
}

void Topology::reset_stats() {
  for (auto& c : host_comms_) c->stats().reset();
}

}  // namespace parm
