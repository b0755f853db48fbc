// Rank layout (docs/spec.md §1, docs/layout.md) and the communicator of every group.
//
// A layout is (dp, pp, mp, ep, esp) with an order: the nesting of the groups from innermost
// to outermost, named by "mp", "esp", "ep", "dp", "pp" (default "mp-esp-ep-dp-pp").
// Dense part:  P = N_DP x N_MP x N_PP, its dimensions nested as mp, dp, pp appear in the order.
// MoE part:    P = N_EDP x N_EP x N_ESP x N_PP, nested as esp, ep, dp (standing for edp), pp
//              appear in the order.
// A rank's coordinates are the mixed-radix digits of its world rank, innermost digit first.
// With the default order: MP groups are contiguous blocks of N_MP ranks and DP the stride-N_MP
// dimension; ESP groups are contiguous blocks of N_ESP ranks, EP the stride-N_ESP dimension
// inside a block of N_EP x N_ESP ranks, EDP the stride-(N_EP x N_ESP) dimension; the pp
// stages are contiguous blocks of world/N_PP ranks (stage s = ranks [s*P/N_PP, (s+1)*P/N_PP)).
// The layout maths is pure (testable without MPI); Topology adds the MPI communicators.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parm/comm.h"
#include "parm/device.h"

namespace parm {

enum class Group { kWorld, kDp, kMp, kEp, kEsp, kEdp, kPp, kNumGroups };
constexpr int kNumGroups = static_cast<int>(Group::kNumGroups);
const char* group_name(Group g);  // "world", "dp", "mp", "ep", "esp", "edp", "pp"
// Parses a group name; throws InvalidConfig listing the valid names.
Group parse_group(const std::string& name);

// The names an order nests, and the default order (docs/spec.md §1 with pp outermost).
constexpr int kOrderLength = 5;
constexpr const char* kDefaultOrder = "mp-esp-ep-dp-pp";

struct Layout {
  int world = 1;
  int mp = 1, ep = 1, esp = 1, pp = 1;
  int dp = 1, edp = 1;  // derived: world / (mp x pp) and world / (ep x esp x pp)
  // Innermost first, each of kMp, kEsp, kEp, kDp, kPp once; kDp names the dp dimension of the
  // dense part and the edp dimension of the MoE part.
  std::array<Group, kOrderLength> order{Group::kMp, Group::kEsp, Group::kEp, Group::kDp,
                                        Group::kPp};

  int group_size(Group g) const;
  std::string order_name() const;  // e.g. "mp-esp-ep-dp-pp"
};

// Validates and derives dp and edp. `order` names the nesting innermost first ("mp-esp-ep-dp-pp";
// a name whose size is 1 may be left out). Throws InvalidConfig naming the broken constraint
// and the values (or orders) that would be valid.
Layout make_layout(int world, int mp, int ep, int esp, int pp = 1,
                   const std::string& order = kDefaultOrder);

// Where a world rank sits in group g: `index` numbers the group instances, `rank` is the
// position inside the group.
struct GroupCoord {
  int index = 0;
  int rank = 0;
};
GroupCoord group_coord(const Layout& layout, Group g, int world_rank);
// World ranks of the members of `world_rank`'s group g, in group-rank order.
std::vector<int> group_members(const Layout& layout, Group g, int world_rank);
// The pipeline stage of a world rank, in [0, pp): its rank in its pp group. The pp group of a
// rank holds the ranks at the same position in every other dimension, one per stage, in stage
// order: group_members(layout, Group::kPp, r)[s] is r's peer in stage s.
int stage_of(const Layout& layout, int world_rank);
// True when the ESP groups are the MP groups (same ranks, same positions): what the baseline
// with N_ESP = N_MP > 1 needs (its ESP shards read the MP group's duplicated tokens).
bool esp_groups_are_mp_groups(const Layout& layout);

// Node of each world rank when ranks_per_node emulates a cluster.
std::vector<int> emulated_nodes(int world, int ranks_per_node);
// True when all members of world_rank's group g share a node.
bool group_is_intra_node(const Layout& layout, Group g, int world_rank,
                         const std::vector<int>& node_of_rank);

// What moves device buffers (device = cuda): NCCL directly between GPUs, or MPI through
// host memory (several ranks sharing one GPU, which NCCL refuses). kAuto: NCCL when every
// node has at least as many GPUs as ranks, else MPI.
enum class CommBackend { kAuto, kMpi, kNccl };
const char* comm_backend_name(CommBackend b);  // "auto", "mpi", "nccl"
CommBackend parse_comm_backend(const std::string& name);

struct TopologyOptions {
  int mp = 1, ep = 1, esp = 1, pp = 1;
  std::string order = kDefaultOrder;  // see make_layout
  int ranks_per_node = 0;   // 0: detect with MPI_COMM_TYPE_SHARED
  double timeout_s = 300.0; // watchdog deadline of every operation
  // Build a one-rank topology over MPI_COMM_SELF (every group of size 1; mp, ep, esp, pp must
  // be 1): a single-process reference model inside a multi-rank job. Not collective.
  bool self_only = false;
  // Where the buffers of comm(g) live; host_comm(g) always moves host memory over MPI.
  Device device = Device::kCpu;
  CommBackend comm = CommBackend::kAuto;  // device = cuda only
  // Tests: on the CPU, comm(g) stages host buffers through host copies (StagedCommunicator
  // with memcpy), so the multi-rank GPU path's staging runs, and is checked, without a GPU.
  bool stage_host_buffers = false;
  // With stage_host_buffers: how comm(g) tells a buffer's memory space. Null: every buffer
  // counts as device memory (host memory stands in for it); a test passes its own to see a
  // buffer of the wrong space refused (a host buffer where comm(g) wants device memory).
  SpaceOfFn emulated_space_of = nullptr;
};

// The communicators of one rank. Collective: every rank of the world constructs it with the
// same options. Bounded like every operation: a rank that does not take part makes the
// others throw parm::Timeout (naming the rank and the setup step) after timeout_s.
class Topology {
 public:
  static std::unique_ptr<Topology> create(const TopologyOptions& options);
  // A topology over host communicators another library built (the torch.distributed
  // backend, python/torch_group.cpp): `comms[g]` is group g of `world_rank` in `layout` (each
  // of the layout's size and this rank's position, checked here: InvalidConfig naming the
  // group otherwise); `node_of_rank` the node of every world rank. Makes no call to MPI.
  // device cuda (CUDA builds, a GPU per rank): comm(g) is Parm's own NCCL communicator,
  // bootstrapped over comms[g] (its unique id broadcast over it), collective over each group.
  static std::unique_ptr<Topology> adopt(
      const Layout& layout, int world_rank, std::vector<int> node_of_rank,
      std::array<std::unique_ptr<Communicator>, kNumGroups> comms,
      Device device = Device::kCpu);
  ~Topology();

  const Layout& layout() const { return layout_; }
  int world_rank() const { return world_rank_; }
  // Group g's communicator for buffers on device(); host_comm(g) is its MPI communicator
  // over host memory (the same one when device() is the CPU). Both share one set of
  // counters. Each refuses buffers outside its memory space (Communicator::memory_space):
  // host data (gradients of host tensors, scalars) goes to host_comm(g).
  Communicator& comm(Group g) { return *comms_[static_cast<int>(g)]; }
  Communicator& host_comm(Group g) { return *host_comms_[static_cast<int>(g)]; }
  Device device() const { return device_; }
  // "mpi" (host buffers, or device buffers staged through host memory), "nccl", or the
  // adopted communicators' backend ("torch").
  const char* comm_backend() const { return nccl_ ? "nccl" : host_comms_[0]->backend(); }
  int node_of(int world_rank) const { return node_of_rank_[world_rank]; }
  int num_nodes() const;
  bool nodes_emulated() const { return emulated_; }
  const std::vector<std::string>& node_names() const { return node_names_; }
  void set_timeout_s(double s);
  void reset_stats();

 private:
  Topology() = default;
  Layout layout_;
  int world_rank_ = 0;
  bool emulated_ = false;
  std::vector<int> node_of_rank_;
  std::vector<std::string> node_names_;  // per node: host name of its first rank
  Device device_ = Device::kCpu;
  bool nccl_ = false;
  std::array<std::unique_ptr<Communicator>, kNumGroups> host_comms_;  // MPI
  std::array<std::unique_ptr<Communicator>, kNumGroups> device_comms_;  // device = cuda
  std::array<Communicator*, kNumGroups> comms_{};  // what comm(g) returns
};

}  // namespace parm
