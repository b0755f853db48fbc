// Deterministic batches: sequence number g of the run (0, 1, 2, ...) always starts at the
// same offset of the training text, whatever the layout, so a run can resume at any step
// and a parallel run sees exactly the sequences a single-process run sees.
//
// Optimizer step s consumes global_batch = micro_batch * grad_accum * N_DP sequences:
// micro-batch j (0 <= j < grad_accum * N_DP) of step s holds sequences
// s * global_batch + j * micro_batch + [0, micro_batch). DP replica d runs the micro-batches
// j = a * N_DP + d for a = 0 .. grad_accum - 1; a single process with grad_accum * N_DP
// micro-batches runs them all, in the same groups.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "data/batch.h"
#include "data/corpus.h"

namespace parm::data {

enum class Objective { kCausal, kMasked };

class BatchSource {
 public:
  BatchSource(const Corpus& corpus, Objective objective, int64_t seq_len, uint64_t seed);

  // Training micro-batch of `micro_batch` sequences starting at sequence number `first`.
  Batch train_batch(int64_t first, int64_t micro_batch) const;
  // The positions with a target (>= 0) in training sequences [first, first + count): the count
  // train_batch(first, count) holds, without building it (causal: every position; masked:
  // one mask draw per position). The trainer counts a whole step's targets with it on every
  // rank instead of summing the replicas' counts over dp.
  int64_t train_targets(int64_t first, int64_t count) const;
  // Refuses (parm::InvalidConfig naming `origin`, e.g. the checkpoint, and the valid range) a
  // data position from which `sequences_ahead` more sequences would overflow the sequence
  // numbers (int64), or a negative one.
  void check_position(int64_t position, int64_t sequences_ahead, const std::string& origin) const;
  // BERT's [MASK]: the id after the tokenizer's last (256 for bytes).
  int32_t mask_token() const { return corpus_.vocab; }
  // Validation batch `index` (fixed sequences of the validation text).
  Batch val_batch(int64_t index, int64_t micro_batch) const;

 private:
  Batch make(const TokenSpan& text, uint64_t stream, int64_t first, int64_t count) const;
  // The masked objective's draw for position t of sequence g: r[0] selects the position.
  std::array<uint32_t, 4> mask_draw(uint64_t stream, uint64_t g, int64_t t) const;

  const Corpus& corpus_;
  Objective objective_;
  int64_t seq_len_;
  uint64_t seed_;
};

}  // namespace parm::data
