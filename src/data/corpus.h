// Training text as token ids, split into a training and a validation part.
//
// Sources: "kjv" — the King James Bible from Debian's bible-kjv package (public domain; the
// `bible` command prints it, verse references stripped here), or "file:PATH" — any UTF-8 or
// ASCII text file. Either is read as byte tokens in memory (load_corpus), or tokenized once
// into a prepared dataset (data/prepared_dataset.h) that open_prepared_corpus maps.
//
// The split is on token positions, the same for every layout: of N tokens the last
// floor(N * val_fraction) are the validation set, the rest the training set.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace parm::data {

// Token ids of 2 or 4 bytes each, held by someone else (a Corpus keeps them alive).
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(const uint8_t* ids, uint32_t width, int64_t count)
      : ids_(ids), width_(width), count_(count) {}
  int64_t size() const { return count_; }
  int32_t operator[](int64_t i) const;
  // Ids [first, first + count) into out[0, count); the range must lie inside.
  void copy_to(int64_t first, int64_t count, int32_t* out) const;
  TokenSpan sub(int64_t first, int64_t count) const;

 private:
  const uint8_t* ids_ = nullptr;
  uint32_t width_ = 2;
  int64_t count_ = 0;
};

struct Corpus {
  std::string name;             // the source ("kjv", "file:PATH") or "prepared:DIR"
  TokenSpan train, val;
  int32_t vocab = 256;          // every id < vocab (the tokenizer's vocabulary)
  nlohmann::json tokenizer;     // the tokenizer's identity (Tokenizer::identity)
  int64_t documents = 0;        // in the whole corpus; 0 where unknown
  std::shared_ptr<const void> storage;  // owns what train and val point into
};

// The text of a source: "kjv" or "file:PATH". Throws parm::InvalidConfig naming the source and
// how to get it when it is missing or unreadable.
std::string read_corpus_text(const std::string& source);
// One document per line, its '\n' included (the last may lack one); empty text: none.
std::vector<std::string_view> split_documents(std::string_view text);

// The split, its one home: c.train and c.val from `all` (the last floor(N * val_fraction) ids
// are the validation set). Throws parm::InvalidConfig naming c.name when val_fraction is
// outside (0, 0.5) or a part is too short for sequences of `seq_len` tokens.
void split_tokens(Corpus& c, const TokenSpan& all, double val_fraction, int64_t seq_len);

// A corpus of `ids` (each < vocab) held in memory, split by `val_fraction`. Throws
// parm::InvalidConfig when a part is too short for sequences of `seq_len` tokens.
Corpus corpus_of_ids(std::string name, const std::vector<int32_t>& ids, int32_t vocab,
                     nlohmann::json tokenizer, double val_fraction, int64_t seq_len);

// The byte tokens of a source, in memory (the byte tokenizer without a prepared dataset).
Corpus load_corpus(const std::string& source, double val_fraction, int64_t seq_len);

}  // namespace parm::data
