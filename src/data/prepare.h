// The two preparation steps, each from a corpus source ("kjv" or "file:PATH"): training a
// SentencePiece tokenizer (`parm tokenizer train`) and tokenizing a corpus into a prepared
// dataset (`parm prepare-data`); and the cache that does both once for a config that names
// a tokenizer kind and size but no files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"

namespace parm::data {

// Trains on the corpus's documents and writes the .model file to `out` atomically.
std::unique_ptr<Tokenizer> train_tokenizer(const std::string& corpus,
                                           const SentencePieceOptions& options,
                                           const std::string& out);

struct PrepareSummary {
  int64_t text_bytes = 0, tokens = 0, documents = 0;
  int64_t not_round_trip = 0;  // documents whose decode(encode(doc)) != doc
};
// Tokenizes the corpus document by document and writes the dataset folder `out`
// (write_prepared).
PrepareSummary prepare_dataset(const Tokenizer& tokenizer, const std::string& corpus,
                               const std::string& out);

// The cache folder of one (corpus, tokenizer) pair under `root`, named by the corpus text's
// checksum and the tokenizer: `tokenizer` is "bpe" / "unigram" (then `vocab` pieces, trained
// into the folder's tokenizer.model) or the checksum of a given model file. The folder holds
// tokenizer.model (when trained here) and prepared/ (the dataset).
struct CacheEntry {
  std::string folder;
  std::string tokenizer_file;  // folder/tokenizer.model, or the given file
  std::string prepared;        // folder/prepared
};
CacheEntry cache_entry(const std::string& root, const std::string& corpus,
                       const std::string& tokenizer, int32_t vocab,
                       const std::string& tokenizer_file);
// Makes what is missing of `e` (the tokenizer when it is trained here, then the dataset);
// returns a line per thing made ("" when both were there). Concurrent callers are safe (each
// writes to its own temporary name and renames), but only one should be running.
std::string build_cache_entry(const CacheEntry& e, const std::string& corpus,
                              const std::string& kind, int32_t vocab);

}  // namespace parm::data
