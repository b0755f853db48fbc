#include "data/batches.h"

#include "parm/error.h"
#include "parm/rng.h"

namespace parm::data {
namespace {

constexpr uint64_t kStreamTrainOffsets = 0x7261696e;  // "rain"
constexpr uint64_t kStreamValOffsets = 0x76616c;      // "val"
constexpr uint64_t kStreamMask = 0x6d61736b;          // "mask"
// BERT masking: 15% of positions are predicted; of those 80% become [MASK], 10% a random
// byte, 10% stay.
constexpr uint32_t kMaskPerMille = 150;

}  // namespace

BatchSource::BatchSource(const Corpus& corpus, Objective objective, int64_t seq_len,
                         uint64_t seed)
    : corpus_(corpus), objective_(objective), seq_len_(seq_len), seed_(seed) {}

Batch BatchSource::make(const std::vector<uint8_t>& text, uint64_t stream, int64_t first,
                               int64_t count) const {
  Batch b;
  b.batch = count;
  b.seq_len = seq_len_;
  b.tokens.resize(static_cast<size_t>(count * seq_len_));
  b.targets.resize(b.tokens.size());
  const uint64_t span = text.size() - static_cast<uint64_t>(seq_len_) - 1;
  const Rng offsets(seed_, stream);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t g = static_cast<uint64_t>(first + i);
    const uint64_t start = offsets.block(g)[0] % span;
    int32_t* tok = &b.tokens[static_cast<size_t>(i * seq_len_)];
    int32_t* tgt = &b.targets[static_cast<size_t>(i * seq_len_)];
    for (int64_t t = 0; t < seq_len_; ++t) {
      const int32_t byte = text[start + static_cast<uint64_t>(t)];
      if (objective_ == Objective::kCausal) {
        tok[t] = byte;
        tgt[t] = text[start + static_cast<uint64_t>(t) + 1];
        continue;
      }
      const auto r = mask_draw(stream, g, t);
      tok[t] = byte;
      tgt[t] = -1;
      if (r[0] % 1000 < kMaskPerMille) {
        tgt[t] = byte;
        const uint32_t kind = r[1] % 10;
        if (kind < 8) tok[t] = kBertMaskToken;
        else if (kind == 8) tok[t] = static_cast<int32_t>(r[2] % kByteVocab);
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
