// BatchSource::train_targets: the count of positions with a target that train_batch builds,
// which the trainer uses instead of summing the replicas' counts over dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "data/batches.h"
#include "data/corpus.h"

namespace parm::data {
namespace {

Corpus text_corpus() {
  std::vector<int32_t> ids;
  for (int i = 0; i < 10000; ++i) ids.push_back('a' + (i * 7) % 26);
  return corpus_of_ids("synthetic", ids, 256, nullptr, 0.4, 32);
}

int64_t counted(const Batch& b) {
  return static_cast<int64_t>(
      std::count_if(b.targets.begin(), b.targets.end(), [](int32_t y) { return y >= 0; }));
}

TEST(BatchTargets, CountsWhatTrainBatchHolds) {
  const Corpus corpus = text_corpus();
  for (Objective o : {Objective::kCausal, Objective::kMasked}) {
    const BatchSource source(corpus, o, 32, 5);
    for (int64_t first : {0, 3, 17})
      for (int64_t count : {0, 1, 6}) {
        SCOPED_TRACE(::testing::Message() << "objective " << static_cast<int>(o) << ", first "
                                          << first << ", count " << count);
        EXPECT_EQ(source.train_targets(first, count), counted(source.train_batch(first, count)));
      }
  }
  // Masked: a fraction of the positions, not all, so a count of every position fails here.
  const BatchSource masked(corpus, Objective::kMasked, 32, 5);
  const int64_t n = masked.train_targets(0, 16);
  EXPECT_GT(n, 0);
  EXPECT_LT(n, 16 * 32 / 2);
  // A step's sequences split over micro-batches and replicas add up to the whole range.
  EXPECT_EQ(masked.train_targets(4, 4) + masked.train_targets(8, 8), masked.train_targets(4, 12));
}

}  // namespace
}  // namespace parm::data
