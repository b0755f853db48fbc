#include "model/vocab_parallel.h"

#include "parm/error.h"

namespace parm::model {

VocabShard vocab_shard(int64_t vocab, int mp, int rank) {
  PARM_CHECK(mp >= 1 && rank >= 0 && rank < mp && vocab >= mp,
             "vocabulary of {} over mp {} (rank {}): every MP rank needs at least one row",
             vocab, mp, rank);
  VocabShard s;
  s.vocab = vocab;
  s.begin = uneven_begin(vocab, mp, rank);
  s.end = uneven_begin(vocab, mp, rank + 1);
  return s;
}

VocabParallelLoss::VocabParallelLoss(const DenseOps& ops, const VocabShard& shard,
                                     int64_t max_rows)
    : ops_(&ops),
      shard_(shard),
      max_rows_(max_rows),
      local_targets_(static_cast<size_t>(max_rows)),
      row_max_(ops, max_rows),
      stats_(ops, 2 * max_rows) {
  if (ops.device != Device::kCpu) targets_dev_ = DeviceArray<int32_t>(ops, max_rows);
}

double VocabParallelLoss::forward(TensorParallel& tp, const float* logits,
                                  const int32_t* targets, float* dlogits, int64_t n,
                                  float scale) {
  PARM_CHECK(ops_ != nullptr && n >= 0 && n <= max_rows_,
             "vocab-parallel loss over {} rows, built for {}", n, max_rows_);
  for (int64_t r = 0; r < n; ++r) {  // every target checked before any work
    const int32_t y = targets[r];
    PARM_CHECK(y >= 0 && y < shard_.vocab,
               "target {} of counted row {} is outside the vocabulary [0, {})", y, r,
               shard_.vocab);
    local_targets_[static_cast<size_t>(r)] =
        shard_.holds(y) ? static_cast<int32_t>(y - shard_.begin) : -1;
  }
  if (n == 0) return 0.0;
  const int32_t* local = ops_->device == Device::kCpu
                             ? local_targets_.data()
                             : targets_dev_.upload(local_targets_.data(), n);
  const int64_t cols = shard_.size();
  ops_->ce_row_max(logits, n, cols, row_max_.data());
  tp.row_max(row_max_.data(), n);
  ops_->ce_row_sums(logits, row_max_.data(), local, n, cols, stats_.data());
  tp.row_sum(stats_.data(), 2 * n);
  return ops_->ce_finish(logits, row_max_.data(), stats_.data(), local, dlogits, n, cols, scale);
}

}  // namespace parm::model
