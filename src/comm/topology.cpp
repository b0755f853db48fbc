#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "comm/external_communicator.h"
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

// MPI_Comm_split_type(SHARED) over `world`'s communicator, as a host communicator "node".
// MPI has no non-blocking form of it: the caller precedes it with a watched exchange on
// `world` (so a missing or dead rank is reported by the deadline before this call); a rank
// that dies between that exchange and this call still blocks it without a deadline.
std::unique_ptr<MpiCommunicator> split_node(MpiCommunicator& world) {
  MPI_Comm shared;
  PARM_MPI_CHECK(MPI_Comm_split_type(world.mpi_comm(), MPI_COMM_TYPE_SHARED, world.rank(),
                                     MPI_INFO_NULL, &shared));
  return std::make_unique<MpiCommunicator>(shared, "node", /*intra_node=*/true,
                                           world.timeout_s());
}

// Collective: true on every rank when NCCL can move this job's device buffers (each rank
// of a node has a GPU of its own).
bool gpus_for_every_rank(MpiCommunicator& world) {
  world.barrier();  // the watched exchange before the blocking split (split_node)
  const int on_node = split_node(world)->size();
  int32_t ok = on_node <= cuda_device_count() ? 1 : 0;
  world.allreduce(&ok, 1, ReduceOp::kMin);
  return ok == 1;
}

}  // namespace

// Every exchange of the setup is bounded by o.timeout_s like any operation: an entry barrier
// and the world communicator (MPI_Comm_idup) come first, both waited for under the watchdog
// (wait_setup_request), and every later exchange goes through that communicator. MPI_Comm_split and MPI_Comm_split_type have no
// non-blocking form; each is preceded by a watched exchange on the world, so a rank that
// does not take part (or is dead) is reported by the deadline before them; what remains
// unbounded is a rank dying between that exchange and the split.
std::unique_ptr<Topology> Topology::create(const TopologyOptions& o) {
  PARM_CONFIG_CHECK(o.device == Device::kCuda || o.comm == CommBackend::kAuto ||
                        o.comm == CommBackend::kMpi,
                    "--comm {} moves device buffers and needs --device cuda",
                    comm_backend_name(o.comm));
  if (o.device == Device::kCuda) check_device(o.device);
  // The job's world, or this process alone (self_only).
  MPI_Comm base = o.self_only ? MPI_COMM_SELF : MPI_COMM_WORLD;
  int world = 0, rank = 0, job_rank = 0;
  PARM_MPI_CHECK(MPI_Comm_size(base, &world));
  PARM_MPI_CHECK(MPI_Comm_rank(base, &rank));
  PARM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &job_rank));
  std::unique_ptr<Topology> t(new Topology());
  t->layout_ = make_layout(world, o.mp, o.ep, o.esp, o.pp, o.order);
  t->world_rank_ = rank;
  // Host communicators of a cuda run tell device pointers apart (and refuse them); those of
  // a CPU run make no CUDA call.
  const SpaceOfFn host_space = o.device == Device::kCuda ? &cuda_space_of : &host_space_of;

  // First a barrier on the world: a rank that does not take part is reported here, by a
  // plain collective that a late rank can still match (MPI_Barrier) to clean up.
  MPI_Request req;
  PARM_MPI_CHECK(MPI_Ibarrier(base, &req));
  wait_setup_request(req, job_rank, fmt::format("the entry barrier of the world ({} ranks)", world),
                     o.timeout_s);
  MPI_Comm dup;
  PARM_MPI_CHECK(MPI_Comm_idup(base, &dup, &req));
  wait_setup_request(req, job_rank, fmt::format("MPI_Comm_idup of the world ({} ranks)", world),
                     o.timeout_s);
  auto world_comm = std::make_unique<MpiCommunicator>(dup, group_name(Group::kWorld),
                                                      /*intra_node=*/false, o.timeout_s,
                                                      host_space);
  MpiCommunicator& wc = *world_comm;

  // Host names: for node names, and (without emulation) to order the detected nodes.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  PARM_MPI_CHECK(MPI_Get_processor_name(host, &host_len));
  std::vector<char> hosts(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  wc.allgather(host, hosts.data(), MPI_MAX_PROCESSOR_NAME, DType::kU8);

  if (o.ranks_per_node > 0) {
    t->emulated_ = true;
    t->node_of_rank_ = emulated_nodes(world, o.ranks_per_node);
  } else {
    // A node = the ranks that share memory; named by its lowest world rank, then renumbered
    // 0, 1, ... in order of that rank. (The host-name exchange above precedes the split.)
    int32_t leader = rank;
    split_node(wc)->allreduce(&leader, 1, ReduceOp::kMin);
    std::vector<int32_t> leaders(static_cast<size_t>(world));
    wc.allgather(&leader, leaders.data(), 1);
    std::vector<int32_t> sorted = leaders;
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

  wc.set_intra_node(group_is_intra_node(t->layout_, Group::kWorld, rank, t->node_of_rank_));
  wc.barrier();  // the watched exchange before the blocking splits
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    if (g == Group::kWorld) continue;
    const GroupCoord c = group_coord(t->layout_, g, rank);
    MPI_Comm comm;
    PARM_MPI_CHECK(MPI_Comm_split(wc.mpi_comm(), c.index, c.rank, &comm));
    t->host_comms_[static_cast<size_t>(gi)] = std::make_unique<MpiCommunicator>(
        comm, group_name(g), group_is_intra_node(t->layout_, g, rank, t->node_of_rank_),
        o.timeout_s, host_space);
  }
  t->host_comms_[static_cast<size_t>(Group::kWorld)] = std::move(world_comm);
  for (int gi = 0; gi < kNumGroups; ++gi)
    t->comms_[static_cast<size_t>(gi)] = t->host_comms_[static_cast<size_t>(gi)].get();
  t->device_ = o.device;
  if (o.device != Device::kCuda) {
    if (o.stage_host_buffers)
      for (int gi = 0; gi < kNumGroups; ++gi) {
        t->device_comms_[static_cast<size_t>(gi)] = std::make_unique<StagedCommunicator>(
            *t->host_comms_[static_cast<size_t>(gi)],
            [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); },
            o.emulated_space_of);
        t->comms_[static_cast<size_t>(gi)] = t->device_comms_[static_cast<size_t>(gi)].get();
      }
    t->reset_stats();  // the setup's exchanges are nobody's traffic
    return t;
  }

  const bool nccl_fits = gpus_for_every_rank(wc);
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
  t->reset_stats();
  return t;
}

std::unique_ptr<Topology> Topology::adopt(
    const Layout& layout, int world_rank, std::vector<int> node_of_rank,
    std::array<std::unique_ptr<Communicator>, kNumGroups> comms, Device device) {
  if (device == Device::kCuda) check_device(device);
  PARM_CHECK(static_cast<int>(node_of_rank.size()) == layout.world,
             "Topology::adopt: {} node numbers for a world of {}", node_of_rank.size(),
             layout.world);
  std::unique_ptr<Topology> t(new Topology());
  t->layout_ = layout;
  t->world_rank_ = world_rank;
  t->node_of_rank_ = std::move(node_of_rank);
  t->node_names_.assign(static_cast<size_t>(t->num_nodes()), "");
  for (int n = 0; n < t->num_nodes(); ++n) t->node_names_[static_cast<size_t>(n)] =
      fmt::format("node{}", n);
  for (int gi = 0; gi < kNumGroups; ++gi) {
    const Group g = static_cast<Group>(gi);
    auto& c = comms[static_cast<size_t>(gi)];
    PARM_CONFIG_CHECK(c != nullptr, "Topology::adopt: no communicator for group {}",
                      group_name(g));
    const int want_size = layout.group_size(g);
    const int want_rank = group_coord(layout, g, world_rank).rank;
    PARM_CONFIG_CHECK(c->size() == want_size && c->rank() == want_rank,
                      "group {} of world rank {}: {} ranks with this rank at {}, but the layout "
                      "(world {} mp {} ep {} esp {} dp {} edp {} pp {}, order {}) needs {} ranks "
                      "with this rank at {}",
                      group_name(g), world_rank, c->size(), c->rank(), layout.world, layout.mp,
                      layout.ep, layout.esp, layout.dp, layout.edp, layout.pp,
                      layout.order_name(), want_size, want_rank);
    t->host_comms_[static_cast<size_t>(gi)] = std::move(c);
    t->comms_[static_cast<size_t>(gi)] = t->host_comms_[static_cast<size_t>(gi)].get();
  }
  t->device_ = device;
  if (device == Device::kCuda) {
#ifdef PARM_HAVE_CUDA
    t->nccl_ = true;
    for (int gi = 0; gi < kNumGroups; ++gi) {
      t->device_comms_[static_cast<size_t>(gi)] =
          make_nccl_communicator(*t->host_comms_[static_cast<size_t>(gi)]);
      t->comms_[static_cast<size_t>(gi)] = t->device_comms_[static_cast<size_t>(gi)].get();
    }
#else
    throw InvalidConfig("device cuda over adopted communicators needs a CUDA build");
#endif
  }
  t->reset_stats();
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
  for (auto& c : host_comms_) {
    if (auto* m = dynamic_cast<MpiCommunicator*>(c.get())) m->set_timeout_s(s);
    if (auto* e = dynamic_cast<ExternalCommunicator*>(c.get())) e->set_timeout_s(s);
  }
}

void Topology::reset_stats() {
  for (auto& c : host_comms_) c->stats().reset();
}

}  // namespace parm
