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
  MoeShape shape;  // T per MP group; aux_seq_len > 0: the sequence-wise l_aux
  schedule::Kind kind = schedule::Kind::kS1;
  bool fuse = false;  // S1/S2: fused collectives
  int chunks = fused_plan::kDefaultChunks;
  uint64_t seed = 1;
  float dl_aux = 0.5f;       // gradient of the loss with respect to l_aux (checks its path)
  float dl_z = 0.0f;         // and with respect to the router z-loss (--router-z-loss)
  std::vector<float> router_bias;  // (E) the layer's router bias; empty: none
  double tolerance = 2e-4;   // on max |error| / max |oracle| of each tensor
  std::string dump_dir;      // non-empty: write .npy files and manifest.json there
  // > 0: uneven routing. Adds `skew` to every input element and skew / M to the gate
  // weight's column 0, so that expert 0 wins most 1st choices (it overflows; with k = 1
  // other experts get no token).
  float skew = 0.0f;
  // Zeroes the gate weight's columns of experts 0 and E - 1 (after `skew`): their logits are
  // then exactly +-0 for every token, whatever order a product sums in, so their
  // probabilities are bitwise equal in fp32 and fp64 and the tie rule (docs/spec.md §2: ties go to
  // the lower expert index) decides every token where one of them is among the k largest.
  bool force_ties = false;
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
  // Tokens, by the oracle over all MP groups, whose k choices (which experts, or their order)
  // the tie rule decided: two of their k + 1 largest probabilities are equal.
  int64_t tie_decided_tokens = 0;
  bool routing_matches = true;  // the layer routed exactly as the oracle on every rank
  // The names of the schedule's and the oracle's files in a dump (<source> below).
  std::string source, oracle_source;
  bool passed = false;
};

// Collective over the world. Every rank returns the same result.
LayerCheckResult check_layer(Topology& topo, const LayerCheckOptions& options);

// The input, output gradient and seeds the check (and bench-layer) use for MP group g.
std::vector<float> check_input(const MoeShape& shape, uint64_t seed, int group);
std::vector<float> check_dout(const MoeShape& shape, uint64_t seed, int group);

// --dump writes into dump_dir (world rank 0), besides manifest.json, which lists every file
// with its shape, dtype and meaning, the run's config and, under "sources", each source's
// gate slices:
//   input.x.npy, input.dout.npy          x and dout of MP group 0 (T, M) float32
//   input.x.g<G>.npy, input.dout.g<G>.npy  the same for every MP group G >= 1
//   param.<p>.npy                       whole parameters (skew and force_ties applied)
//   <source>.{out,dx,l_aux,dwg}.npy     MP group 0's results
//   <source>.d{w1,b1,w2,b2}.npy         expert gradients summed over all MP groups
//   <source>.expert.npy (T, k) int32    MP group 0's chosen experts, choice 0 the largest p
//   <source>.slot.npy   (T, k) int32    slot in the expert's capacity, -1 when dropped
//   <source>.kept.npy   (T, k) uint8    1 when kept
// <source> is "oracle" (one gate call over T), "oracle_sliced" (one gate call per MP slice
// of T / N_MP tokens, S1's oracle) or the schedule ("baseline", "s1", "s2_fused", ...). Slots
// are numbered per gate call: for s1 and oracle_sliced the slot is within the capacity of the
// token's MP slice, C = ceil(k f (T / N_MP) / E), counted from 0 in each slice.

}  // namespace parm
