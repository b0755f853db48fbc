// SentencePiece tokenizers (Debian's libsentencepiece): loading a .model file and training one
// on a corpus.
//
// Training options are chosen so that decode(encode(text)) == text for any UTF-8 text that
// does not contain U+2581 ("▁", SentencePiece's space symbol): no normalisation (identity),
// whitespace kept as written, no dummy prefix, and byte fallback (a character the vocabulary
// lacks becomes its UTF-8 bytes, pieces <0x00>..<0xFF>). Ids: 0 is <unk> (never produced with
// byte fallback), then the 256 byte pieces, then the learnt pieces; no <s>, </s> or <pad>.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace parm::data {

// From the bytes of a .model file; `origin` (a path) names it in messages. Throws
// parm::InvalidConfig when they are not a SentencePiece model.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(std::string model_bytes,
                                                   const std::string& origin);

struct SentencePieceOptions {
  std::string model_type = "bpe";  // "bpe" or "unigram"
  int32_t vocab = 8192;            // pieces, <unk> and the 256 byte pieces included
  int threads = 1;                 // the trainer's threads
};

// Trains a model on `sentences` (documents without their line ends: a piece never spans
// two) and returns the .model file's bytes. Deterministic: the same sentences and options
// give the same bytes. Throws parm::InvalidConfig with SentencePiece's message when it cannot
// (e.g. a vocabulary larger than the text supports), naming the valid model types.
std::string train_sentencepiece(const std::vector<std::string_view>& sentences,
                                const SentencePieceOptions& options);

}  // namespace parm::data
