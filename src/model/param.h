// A trainable parameter as one rank holds it, with what is needed to (a) reduce its gradient
// over the right group, (b) count it exactly once in the global gradient norm, and (c) save
// and load it layout-independently as the whole (unsharded) tensor.
#pragma once

#include <string>
#include <vector>

#include "parm/tensor.h"
#include "parm/topology.h"

namespace parm::model {

// The local tensor is the whole tensor cut along `dim` into `num_parts` equal contiguous
// parts, of which this rank holds part `part`. Several splits apply in order (an expert's
// W1 (E, M, H): dim 0 over ep, then dim 2 over esp). `uneven`: the extent n need not divide;
// part p is [p n / num_parts, (p + 1) n / num_parts) (floors; the vocabulary's rows over mp,
// model/vocab_parallel.h), so the parts differ by at most one.
struct Split {
  int dim = 0;
  int num_parts = 1;
  int part = 0;
  bool uneven = false;
};

// The first index of part `part` of `n` under an uneven split (part == num_parts: n).
inline int64_t uneven_begin(int64_t n, int num_parts, int part) {
  return n * part / num_parts;
}

struct Param {
  std::string name;            // stable across layouts, e.g. "blocks.3.attn.qkv.weight"
  Tensor value;                // local shard
  Tensor grad;                 // same shape; accumulated (+=) by backward passes
  Shape whole_shape;           // the unsharded tensor
  std::vector<Split> splits;   // empty: this rank holds the whole tensor
  // Groups over which identical copies of this local tensor live (e.g. {dp} for an MP-split
  // weight, {dp, mp} for a layernorm gain, {edp} for an expert shard, {edp, esp} for an
  // expert's b2). The rank that is rank 0 of all of them owns the copy for the norm and
  // for saving.
  std::vector<Group> replicated_over;
  // Group whose ranks hold the same parameter but see different data: gradients are
  // all-reduced (summed) over it before the update (dp for dense, edp for experts).
  Group grad_reduce = Group::kDp;
  bool weight_decay = true;    // AdamW decays matrices, not biases/gains
};

// ---- Whole <-> shard mapping (checkpoints, tests, initialisation) ----------------------

// The box a rank's shard occupies in the whole tensor: per dimension, the first index and
// the extent. Splits apply in order; each must divide its dimension's current extent.
// Throws parm::Error for a split that does not fit the shape.
struct ShardBox {
  Shape offset;
  Shape extent;  // the local tensor's shape
};
ShardBox shard_box(const Shape& whole_shape, const std::vector<Split>& splits);
// The local tensor's shape.
inline Shape local_shape(const Shape& whole_shape, const std::vector<Split>& splits) {
  return shard_box(whole_shape, splits).extent;
}
// local (the shard's shape) = this rank's part of whole (whole_shape). Overwrites local.
void copy_shard_from_whole(const Tensor& whole, const std::vector<Split>& splits, Tensor& local);
// Writes local into its box of whole (overwrites that part of whole only).
void copy_shard_to_whole(const Tensor& local, const std::vector<Split>& splits, Tensor& whole);
// For each contiguous run of the local tensor (row-major): fn(local_offset, whole_offset, n)
// in elements. The building block of the copies above.
template <typename Fn>
void for_each_shard_run(const Shape& whole_shape, const std::vector<Split>& splits, Fn&& fn);

// True when this rank holds the copy of `p` that counts (for the global norm and for saving):
// it is rank 0 of every group in p.replicated_over.
bool owns_copy(const Param& p, Topology& topo);

}  // namespace parm::model

// ---- template implementation ----
namespace parm::model {
template <typename Fn>
void for_each_shard_run(const Shape& whole_shape, const std::vector<Split>& splits, Fn&& fn) {
  const ShardBox box = shard_box(whole_shape, splits);
  const int nd = static_cast<int>(whole_shape.size());
  if (nd == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  // Merge trailing dimensions that the shard holds whole into one contiguous run.
  int inner = nd - 1;
  int64_t run = box.extent[inner];
  while (inner > 0 && box.extent[inner] == whole_shape[inner] && box.offset[inner] == 0) {
    --inner;
    run *= box.extent[inner];
  }
  // Strides of the whole tensor.
  std::vector<int64_t> stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * whole_shape[d + 1];
  int64_t num_runs = 1;
  for (int d = 0; d < inner; ++d) num_runs *= box.extent[d];
  if (run == 0) return;
  std::vector<int64_t> idx(inner, 0);  // position over dims [0, inner)
  for (int64_t r = 0; r < num_runs; ++r) {
    int64_t whole_off = box.offset[inner] * stride[inner];
    for (int d = 0; d < inner; ++d) whole_off += (box.offset[d] + idx[d]) * stride[d];
    fn(r * run, whole_off, run);
    for (int d = inner - 1; d >= 0; --d) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace parm::model
