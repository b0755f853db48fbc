#include "data/batches.h"

#include <limits>

#include "parm/error.h"
#include "parm/rng.h"

namespace parm::data {
namespace {

constexpr uint64_t kStreamTrainOffsets = 0x7261696e;  // "rain"
constexpr uint64_t kStreamValOffsets = 0x76616c;      // "val"
constexpr uint64_t kStreamMask = 0x6d61736b;          // "mask"
// BERT masking: 15% of positions are predicted; of those 80% become [MASK], 10% a random
// token, 10% stay.
constexpr uint32_t kMaskPerMille = 150;

}  // namespace

BatchSource::BatchSource(const Corpus& corpus, Objective objective, int64_t seq_len,
                         uint64_t seed)
    : corpus_(corpus), objective_(objective), seq_len_(seq_len), seed_(seed) {}

Batch BatchSource::make(const TokenSpan& text, uint64_t stream, int64_t first,
                        int64_t count) const {
  Batch b;
  b.batch = count;
  b.seq_len = seq_len_;
  b.tokens.resize(static_cast<size_t>(count * seq_len_));
  b.targets.resize(b.tokens.size());
  const uint64_t span = static_cast<uint64_t>(text.size() - seq_len_ - 1);
  const Rng offsets(seed_, stream);
  std::vector<int32_t> ids(static_cast<size_t>(seq_len_ + 1));
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t g = static_cast<uint64_t>(first + i);
    const auto start = static_cast<int64_t>(offsets.block(g)[0] % span);
    text.copy_to(start, seq_len_ + 1, ids.data());
    int32_t* tok = &b.tokens[static_cast<size_t>(i * seq_len_)];
    int32_t* tgt = &b.targets[static_cast<size_t>(i * seq_len_)];
    for (int64_t t = 0; t < seq_len_; ++t) {
      const int32_t id = ids[static_cast<size_t>(t)];
      if (objective_ == Objective::kCausal) {
        tok[t] = id;
        tgt[t] = ids[static_cast<size_t>(t) + 1];
        continue;
      }
      const auto r = mask_draw(stream, g, t);
      tok[t] = id;
      tgt[t] = -1;
      if (r[0] % 1000 < kMaskPerMille) {
        tgt[t] = id;
        const uint32_t kind = r[1] % 10;
        if (kind < 8) tok[t] = mask_token();
        else if (kind == 8)
          tok[t] = static_cast<int32_t>(r[2] % static_cast<uint32_t>(corpus_.vocab));
      }
    }
  }
  return b;
}

// One Philox block per (sequence, position): the same mask on every layout.
std::array<uint32_t, 4> BatchSource::mask_draw(uint64_t stream, uint64_t g, int64_t t) const {
  return Rng(seed_, kStreamMask ^ stream)
      .block(g * static_cast<uint64_t>(seq_len_) + static_cast<uint64_t>(t));
}

void BatchSource::check_position(int64_t position, int64_t sequences_ahead,
                                 const std::string& origin) const {
  PARM_CHECK(sequences_ahead >= 0, "sequences ahead {}", sequences_ahead);
  const int64_t last = std::numeric_limits<int64_t>::max() - sequences_ahead;
  PARM_CONFIG_CHECK(position >= 0 && position <= last,
                    "{}: data position {} cannot be reached by this run: its {} sequences to "
                    "come would run past the largest sequence number {}; valid data positions "
                    "for this run: 0 to {}",
                    origin, position, sequences_ahead, std::numeric_limits<int64_t>::max(),
                    last);
}

int64_t BatchSource::train_targets(int64_t first, int64_t count) const {
  PARM_CHECK(first >= 0 && count >= 0, "train_targets of sequences [{}, {} + {})", first, first,
             count);
  if (objective_ == Objective::kCausal) return count * seq_len_;
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i)
    for (int64_t t = 0; t < seq_len_; ++t)
      n += mask_draw(kStreamTrainOffsets, static_cast<uint64_t>(first + i), t)[0] % 1000 <
           kMaskPerMille;
  return n;
}

Batch BatchSource::train_batch(int64_t first, int64_t micro_batch) const {
  return make(corpus_.train, kStreamTrainOffsets, first, micro_batch);
}

Batch BatchSource::val_batch(int64_t index, int64_t micro_batch) const {
  return make(corpus_.val, kStreamValOffsets, index * micro_batch, micro_batch);
}

}  // namespace parm::data
