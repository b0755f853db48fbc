// One micro-batch of token ids, and the ids themselves: what src/data produces and the
// model (src/model) consumes. Depends on nothing else of the project.
#pragma once

#include <cstdint>
#include <vector>

namespace parm::data {

// Byte-level tokenizer: token = byte value (0..255). BERT's [MASK] is 256, so a BERT model
// over bytes has vocab = kBertVocab; GPT-2 uses the 256 bytes only.
constexpr int32_t kByteVocab = 256;
constexpr int32_t kBertMaskToken = 256;
constexpr int64_t kBertVocab = 257;

// One micro-batch for this rank's MP group: B sequences of L tokens (identical on every rank
// of the MP group). targets[i] < 0: no loss at that position (BERT: unmasked positions).
struct Batch {
  int64_t batch = 0;             // B
  int64_t seq_len = 0;           // L
  std::vector<int32_t> tokens;   // (B, L) inputs
  std::vector<int32_t> targets;  // (B, L) next token (GPT-2) or original token (BERT), -1 = none
};

}  // namespace parm::data
