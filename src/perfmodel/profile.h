// The cost profile: the fitted parameters of the alpha-beta model (docs/spec.md §5) and a
// description of the machine they were measured on, stored as versioned JSON so that a run
// can reuse a calibration (`parm calibrate --out profile.json`).
//
// Units: times in microseconds, sizes in bytes, rates in GB/s and GFLOP/s (1e9).
//
//   collective on link L, op o, group of n ranks (model.h: collective_us):
//     alpha(n) = alpha_us + alpha_per_rank_us * (n - 2)
//     intra:  t_us = alpha(n) + beta_us_per_byte * bus_bytes
//     inter:  t_us = alpha(n) + beta_intra * intra_share * bus_bytes
//                             + beta_us_per_byte * link_share * bus_bytes
//   (bus bytes carry the (n-1)/n volume factors, comm.h; an inter beta is per byte through
//   one node's link, shared by every rank of the node that sends across it)
//   GEMM of class c (m, n, k):   t_us = s (alpha_us + 2 m n k / (gflops * 1e3))
//   memory-bound kernel class c: t_us = s (alpha_us + bytes / (gbps * 1e3))
//   (s = layer_compute.scale, measured inside the layer; 1 in older profiles)
//   fused collective:            see model.h (overlap in [0, 1]; eager_gain in [0, 1])
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parm/comm.h"
#include "parm/device.h"

namespace parm::perfmodel {

// Link classes: a group is intra-node when all its ranks share a node.
enum class Link { kIntra, kInter };
constexpr int kNumLinks = 2;
const char* link_name(Link link);  // "intra", "inter"

// The collectives the schedules issue, in profile order.
constexpr std::array<CommOp, 4> kModelOps = {CommOp::kAllReduce, CommOp::kAllGather,
                                             CommOp::kReduceScatter, CommOp::kAllToAll};
int model_op_index(CommOp op);  // throws parm::Error for an op the model does not price

// GEMM shape classes: the expert products by transpose pattern (forward nn, weight
// gradient tn, input gradient nt) and the gate's skinny products (one side = E).
enum class GemmClass { kExpertNN, kExpertTN, kExpertNT, kGate };
constexpr int kNumGemmClasses = 4;
const char* gemm_class_name(GemmClass c);  // "expert_nn", "expert_tn", "expert_nt", "gate"

// Memory-bound kernels: row copies, zero fills, scatter-adds (dispatch, combine, layout
// gathers) and the GeLU (tanh form: heavier per byte than a copy on a CPU).
enum class MemClass { kCopy, kGelu };
constexpr int kNumMemClasses = 2;
const char* mem_class_name(MemClass c);  // "copy", "gelu"

// Where an entry came from: "measured", "emulated" (measured over shared memory on groups
// that --ranks-per-node labels inter-node), "assumed" (copied or taken from a datasheet).
struct CommFit {
  double alpha_us = 0.0;           // latency of a group of 2 ranks
  double alpha_per_rank_us = 0.0;  // latency added by each rank beyond 2
  double beta_us_per_byte = 0.0;   // intra: per bus byte; inter: per byte over a node's link
  double r2 = 1.0;
  int64_t samples = 0;
  std::vector<int> group_sizes;    // sizes of the groups it was measured on (empty: none)
  std::string source = "assumed";  // of alpha_us and beta_us_per_byte
  std::string alpha_per_rank_source = "assumed";
  // Inter link only: added where a rank's message to one peer is above the transport's eager
  // limit (fused.eager_limit_bytes): the rendezvous handshake (model.h). Older profiles: 0.
  double handshake_us = 0.0;
  std::string handshake_source = "assumed 0 (not in the profile)";
  double alpha(int n) const { return alpha_us + alpha_per_rank_us * std::max(0, n - 2); }
};

struct GemmFit {
  double alpha_us = 0.0;
  double gflops = 1.0;
  double r2 = 1.0;
  int64_t samples = 0;
  std::string source = "assumed";
  double us(double flops) const { return alpha_us + flops / (gflops * 1e3); }
};

struct MemFit {
  double alpha_us = 0.0;
  double gbps = 1.0;
  double r2 = 1.0;
  int64_t samples = 0;
  std::string source = "assumed";
  double us(double bytes) const { return alpha_us + bytes / (gbps * 1e3); }
};

// How much of the ideal pipeline overlap of a fused collective this machine achieves
// (model.h): 1 = the pipeline (links of different classes fully in parallel), 0 = no faster
// than its parts unfused one after the other. `calibrate` measures it in [0, 1]; profiles
// of older calibrations may hold values below 0 (slower than the parts), so reading accepts
// [kMinOverlap, 1].
constexpr double kMinOverlap = -5.0;
struct FusedFit {
  double overlap = 1.0;
  // Extra latency of each piece beyond the first, per fused collective (us): the cost of
  // cutting one collective into W point-to-point rounds that the parts' alphas do not cover.
  double per_piece_us = 0.0;
  double r2 = 1.0;
  int64_t samples = 0;
  std::string source = "assumed";
  // The rendezvous a fused step's pieces avoid (model.h, eager_saving_us): the largest
  // message the inter-node transport sends eagerly (bytes; 0: no such limit priced), and
  // the share of an inter-node part's bytes time saved where its unfused messages are above
  // that limit and its pieces' are not. `calibrate` measures the share inside the layer
  // (calibrate_fused_layer); older profiles: 0 (not priced). Two shares, by the span of the
  // part's group: eager_gain where every peer of a rank lies on another node, eager_gain_mixed
  // where some share its node (their messages go over shared memory, whose own eager limit
  // is below every piece, so those pieces still wait for the receiver); older profiles:
  // eager_gain_mixed = eager_gain.
  double eager_limit_bytes = 0.0;
  std::string eager_limit_source = "assumed 0 (not in the profile)";
  double eager_gain = 0.0;
  std::string eager_gain_source = "assumed 0 (not in the profile)";
  double eager_gain_mixed = 0.0;
  std::string eager_gain_mixed_source = "assumed 0 (not in the profile)";
};

// The rendezvous of a collective step that follows computation: ranks arrive at different
// times and a loaded or oversubscribed machine has descheduled some of them, which a
// collective timed back to back (the collective fits) never pays. Added once per collective
// step and direction (model.h, rendezvous_us): us + per_compute * the compute the ranks ran
// since their last collective, that compute taken up to compute_cap_us where a cap is set.
struct SyncFit {
  double us = 0.0;
  // Extra wait per us of compute before the step (dimensionless): a longer computation is
  // descheduled more often, so the last rank arrives later.
  double per_compute = 0.0;
  double r2 = 1.0;
  int64_t samples = 0;
  std::string source = "assumed";
  // The compute (us) beyond which the wait stops growing (0: none). Ranks that share cores
  // take turns on them, so their arrivals drift apart with the computation only until the
  // scheduler's rotation bounds it (issue 42: on 2 x 4 ranks of 2 cores the layers with 6x
  // the calibration's compute waited 1.5-2x as long, not 6x).
  double compute_cap_us = 0.0;
};

// How much slower the layer's compute runs than the products and kernels timed alone
// (model.h): with more ranks than cores, ranks that wait in MPI poll and yield and take
// cycles from those that compute, which calibration's products (all ranks computing at
// once) never see. `calibrate` measures it inside the layer (calibrate_fused_layer); older
// profiles: 1.
constexpr double kMinComputeScale = 0.25, kMaxComputeScale = 4.0;
struct ComputeScale {
  double scale = 1.0;
  std::string source = "assumed 1 (not in the profile)";
};

struct Profile {
  // 2: per-group-size latency (alpha_per_rank_us), inter beta per byte over a node's link,
  // group_sizes and per-term sources. Version 1 files are refused (their inter beta meant
  // per bus byte of one group, which version 2 cannot reinterpret without the layout).
  static constexpr int kVersion = 2;
  nlohmann::json machine = nlohmann::json::object();  // hostname, cores, cpu, mpi, onednn...
  // The device kind whose products and collectives were measured (JSON "device"; profiles
  // written before the key existed were all taken on the CPU).
  Device device = Device::kCpu;
  std::array<std::array<CommFit, kModelOps.size()>, kNumLinks> comm{};
  FusedFit fused;
  ComputeScale layer_compute;  // JSON "layer_compute": {"scale", "source"}
  SyncFit step_sync;        // a collective step on groups smaller than the world
  SyncFit step_sync_world;  // one on the group of every rank
  SyncFit step_sync_intra;  // one whose groups all lie within a node (absent: step_sync)
  std::array<GemmFit, kNumGemmClasses> gemm{};
  std::array<MemFit, kNumMemClasses> mem{};

  const CommFit& collective(Link link, CommOp op) const {
    return comm[static_cast<size_t>(link)][static_cast<size_t>(model_op_index(op))];
  }
  CommFit& collective(Link link, CommOp op) {
    return comm[static_cast<size_t>(link)][static_cast<size_t>(model_op_index(op))];
  }
  const GemmFit& gemm_fit(GemmClass c) const { return gemm[static_cast<size_t>(c)]; }
  GemmFit& gemm_fit(GemmClass c) { return gemm[static_cast<size_t>(c)]; }
  const MemFit& mem_fit(MemClass c) const { return mem[static_cast<size_t>(c)]; }
  MemFit& mem_fit(MemClass c) { return mem[static_cast<size_t>(c)]; }
};

// JSON form (see docs/perfmodel.md):
// {"version": 2, "machine": {...}, "device": "cpu" | "cuda" (absent: "cpu"),
//  "collectives": {"intra": {"allreduce": {"alpha_us", "alpha_per_rank_us",
//                  "beta_us_per_byte", "r2", "samples", "group_sizes": [n, ...], "source",
//                  "alpha_per_rank_source"}, "allgather", "reduce_scatter", "alltoall"},
//                  "inter": {...}},
//  "fused": {"overlap", "per_piece_us", "r2", "samples", "source"},
//  "step_sync": {"us", "per_compute" (absent: 0), "r2" (absent: 1), "samples", "source"},
//  "step_sync_world": {the same keys} (absent: a copy of step_sync),
//  "step_sync_intra": {the same keys} (absent: a copy of step_sync),
//  "gemm": {"expert_nn": {"alpha_us", "gflops", "r2", "samples", "source"}, "expert_tn",
//           "expert_nt", "gate"},
//  "memory": {"copy": {"alpha_us", "gbps", "r2", "samples", "source"}, "gelu"}}
nlohmann::json profile_to_json(const Profile& p);
// Refuses (parm::InvalidConfig naming `origin` and the key path) a wrong or missing version,
// a missing entry, a value that is not a number, or a value out of range (negative times,
// non-positive rates, overlap outside [0, 1]).
Profile profile_from_json(const nlohmann::json& j, const std::string& origin);
Profile read_profile(const std::string& path);  // also refuses unreadable / non-JSON files
void write_profile(const Profile& p, const std::string& path);

// Refuses (parm::InvalidConfig, before any work) a profile taken on another device kind than
// the run's: its rates would price the wrong machine. The message names both devices, the
// file (origin) and how to get a matching profile.
void check_profile_device(const Profile& p, Device run, const std::string& origin);

}  // namespace parm::perfmodel
