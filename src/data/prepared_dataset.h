// A prepared dataset's folder (the format: data/prepared_format.h): preparing one from a
// corpus and a tokenizer, and opening one for training.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/corpus.h"
#include "data/tokenizer.h"

namespace parm::data {

// A text tokenized document by document (split_documents): the ids in order and where each
// document starts.
struct EncodedText {
  std::vector<int32_t> ids;
  std::vector<uint64_t> doc_starts;  // ascending; doc_starts[0] == 0 when there is a document
  int64_t not_round_trip = 0;        // documents whose decode(encode(doc)) != doc
};
// `check_round_trip`: decode every document again and count those that differ.
EncodedText encode_documents(const Tokenizer& tokenizer, std::string_view text,
                             bool check_round_trip);

// Writes the dataset folder `dir` (absent; written to a temporary folder beside it, then
// renamed). Throws parm::InvalidConfig when `dir` exists.
void write_prepared(const std::string& dir, const Tokenizer& tokenizer,
                    const std::string& corpus_name, const EncodedText& text);

// dataset.json's fields, checked (parse_dataset_json).
struct DatasetHeader {
  std::string corpus;
  nlohmann::json tokenizer;  // a record: kind, vocab, fnv1a64 and file where there is a model
  uint64_t tokens = 0, documents = 0;
  uint32_t width = 0;        // from "dtype"
  std::string tokens_file;
};
// Throws parm::InvalidConfig naming `file` (the dataset.json) and the field.
DatasetHeader parse_dataset_json(const nlohmann::json& j, const std::string& file);
// dataset.json of `dir`, read (at most 1 MiB) and checked.
DatasetHeader read_dataset_header(const std::string& dir);

// Opens `dir`: checks dataset.json, its tokenizer file (checksum) and tokens.bin (every field,
// parse_tokens_file) and that they agree, maps the ids and splits them by `val_fraction`.
// Throws parm::InvalidConfig naming the file and what is wrong.
Corpus open_prepared_corpus(const std::string& dir, double val_fraction, int64_t seq_len);
// The same dataset's tokenizer (from the folder's copy of it).
std::unique_ptr<Tokenizer> prepared_tokenizer(const std::string& dir);

}  // namespace parm::data
