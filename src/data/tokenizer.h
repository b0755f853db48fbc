// Tokenizers: text <-> token ids, behind one interface, so that training, dataset preparation
// and generation use whichever tokenizer a config, a prepared dataset or a checkpoint names.
//
// Kinds:
//   "byte"           token = byte value, vocabulary 256 (data/batch.h's kByteVocab)
//   "sentencepiece"  a SentencePiece model (BPE or unigram), loaded from its .model file
//                    (data/sentencepiece_tokenizer.h)
//
// A tokenizer is identified by its record (record()): kind, vocabulary size and, for a model
// file, the FNV-1a 64 checksum of its bytes. Two tokenizers are the same when their
// identities (identity()) are; checkpoints and prepared datasets store the record and refuse
// another tokenizer by comparing it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace parm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte" or "sentencepiece".
  virtual std::string kind() const = 0;
  // Ids are in [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Throws parm::InvalidConfig naming the id when one is outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The bytes of the model file ("" for byte): what a checkpoint keeps beside itself so that
  // it can be decoded without the original file.
  virtual const std::string& model_bytes() const = 0;
  // One line for messages, e.g. "sentencepiece bpe, vocabulary 8192 (fnv1a64 0123...)".
  virtual std::string describe() const = 0;

  // "" for byte, else the FNV-1a 64 of model_bytes() as 16 hex digits.
  std::string checksum() const;
  // {"kind": K, "vocab": V} plus, for a model file, "fnv1a64" and (when `file` is not empty)
  // "file": where the model's bytes were stored, relative to the record's folder.
  nlohmann::json record(const std::string& file = "") const;
  // The record without "file": equal identities <=> the same tokenizer.
  nlohmann::json identity() const;
};

// The byte tokenizer.
std::unique_ptr<Tokenizer> byte_tokenizer();

// `spec` is "byte" or the path of a SentencePiece .model file. Throws parm::InvalidConfig
// naming the file and what is wrong (missing, unreadable, not a SentencePiece model).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// The tokenizer a record names (written by Tokenizer::record with a "file"): the file is read
// relative to `folder` and its checksum checked. `origin` (e.g. "checkpoint ckpt/step-00000100")
// names the holder in messages. Throws parm::InvalidConfig on any mismatch.
std::unique_ptr<Tokenizer> tokenizer_from_record(const nlohmann::json& record,
                                                 const std::string& folder,
                                                 const std::string& origin);

// Throws parm::InvalidConfig "<what_a> uses tokenizer A but <what_b> uses tokenizer B" when
// the identities of two records differ (a record may hold "file"; it is ignored).
void check_same_tokenizer(const nlohmann::json& a, const std::string& what_a,
                          const nlohmann::json& b, const std::string& what_b);

}  // namespace parm::data
