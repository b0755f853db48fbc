// Rank layout (SPEC §1) and the communicator of every group.
//
// Dense part:  P = N_DP x N_MP. MP groups are contiguous blocks of N_MP ranks; DP is the
//              stride-N_MP dimension.
// MoE part:    P = N_EDP x N_EP x N_ESP. ESP groups are contiguous blocks of N_ESP ranks;
//              EP is the stride-N_ESP dimension inside a block of N_EP x N_ESP ranks; EDP is
//              the stride-(N_EP x N_ESP) dimension.
// The layout maths is pure (testable without MPI); Topology adds the MPI communicators.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parm/comm.h"
#include "parm/device.h"

namespace parm {

enum class Group { kWorld, kDp, kMp, kEp, kEsp, kEdp, kNumGroups };
constexpr int kNumGroups = static_cast<int>(Group::kNumGroups);
const char* group_name(Group g);  // "world", "dp", "mp", "ep", "esp", "edp"
// Parses a group name; throws InvalidConfig listing the valid names.
Group parse_group(const std::string& name);

struct Layout {
  int world = 1;
  int mp = 1, ep = 1, esp = 1;
  int dp = 1, edp = 1;  // derived

  int group_size(Group g) const;
};

// Validates and derives dp and edp. Throws InvalidConfig naming the broken constraint and the
// values that would be valid.
Layout make_layout(int world, int mp, int ep, int esp);

// Where a world rank sits in group g: `index` numbers the group instances, `rank` is the
// position inside the group.
struct GroupCoord {
  int index = 0;
  int rank = 0;
};
GroupCoord group_coord(const Layout& layout, Group g, int world_rank);
// World ranks of the members of `world_rank`'s group g, in group-rank order.
std::vector<int> group_members(const Layout& layout, Group g, int world_rank);

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
  int mp = 1, ep = 1, esp = 1;
  int ranks_per_node = 0;   // 0: detect with MPI_COMM_TYPE_SHARED
  double timeout_s = 300.0; // watchdog deadline of every operation
  // Build a one-rank topology over MPI_COMM_SELF (every group of size 1; mp, ep, esp must be
  // 1): a single-process reference model inside a multi-rank job. Not collective.
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
  // "mpi" (host buffers, or device buffers staged through host memory) or "nccl".
  const char* comm_backend() const { return nccl_ ? "nccl" : "mpi"; }
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
