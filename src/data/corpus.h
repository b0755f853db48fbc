// Training text (its byte-level token ids: data/batch.h).
//
// Sources: "kjv" — the King James Bible from Debian's bible-kjv package (public domain; the
// `bible` command prints it, verse references stripped here), or "file:PATH" — any UTF-8 or
// ASCII text file. The text is split deterministically: the last `val_fraction` of the bytes
// is the validation set, the rest the training set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace parm::data {

struct Corpus {
  std::string name;
  std::vector<uint8_t> train;
  std::vector<uint8_t> val;
};

// Throws parm::InvalidConfig naming the source and how to get it when the data is missing,
// unreadable or too short for `seq_len`.
Corpus load_corpus(const std::string& source, double val_fraction, int64_t seq_len);

}  // namespace parm::data
