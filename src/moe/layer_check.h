// Compares the distributed MoE layer under a schedule with the single-process oracle
// (fp64, moe/reference_moe.h) from the same seed: output, dx, l_aux and every gradient.
// Used by `parm check-layer` and by the equivalence tests.
//
// Every MP group g gets its own input x_g and output gradient dout_g. The oracle for group
// g is the single-process layer on x_g (S1: gating each of the N_MP slices separately,
// which equals the whole layer when nothing drops). Expert-weight gradients are compared
// whole: the sum over all ranks of their shards' gradients (the sum over EDP replicas that
// training all-reduces) against the oracle gradients summed over all MP groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/reference_moe.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {

struct LayerCheckOptions {
  ref::MoeShape shape;  // T per MP group
  schedule::Kind kind = schedule::Kind::kS1;
  bool fuse = false;  // S1/S2: fused collectives
  int chunks = 4;
  uint64_t seed = 1;
  float dl_aux = 0.5f;       // gradient of the loss with respect to l_aux (checks its path)
  double tolerance = 2e-4;   // on max |error| / max |oracle| of each tensor
  std::string dump_dir;      // non-empty: write .npy files and manifest.json there
  // > 0: uneven routing. Adds `skew` to every input element and skew / M to the gate
  // weight's column 0, so that expert 0 wins most 1st choices (it overflows; with k = 1
  // other experts get no token).
  float skew = 0.0f;
  // S1 only: compare with the whole-layer oracle instead of the per-slice one (equal when
  // neither drops anything).
  bool whole_oracle = false;
  // Of the expert products (the layer computes on topo.device()).
  Precision precision = Precision::kFp32;
};

// The default tolerance of a check at `precision`: fp32 2e-4; bf16 2e-2 (bf16 operands keep
// 8 significant bits, a relative rounding of up to 2^-9 = 2e-3 per operand; the fp32
// accumulation over K terms of random sign grows the error like the result, so a product
// is within a few 2^-9 of max |result|, and the two chained expert products and their
// adjoints stay well inside 2e-2; the gate and every reduction are fp32, so the routing is
// identical).
double default_tolerance(Precision precision);

struct TensorError {
  std::string name;
  double max_abs = 0.0;  // max over ranks of max |layer - oracle|
  double max_rel = 0.0;  // max_abs / max |oracle| (the tolerance applies to this)
  bool passed = false;
};

struct LayerCheckResult {
  std::vector<TensorError> errors;
  int64_t oracle_slices = 1;    // 1, or N_MP for S1
  int64_t dropped_choices = 0;  // by the oracle over all MP groups
  bool routing_matches = true;  // the layer routed exactly as the oracle on every rank
  bool passed = false;
};

// Collective over the world. Every rank returns the same result.
LayerCheckResult check_layer(Topology& topo, const LayerCheckOptions& options);

// The input, output gradient and seeds the check (and bench-layer) use for MP group g.
std::vector<float> check_input(const ref::MoeShape& shape, uint64_t seed, int group);
std::vector<float> check_dout(const ref::MoeShape& shape, uint64_t seed, int group);

}  // namespace parm
