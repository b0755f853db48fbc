// Megatron's vocabulary-parallel embedding, LM head and cross-entropy over the `mp` group
// (VocabParallelEmbedding, vocab_parallel_cross_entropy; docs/vocab-parallel.md).
//
// MP rank r of N holds rows [r V / N, (r + 1) V / N) of the tied word embedding wte (V, M)
// (floors: a V that N does not divide gives shards that differ by one row, e.g. BERT's 257
// over 2 ranks is 128 + 129; V < N is refused by validate_model). The BERT decoder bias (V)
// is split the same way. Checkpoints keep the whole tensors (model/param.h's uneven Split).
//
//   embedding  each rank writes wte[token] + wpe[position] for the tokens it holds and 0 for
//              the others; an all-reduce over mp sums them: x + 0 + ... + 0 is the unsplit
//              row bit for bit. Backward: the gradient at the output is complete on every
//              rank; each adds it into the rows it holds (wpe: replicated, complete).
//   head       logits (n, V / N) = z wte_shard^T: never (n, V) on one rank.
//   loss       per row: the max over the shards (all-reduce max), then the sum of
//              exp(logit - max) and the target's logit, which only its holder contributes
//              (one all-reduce of 2n doubles): loss = log(sum) + max - target logit, the same
//              number on every rank. dlogits stay with their shard.
//   backward   dz = dlogits_shard wte_shard is partial: all-reduce over mp (Megatron's f);
//              dwte_shard += dlogits_shard^T z (no communication).
#pragma once

#include <cstdint>
#include <vector>

#include "model/dense_ops.h"
#include "model/param.h"
#include "model/tp.h"

namespace parm::model {

// The rows of a vocabulary of `vocab` that MP rank `rank` of `mp` holds: [begin, end).
struct VocabShard {
  int64_t vocab = 0;
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool holds(int64_t token) const { return token >= begin && token < end; }
};
VocabShard vocab_shard(int64_t vocab, int mp, int rank);
// The registry's split of a (V, ...) tensor over mp (dim 0, uneven).
inline Split vocab_split(int mp, int rank) { return Split{0, mp, rank, true}; }

// The cross-entropy of logits split by columns over the MP group (this rank: its shard's
// columns), with the buffers of its per-row numbers allocated once for up to `max_rows` rows
// on ops.device.
class VocabParallelLoss {
 public:
  VocabParallelLoss() = default;
  VocabParallelLoss(const DenseOps& ops, const VocabShard& shard, int64_t max_rows);

  // logits (n, shard.size()) of this rank's columns; targets (n, host) ids of the whole
  // vocabulary, checked to lie in [0, V) on every rank before any work. Returns the sum over
  // the n rows of -log softmax(target) over the whole vocabulary (the same on every MP
  // rank). dlogits non-null: dlogits (n, shard.size()) = scale * (softmax - onehot(target))
  // at this rank's columns, overwritten (may alias logits). Every MP rank calls it with the
  // same n and targets (they are collectives over tp's group).
  double forward(TensorParallel& tp, const float* logits, const int32_t* targets,
                 float* dlogits, int64_t n, float scale);

 private:
  const DenseOps* ops_ = nullptr;
  VocabShard shard_;
  int64_t max_rows_ = 0;
  std::vector<int32_t> local_targets_;  // (max_rows) host: target - begin, or -1
  DeviceArray<int32_t> targets_dev_;    // their copy off the CPU
  DeviceArray<float> row_max_;          // (max_rows)
  DeviceArray<double> stats_;           // (max_rows, 2): sum of exps, target logit
};

}  // namespace parm::model
